"""The seven batch-invariance switch checks, run inside an isolated child.

Split so that the child runs nothing but the op under test (the dispatch events counted
around it are then the op's alone): the parent makes small-integer inputs (``arange % 7 - 3``,
bf16) and the fp32 CPU expectations; the child (``run_switch_case``) sets the switch the way
users do, runs the op once and returns outputs and identity facts; the parent (``judge``)
compares values exactly (rtol=0, atol=0; add_rms_norm's output with 1e-2, its residual
exactly) and the counted events against the target's ``expectations``. The child also
compares the dispatcher's kernel tables before and after the switch: with the switch off,
any operator whose kernel changed fails the case (not only the ops the checks run); with it
on, the changes are the target's footprint, shown in the report.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from harness.invariance import SWITCH_ENV, InvarianceTarget, declared, get_target
from harness.stack.dispatch import footprint, registrations

EPS = 1e-6
#: what each op check's call dispatches (for the failure message)
CALLS = {
    "mm": "torch.mm(a, b) dispatches aten::mm",
    "matmul": "torch.matmul(a, b) dispatches aten::matmul",
    "torch_sum": "torch.sum(x, dim=-1) dispatches aten::sum.dim_IntList unless torch.sum "
                 "itself is replaced",
    "tensor_sum": "x.sum(-1) dispatches aten::sum.dim_IntList (x.sum() is aten::sum)",
}
#: add_rms_norm output tolerance (the existing Ascend switch test's, verl 2026-09; the
#: residual is compared exactly)
RMS_TOLERANCE = 1e-2


def small_ints(*shape: int, dtype: Any = None) -> Any:
    """Values in -3..3: every product and sum below stays exact in bf16 and fp32."""
    import torch

    n = 1
    for s in shape:
        n *= s
    return (torch.arange(n) % 7 - 3).reshape(shape).to(dtype or torch.bfloat16)


def case_inputs(check: str) -> dict[str, Any]:
    """CPU inputs for ``check`` (made in the parent, so the child runs nothing but the op)."""
    if check == "mm":
        return {"a": small_ints(8, 16), "b": small_ints(16, 12)}
    if check == "matmul":
        return {"a": small_ints(2, 4, 16), "b": small_ints(16, 12)}
    if check in ("torch_sum", "tensor_sum"):
        return {"x": small_ints(4, 32)}
    if check == "add_rms_norm":
        return {"x": small_ints(4, 32), "residual": small_ints(4, 32).flip(-1),
                "weight": small_ints(32) + 4}
    return {}


def expected_outputs(check: str, inputs: dict[str, Any]) -> dict[str, Any]:
    """The fp32 CPU reference for ``check``: computed in the parent, never under a switch."""
    import torch

    f = {k: v.float() for k, v in inputs.items()}
    if check == "mm":
        return {"out": torch.mm(f["a"], f["b"])}
    if check == "matmul":
        return {"out": torch.matmul(f["a"], f["b"])}
    if check in ("torch_sum", "tensor_sum"):
        return {"out": f["x"].sum(-1)}
    if check == "add_rms_norm":
        added = f["x"] + f["residual"]
        out = added * torch.rsqrt(added.pow(2).mean(-1, keepdim=True) + EPS) * f["weight"]
        return {"out": out, "residual_out": added}
    return {}


def _host(t: Any) -> Any:
    return None if t is None else t.float().cpu()


@dataclass
class SwitchObservation:
    """What the child saw in one switch case; the parent's ``judge`` reads only this.

    Each check fills its own fields (None where a check does not look): ``outputs`` (the
    op's results on the host, by name: ``out``, ``residual_out``), ``torch_sum_replaced``,
    ``rstd_is_none``, ``rebound`` and ``bound``."""

    #: VLLM_BATCH_INVARIANT in the child after the switch was set
    switch_env: str | None
    #: the target's own "is it on" (its library object, its flag)
    enabled_by_identity: bool
    #: operator -> the dispatch keys whose kernel the switch changed
    dispatcher_footprint: dict[str, list[str]] = field(default_factory=dict)
    #: what the declared overrides (``declared.toml``) read in the child (None: not read)
    declared_state: dict[str, Any] | None = None
    #: the warnings the switch logged
    switch_log: list[str] = field(default_factory=list)
    #: the target's own facts (``InvarianceTarget.evidence``), for its ``judge_evidence``
    evidence: dict[str, Any] = field(default_factory=dict)
    outputs: dict[str, Any] = field(default_factory=dict)
    torch_sum_replaced: bool | None = None
    rstd_is_none: bool | None = None
    rebound: bool | None = None
    bound: str | None = None

    def shown(self) -> dict[str, Any]:
        """The observation without its tensors or the footprint (a property of its own), for
        the test's ``switch_evidence`` property."""
        seen = {k: v for k, v in vars(self).items()
                if k not in ("outputs", "dispatcher_footprint", "evidence") and v is not None}
        return {**seen, **self.evidence}


def run_switch_case(target: str | InvarianceTarget, check: str, enabled: bool,
                    inputs: dict[str, Any]) -> SwitchObservation:
    """Child side of one case: set the switch, run the op once, report what happened."""
    import torch

    tgt = get_target(target) if isinstance(target, str) else target
    dev = tgt.device()
    args = {k: v.to(dev) for k, v in inputs.items()}
    tgt.load()
    before = registrations()
    with _warnings_logged(tgt.loggers) as logged:
        tgt.set_switch(enabled)
    seen = SwitchObservation(
        switch_env=os.environ.get(SWITCH_ENV), enabled_by_identity=tgt.is_enabled(),
        dispatcher_footprint=footprint(before, registrations()),
        declared_state=declared.read(tgt.declared(), tgt.config_object()),
        switch_log=logged, evidence=tgt.evidence())
    if check == "mm":
        seen.outputs["out"] = _host(torch.mm(args["a"], args["b"]))
    elif check == "matmul":
        seen.outputs["out"] = _host(torch.matmul(args["a"], args["b"]))
    elif check == "torch_sum":
        seen.torch_sum_replaced = torch.sum is tgt.reduce_sum()
        seen.outputs["out"] = _host(torch.sum(args["x"], dim=-1))
    elif check == "tensor_sum":
        seen.outputs["out"] = _host(args["x"].sum(-1))
    elif check == "add_rms_norm":
        out, rstd, residual_out = tgt.add_rms_norm()(args["x"], args["residual"],
                                                     args["weight"], EPS)
        seen.outputs.update(out=_host(out), residual_out=_host(residual_out))
        seen.rstd_is_none = rstd is None
    elif check == "fused_infer_attention_score":
        bound, invariant = tgt.attention_binding()
        seen.rebound = any(bound is obj for obj in invariant)
        seen.bound = repr(bound)
    return seen


@contextlib.contextmanager
def _warnings_logged(names: tuple[str, ...]) -> Iterator[list[str]]:
    """The warnings (and worse) the switch logs, on the root logger and on the stack's own
    loggers (vLLM's does not propagate): a switch that declines says why only there."""
    import logging

    lines: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(f"{record.levelname} {record.name}: {record.getMessage()}")

    handler = Keep(logging.WARNING)
    loggers = [logging.getLogger(), *(logging.getLogger(n) for n in names)]
    for logger in loggers:
        logger.addHandler(handler)
    try:
        yield lines
    finally:
        for logger in loggers:
            logger.removeHandler(handler)


#: where a runner's ops package is checked (a switch that installs nothing points there)
OPS_PACKAGE_CHECK = ("suites/test_stack_preflight.py::"
                     "test_the_ops_package_registers_every_op_vllm_ascend_uses "
                     "(and --harness-require batch_invariant_ops)")


def _described(changed: dict[str, list[str]]) -> str:
    """A dispatcher footprint as text: ``aten::mm (CPU), aten::sum (PrivateUse1)``."""
    return ", ".join(f"{op} ({', '.join(keys)})" for op, keys in changed.items())


def judge(target: InvarianceTarget, check: str, enabled: bool, inputs: dict[str, Any],
          got: SwitchObservation, events: dict[str, int]) -> list[str]:
    """Parent side: every way the case went wrong, as sentences (empty: it passed)."""
    import torch

    on = "on" if enabled else "off"
    want_env = "1" if enabled else "0"
    problems = []
    if enabled and not got.dispatcher_footprint and not got.enabled_by_identity:
        said = "; ".join(got.switch_log) or "nothing"
        asked = f"{target.switch_variable}=1" if target.switch_variable else "the switch"
        problems.append(
            f"{asked} asked {target.release()} to switch on, and it installed nothing "
            f"(no kernel changed, off by identity); its log said: {said}. A runner without "
            f"the ops package does this: see {OPS_PACKAGE_CHECK}")
    for expect in target.expectations(check, enabled):
        problem = expect.check(events)
        if problem and expect.ran and check in CALLS:
            # an op that did not run: say which call it was and what the switch did register
            problem += (f": {CALLS[check]}, and {target.release()}'s switch changed only "
                        f"{_described(got.dispatcher_footprint) or 'nothing'} on the "
                        "dispatcher")
        if problem:
            problems.append(problem)
    problems.extend(target.judge_evidence(got.evidence, enabled))
    if got.declared_state is not None:
        problems.extend(declared.judge(
            target.declared(), target.release(), enabled, got.declared_state,
            got.dispatcher_footprint if check == "switch" else None))
    # unset is off (vLLM's default): verl leaves it unset in its driver when off
    if target.switch_variable and got.switch_env != want_env \
            and (enabled or got.switch_env is not None):
        problems.append(f"{SWITCH_ENV}={got.switch_env!r} in the child, expected {want_env!r}")
    if not enabled and got.dispatcher_footprint:
        problems.append(f"with the switch off, {target.name} changed the dispatcher: "
                        f"{_described(got.dispatcher_footprint)}")
    if got.enabled_by_identity is not enabled:
        problems.append(f"{target.name} is {'off' if enabled else 'on'} by identity although "
                        + (f"{target.switch_variable}={want_env}" if target.switch_variable
                           else f"the switch is {on}"))
    if check == "torch_sum" and got.torch_sum_replaced is not enabled:
        problems.append(f"torch.sum is {'' if got.torch_sum_replaced else 'not '}the "
                        f"batch-invariant reduce_sum with the switch {on}")
    if check == "fused_infer_attention_score" and got.rebound is not enabled:
        problems.append(f"fused_infer_attention_score is {'' if got.rebound else 'not '}"
                        f"bound to the batch-invariant op with the switch {on} ({got.bound})")
    if check == "add_rms_norm" and enabled and not got.rstd_is_none:
        problems.append("add_rms_norm returned an rstd with the switch on: the fused kernel "
                        "ran instead of add + rms_norm")
    expected = expected_outputs(check, inputs)
    for name, want in expected.items():
        have = got.outputs[name]
        if check == "add_rms_norm" and name == "out":
            if not torch.allclose(have, want, rtol=RMS_TOLERANCE, atol=RMS_TOLERANCE):
                diff = (have - want).abs().max().item()
                problems.append(f"add_rms_norm output off by {diff} (tolerance {RMS_TOLERANCE})")
        elif not torch.equal(have, want):
            diff = (have - want).abs().max().item()
            problems.append(f"{check} {name} differs from the fp32 CPU reference (max abs diff "
                            f"{diff}); rtol=0, atol=0 required")
    return problems
