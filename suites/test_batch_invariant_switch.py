"""Batch-invariance switch: on means the invariant ops really run, off means not one
``batch_invariant_ops::`` event and no changed kernel on any operator. 7 checks x
{disabled, enabled} per target, each case in its own isolated child; event counts land in
the report as ``dispatch_events``, the switch's footprint as ``dispatcher_footprint``."""

from __future__ import annotations

import pytest

from harness.invariance import CHECKS, InvarianceTarget, call_forms, on_off, values
from harness.invariance.switch import case_inputs, judge, run_switch_case
from harness.invariance.values import VALUE_OPS
from harness.plugin import SESSION_KEY


@pytest.mark.parametrize("enabled", [False, True], ids=["disabled", "enabled"])
@pytest.mark.parametrize("check", CHECKS)
def test_switch(invariance_target: InvarianceTarget, check: str, enabled: bool,
                run_on_npu, record_property, request) -> None:  # type: ignore[no-untyped-def]
    reason = invariance_target.not_applicable(check)
    if reason:
        pytest.skip(f"{invariance_target.name}/{check}: {reason}")
    inputs = case_inputs(check)
    budget = invariance_target.time_budget(request.config.stash[SESSION_KEY].timeout)
    res = run_on_npu(run_switch_case, invariance_target.name, check, enabled, inputs,
                     env=invariance_target.switch_env(enabled),
                     events=invariance_target.event_patterns(), timeout=budget,
                     preload=invariance_target.child_imports)
    record_property("recorder", res.recorder)
    record_property("switch_evidence", res.value.shown())
    # every operator and dispatch key the switch changed: the target's whole footprint when
    # on, and a failure below when off
    record_property("dispatcher_footprint", res.value.dispatcher_footprint)
    problems = judge(invariance_target, check, enabled, inputs, res.value, res.events)
    release = invariance_target.release()
    if problems and release != invariance_target.name:
        # the released code did this, under checks our reference target passes
        record_property("release_finding", release)
    assert not problems, (f"{release} {check} with the switch "
                          f"{'on' if enabled else 'off'}:\n- " + "\n- ".join(problems)
                          + f"\nevents counted: {res.events}")


def _applicable(target: InvarianceTarget, case: str, what: str,
                request: pytest.FixtureRequest) -> float:
    """Skip (naming why) where ``case`` does not apply to ``target``; else its child budget."""
    reason = values.applies(target, case)
    if reason:
        pytest.skip(f"{target.name}/{case}: {reason}")
    if target.name == "verl":
        pytest.skip(f"verl/{what}: verl's switch runs vllm-ascend's init, whose {what} the "
                    "vllm_ascend target's cases check (each verl case starts Ray)")
    return target.time_budget(request.config.stash[SESSION_KEY].timeout)


@pytest.mark.parametrize("case", list(VALUE_OPS))
def test_switch_values(invariance_target: InvarianceTarget, case: str, run_on_npu,
                       record_property, request) -> None:  # type: ignore[no-untyped-def]
    """With the switch on, each override gives a row the same bits alone and inside batches
    of 2, 7 and 32 rows at any position, on seeded random floats (fp32, bf16), where a
    reduction split by batch size shows (the op checks' small integers are exact)."""
    budget = _applicable(invariance_target, case, "value cases", request)
    cases = {dtype: values.inputs(case, dtype) for dtype in values.DTYPES}
    res = run_on_npu(values.run_value_case, invariance_target.name, case, cases,
                     env=invariance_target.switch_env(True), timeout=budget,
                     preload=invariance_target.child_imports)
    record_property("value_differences", res.value["differs"])
    problems = values.judge(invariance_target, case, res.value)
    release = invariance_target.release()
    if problems and release != invariance_target.name:
        record_property("release_finding", release)
    assert not problems, "\n- ".join(["", *problems]).lstrip("\n")


@pytest.mark.parametrize("case", list(VALUE_OPS))
def test_switch_call_forms(invariance_target: InvarianceTarget, case: str, run_on_npu,
                           record_property, request) -> None:  # type: ignore[no-untyped-def]
    """Every form users write of an overridden op (no dim, dim=0, dim=-1, a dim tuple,
    keepdim, dtype=, method and function, out=) gives with the switch on what it gives off,
    and raises only where off raises (the stand-in enforces the kernels' constraints)."""
    budget = _applicable(invariance_target, case, "call forms", request)
    given = call_forms.inputs()
    got = {enabled: run_on_npu(call_forms.run_forms, invariance_target.name, case, enabled,
                               given, env=invariance_target.switch_env(enabled),
                               timeout=budget, preload=invariance_target.child_imports).value
           for enabled in (False, True)}
    problems = call_forms.judge(invariance_target, case, got[False], got[True])
    release = invariance_target.release()
    if problems and release != invariance_target.name:
        record_property("release_finding", release)
    assert not problems, "\n- ".join(["", *problems]).lstrip("\n")


def test_switch_on_then_off(invariance_target: InvarianceTarget, run_on_npu,
                            record_property, request) -> None:  # type: ignore[no-untyped-def]
    """On, then the release's own off, in one process: every kernel the switch overrode and
    every function it declares it rebinds must be what it was before."""
    target = invariance_target
    if target.in_process_off is None:
        pytest.skip(f"{target.name}: {target.release()} has no in-process off")
    budget = target.time_budget(request.config.stash[SESSION_KEY].timeout)
    res = run_on_npu(on_off.run_on_then_off, target.name, env=target.switch_env(False),
                     timeout=budget, preload=target.child_imports)
    record_property("left_patched", {"kernels": res.value["left_footprint"],
                                     "functions": res.value["left_rebound"]})
    problems = on_off.judge(target, res.value)
    if problems and target.release() != target.name:
        record_property("release_finding", target.release())
    assert not problems, (f"{target.release()} on, then {target.in_process_off}:\n- "
                          + "\n- ".join(problems))
