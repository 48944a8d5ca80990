"""One logprob bit-equality case, as the suite runs it inside an isolated child.

The switch is set the way users set it (``VLLM_BATCH_INVARIANT``, then the target's init)
before the source is built. Which target: the real one for the session's device where it
can run (vllm_ascend on NPU, vllm on CUDA), else our reference ops (CPU, or pure torch on
any device); the report's source name says which.
"""

from __future__ import annotations

import os
from typing import Any

from harness.invariance import InvarianceTarget, get_target
from harness.logprobs.invariance_check import InvarianceReport, check_batch_invariance

SOURCES = ("tiny", "hf", "hf-left", "vllm", "vllm-dummy", "vllm-nosplit", "vllm-chunked")
_REAL_TARGET = {"npu": "vllm_ascend", "cuda": "vllm"}
#: per source, what the checks run (smaller sweeps for the heavier transformers model, so
#: the whole suite stays within minutes on a 2-core CPU)
SWEEPS: dict[str, dict[str, dict[str, Any]]] = {
    "hf": {"batch-size": {"batch_sizes": (1, 2, 3, 4, 8), "decode_steps": 4},
           "decode-vs-prefill": {"batch_sizes": (1, 2, 4), "decode_steps": 4},
           "repeat": {"batch_size": 4, "decode_steps": 4}},
    # a 64-token probe among 4..40-token fillers: long enough for the CPU attention to
    # split its KV cache in decode (a 24-token probe showed no difference there)
    "vllm": {"batch-size": {"batch_sizes": (1, 2, 4, 8), "decode_steps": 8,
                            "probe_length": 64}},
}


def pick_target(device_kind: str, npu_missing: str | None) -> InvarianceTarget:
    """The real target for this device if it can run here, else the reference."""
    name = _REAL_TARGET.get(device_kind)
    if name:
        target = get_target(name)
        if target.unavailable(device_kind, npu_missing) is None:
            return target
    return get_target("reference")


def build_source(source: str, enabled: bool, dtype: str, tgt: InvarianceTarget,
                 seed: int = 0, engine_kwargs: dict[str, Any] | None = None
                 ) -> tuple[Any, set[str]]:
    """Child side: turn the switch the way users do, build the source on
    ``devices.device()``; also the operators the switch overrode (its invariant set)."""
    import torch

    from harness.stack import devices
    from harness.stack.dispatch import footprint, registrations

    before = registrations()
    if source in ("tiny", "hf", "hf-left"):
        tgt.set_switch(enabled)
        if source == "tiny":
            from harness.logprobs.tiny import TinyDecoder

            src: Any = TinyDecoder(seed=seed, dtype=getattr(torch, dtype),
                                   device=devices.device())
        else:
            from harness.logprobs.hf_source import HfSource

            src = HfSource(seed=seed, dtype=getattr(torch, dtype), device=devices.device(),
                           padding="left" if source == "hf-left" else "right")
    elif source.startswith("vllm"):
        # vLLM reads the variable at engine start-up and runs its own init; its engine core
        # runs in this process (the recorder sees its ops)
        from harness.logprobs import vllm_source

        if source not in vllm_source.VARIANTS:
            raise ValueError(f"unknown logprob source {source!r}: use one of {SOURCES}")
        variant = vllm_source.VARIANTS[source]
        # the switch, the variant's and the engine's variables: what the suite gave the
        # keyed server as this child's (vllm_source.child_env), the one place they are made
        os.environ.update(vllm_source.child_env(source, enabled, devices.device_kind()))
        src = vllm_source.VllmSource(dtype=dtype, seed=seed, weights=variant.weights,
                                     **{**variant.engine, **(engine_kwargs or {})})
    else:
        raise ValueError(f"unknown logprob source {source!r}: use one of {SOURCES}")
    return src, set(footprint(before, registrations()))


def run_logprob_case(source: str, enabled: bool, dtype: str, target: str,
                     check: str = "batch-size", **kwargs: Any) -> InvarianceReport:
    """Child side: switch, source, then one property (``check``); the report names the
    batch-sensitive operators that ran outside the switch's invariant set."""
    from harness.logprobs.invariance_check import batch_sensitive
    from harness.logprobs.properties import check_decode_matches_prefill, check_repeatable
    from harness.logprobs.seeded_model import checkpoint_digest
    from harness.stack.conditions import process_conditions

    tgt = get_target(target)
    engine_kwargs = kwargs.pop("engine_kwargs", None)
    src, invariant_set = build_source(source, enabled, dtype, tgt, kwargs.get("seed", 0),
                                      engine_kwargs)
    run = {"batch-size": check_batch_invariance,
           "decode-vs-prefill": check_decode_matches_prefill,
           "repeat": check_repeatable}[check]
    # a source's variants sweep as it does (hf-left as hf, vllm-nosplit as vllm)
    sweep = SWEEPS.get(source.split("-")[0], {}).get(check, {})
    report: InvarianceReport = run(src, **{**sweep, **kwargs})
    switch = "VLLM_BATCH_INVARIANT (vLLM's own)" if source.startswith("vllm") else tgt.name
    report.source = f"{report.source} [switch {'on' if enabled else 'off'}: {switch}]"
    import torch

    report.threads = torch.get_num_threads()
    folder = getattr(src, "model_dir", None)
    report.conditions = process_conditions(
        **({"weights": checkpoint_digest(folder)} if folder is not None else {}))
    _check_ranks(source, src, report)
    report.outside_invariant_set = {
        op: n for op, n in batch_sensitive(report.failing_pass_ops).items()
        if op not in invariant_set}
    return report


def _check_ranks(source: str, src: Any, report: InvarianceReport) -> None:
    """A tensor-parallel variant proves its ranks ran: as many worker processes as it
    claims, seen while the engine was up; fewer is vacuous, never a pass."""
    from harness.logprobs import vllm_source

    variant = vllm_source.VARIANTS.get(source)
    if variant is None or variant.ranks <= 1:
        return
    seen = getattr(src, "tp_workers", [])
    report.source += f" [{len(seen)} TP workers: {', '.join(seen) or 'none'}]"
    if len(seen) < variant.ranks and not report.vacuous:
        report.vacuous = (f"{source} claims tensor parallel at {variant.ranks} ranks, but "
                          f"{len(seen)} worker process(es) ran ({', '.join(seen) or 'none'})")
