"""A ``LogprobSource`` backed by a real vLLM engine (vllm-ascend on NPU, vLLM on CUDA).

A small Llama config is written to a temporary directory and loaded with
``load_format="dummy"`` (random weights, no download) and ``skip_tokenizer_init=True``;
prompts are token-id lists; prompt logprobs (prefill) and sample logprobs (greedy decode)
are requested and the chosen tokens' values returned as fp32 tensors. Tested in CI against
a fake engine class; skipped, naming the missing piece, where vLLM cannot run.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from harness.invariance import has_module

#: a Llama about the size of TinyDecoder
SMALL_LLAMA: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256,
    "intermediate_size": 688, "num_attention_heads": 8, "num_key_value_heads": 2,
    "num_hidden_layers": 4, "vocab_size": 1024, "max_position_embeddings": 512,
    "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "tie_word_embeddings": False,
    "bos_token_id": 1, "eos_token_id": 2,
}


def unavailable(device_kind: str) -> str | None:
    """Why a vLLM source cannot run in this session, or None."""
    if not has_module("vllm"):
        return "vllm is not installed"
    if device_kind == "npu" and not has_module("vllm_ascend"):
        return "vllm_ascend is not installed (needed for vLLM on NPU)"
    if device_kind not in ("npu", "cuda"):
        return f"vLLM needs an NPU or a CUDA device; the session device is {device_kind}"
    return None


class VllmSource:
    """``prefill`` / ``decode`` through ``vllm.LLM`` (or an injected engine class)."""

    def __init__(self, *, dtype: str = "float32", seed: int = 0,
                 config: dict[str, Any] | None = None,
                 llm_factory: Callable[..., Any] | None = None,
                 sampling_params_cls: Callable[..., Any] | None = None,
                 **engine_kwargs: Any) -> None:
        if llm_factory is None or sampling_params_cls is None:
            import vllm

            llm_factory = llm_factory or vllm.LLM
            sampling_params_cls = sampling_params_cls or vllm.SamplingParams
        self._params = sampling_params_cls
        self._dir = tempfile.TemporaryDirectory(prefix="npu-regress-model-")
        self.config = dict(SMALL_LLAMA, **(config or {}), torch_dtype=dtype)
        (Path(self._dir.name) / "config.json").write_text(json.dumps(self.config, indent=1))
        self.name = f"vllm({dtype}, dummy {self.config['num_hidden_layers']}-layer llama)"
        kwargs = {"model": self._dir.name, "load_format": "dummy", "skip_tokenizer_init": True,
                  "dtype": dtype, "seed": seed, "enforce_eager": True,
                  "max_model_len": self.config["max_position_embeddings"],
                  "max_num_seqs": 64, **engine_kwargs}
        self.llm = llm_factory(**kwargs)

    def _generate(self, batch: list[list[int]], params: Any) -> list[Any]:
        prompts = [{"prompt_token_ids": list(seq)} for seq in batch]
        return list(self.llm.generate(prompts, params, use_tqdm=False))

    def prefill(self, batch: list[list[int]]) -> list[torch.Tensor]:
        params = self._params(max_tokens=1, temperature=0.0, prompt_logprobs=0)
        outs = self._generate(batch, params)
        result = []
        for seq, out in zip(batch, outs, strict=True):
            entries = out.prompt_logprobs[1:]  # the first prompt token has no logprob
            result.append(torch.tensor([entry[tok].logprob for tok, entry in
                                        zip(seq[1:], entries, strict=True)],
                                       dtype=torch.float32))
        return result

    def generate(self, batch: list[list[int]], steps: int
                 ) -> list[tuple[list[int], torch.Tensor]]:
        params = self._params(max_tokens=steps, min_tokens=steps, temperature=0.0, logprobs=0,
                              ignore_eos=True)
        outs = self._generate(batch, params)
        result = []
        for out in outs:
            sample = out.outputs[0]
            result.append((list(sample.token_ids),
                           torch.tensor([entry[tok].logprob for tok, entry in
                                         zip(sample.token_ids, sample.logprobs, strict=True)],
                                        dtype=torch.float32)))
        return result

    def decode(self, batch: list[list[int]], steps: int) -> list[torch.Tensor]:
        return [lp for _, lp in self.generate(batch, steps)]
