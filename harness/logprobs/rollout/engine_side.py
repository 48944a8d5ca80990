"""The rollout side, in the engine's environment (``python -m harness.logprobs.rollout``):
an engine per dtype on the seeded checkpoint samples every prompt with its own seed, and
what it said is saved (``torch.save``: plain tensors and lists)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

import torch

from harness.logprobs import seeded_model
from harness.logprobs.rollout.inputs import STEPS, checkpoint_digest, prompts


def rollout(dtypes: list[str], out: Path, seed: int = 0,
            seed_attention: int | None = None) -> None:
    """Start an engine per dtype on the seeded checkpoint, sample every prompt with its own
    seed, and save what the engine said (``torch.save``: plain tensors and lists), with each
    sampled sequence's layer states (``layer_states.engine_states``). ``seed_attention``: a
    control, that layer's attention output changed inside the engine for the capture."""
    import vllm

    from harness.logprobs.layer_states import SeedAttention, engine_states
    from harness.logprobs.vllm_source import VllmSource

    record: dict[str, Any] = {"pid": os.getpid(), "dtypes": {}}
    for dtype in dtypes:
        vocab = seeded_model.SMALL_LLAMA["vocab_size"]
        source = VllmSource(dtype=dtype, seed=seed, max_logprobs=vocab)
        asked = prompts()
        params = [vllm.SamplingParams(max_tokens=STEPS, min_tokens=STEPS, temperature=1.0,
                                      seed=1000 * (seed + 1) + i, logprobs=vocab,
                                      ignore_eos=True)
                  for i in range(len(asked))]
        outs = source.llm.generate([{"prompt_token_ids": p} for p in asked], params,
                                   use_tqdm=False)
        requests = []
        for prompt, result in zip(asked, outs, strict=True):
            sample = result.outputs[0]
            rows = torch.full((len(sample.token_ids), vocab), float("-inf"))
            for step, entry in enumerate(sample.logprobs):
                for token, logprob in entry.items():
                    rows[step, token] = logprob.logprob
            requests.append({
                "prompt": list(result.prompt_token_ids or prompt),
                "tokens": list(sample.token_ids),
                "logprobs": torch.tensor([entry[t].logprob for t, entry in
                                          zip(sample.token_ids, sample.logprobs, strict=True)],
                                         dtype=torch.float32),
                "rows": rows,
            })
        layers = engine_states(
            source.llm, vllm.SamplingParams, [r["prompt"] + r["tokens"] for r in requests],
            None if seed_attention is None else SeedAttention(seed_attention))
        record["dtypes"][dtype] = {"engine": source.name,
                                   "checkpoint": checkpoint_digest(source.model_dir),
                                   "requests": requests, "layers": layers}
        del source
    torch.save(record, out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.logprobs.rollout")
    parser.add_argument("--dtype", action="append", required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--seed", type=int, default=0,
                        help="the engine's seed, added to every request's (a control: 1)")
    parser.add_argument("--seed-attention", type=int, default=None, metavar="LAYER",
                        help="a control: this layer's attention output changed inside the "
                        "engine while the layer states are captured")
    args = parser.parse_args(argv)
    rollout(args.dtype, args.out, args.seed, args.seed_attention)
    return 0
