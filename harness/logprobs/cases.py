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
from harness.logprobs.engine import InvarianceReport, check_batch_invariance

SOURCES = ("tiny", "vllm")
_REAL_TARGET = {"npu": "vllm_ascend", "cuda": "vllm"}


def pick_target(device_kind: str, npu_missing: str | None) -> InvarianceTarget:
    """The real target for this device if it can run here, else the reference."""
    name = _REAL_TARGET.get(device_kind)
    if name:
        target = get_target(name)
        if target.unavailable(device_kind, npu_missing) is None:
            return target
    return get_target("reference")


def run_logprob_case(source: str, enabled: bool, dtype: str, target: str,
                     **check: Any) -> InvarianceReport:
    """Child side: switch, build the source on ``harness.device()``, run the check."""
    import torch

    import harness

    tgt = get_target(target)
    if source == "tiny":
        tgt.set_switch(enabled)
        from harness.logprobs.tiny import TinyDecoder

        src: Any = TinyDecoder(seed=check.get("seed", 0), dtype=getattr(torch, dtype),
                               device=harness.device())
    elif source == "vllm":
        # vLLM reads the variable at engine start-up and runs its own init
        os.environ["VLLM_BATCH_INVARIANT"] = "1" if enabled else "0"
        from harness.logprobs.vllm_source import VllmSource

        src = VllmSource(dtype=dtype, seed=check.get("seed", 0))
    else:
        raise ValueError(f"unknown logprob source {source!r}: use one of {SOURCES}")
    report = check_batch_invariance(src, **check)
    report.source = f"{report.source} [switch {'on' if enabled else 'off'}: {tgt.name}]"
    return report
