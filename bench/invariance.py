"""Tokens per second of the logprob sources with the reference switch on vs off.

    python bench/invariance.py [--source tiny|hf|all] [--dtype float32|bfloat16|all]
                               [--rounds 3]

Sources: TinyDecoder (``tiny``) and the transformers Llama (``hf``, right-padded prefill,
KV-cache decode).
The switch cannot be turned off inside a process, so each measurement runs in its own
isolated child; children with the switch off and on alternate, round after round, so drift
hits both alike. Prints median prefill and decode tokens/s for each, and the on/off time
ratio (target: at most 1.5x).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from harness.isolation.run import get_launcher, isolate  # noqa: E402

BATCH, PROMPT, STEPS, REPEATS = 16, 64, 32, 3


def measure(on: bool, dtype: str, source: str = "tiny") -> dict[str, float]:
    import os
    import time

    import torch

    os.environ["VLLM_BATCH_INVARIANT"] = "1" if on else "0"
    from harness.invariance import reference
    from harness.logprobs import TinyDecoder
    from harness.logprobs.invariance_check import make_sequences

    reference.init_batch_invariance()
    model: Any
    if source == "hf":
        from harness.logprobs.hf_source import HfSource

        model = HfSource(dtype=getattr(torch, dtype))
    else:
        model = TinyDecoder(dtype=getattr(torch, dtype))
    batch = make_sequences(0, model.config.vocab, BATCH, min_len=PROMPT, max_len=PROMPT)
    model.prefill(batch)  # warm-up
    prefill, decode = [], []
    for _ in range(REPEATS):
        t = time.perf_counter()
        model.prefill(batch)
        prefill.append(time.perf_counter() - t)
        t = time.perf_counter()
        model.decode(batch, STEPS)
        decode.append(time.perf_counter() - t - prefill[-1])  # decode re-runs the prefill
    return {"prefill_s": statistics.median(prefill), "decode_s": statistics.median(decode)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", default="all", choices=("tiny", "hf", "all"))
    parser.add_argument("--dtype", default="all", choices=("float32", "bfloat16", "all"))
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    launcher = get_launcher("forkserver")
    sources = ("tiny", "hf") if args.source == "all" else (args.source,)
    dtypes = ("float32", "bfloat16") if args.dtype == "all" else (args.dtype,)
    print(f"batch {BATCH} x {PROMPT} prompt tokens, {STEPS} decode steps, {args.rounds} "
          f"rounds x {REPEATS} repeats (medians); switch off and on alternate in children")
    for source in sources:
        for dtype in dtypes:
            runs: dict[bool, list[dict[str, float]]] = {False: [], True: []}
            for _ in range(args.rounds):
                for on in (False, True):
                    runs[on].append(isolate(measure, (on, dtype, source), launcher=launcher,
                                            timeout=900).raise_for_outcome().value)
            med = {on: {k: statistics.median(r[k] for r in rs) for k in ("prefill_s",
                                                                           "decode_s")}
                   for on, rs in runs.items()}
            for phase, tokens in (("prefill", BATCH * PROMPT), ("decode", BATCH * STEPS)):
                off_s, on_s = med[False][f"{phase}_s"], med[True][f"{phase}_s"]
                print(f"{source:>4} {dtype:>8} {phase:>7}: off {tokens / off_s:9.0f} tok/s   "
                      f"on {tokens / on_s:9.0f} tok/s   on/off time ratio {on_s / off_s:.2f}x")


if __name__ == "__main__":
    main()
