"""RL consistency, the training side: the per-token logprobs a trainer computes for the same
sequences must not depend on its micro-batch size (1, 2, 4, 8) nor on its layout (right or
left padding, or packed without padding: verl's remove-padding layout), and two passes with
different micro-batch sizes must agree (``old_log_prob`` vs ``log_prob``, verl #6280).

The model is transformers' Llama loaded from the seeded checkpoint the engine loads, the
logprob function verl 0.9.1's own (``verl.utils.torch_functional.logprobs_from_logits``).
Switch on: the property holds, or the expectation table names the known gap (an XFAIL that
fails when it closes); switch off: the inverse control. A layout that let the sequences of a
micro-batch see each other is "not comparable", never a pass or a finding. Each case names
the first divergent op where the passes line up, else what moved it (the padding width)."""

from __future__ import annotations

import pytest

from harness.logprobs import hf_source
from harness.logprobs.cases import pick_target
from harness.logprobs.expectations import judge
from harness.logprobs.training import LAYOUTS, run_training_case
from harness.plugin import SESSION_KEY


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("switch", ["on", "off"])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_training_micro_batch_invariance(layout: str, switch: str, dtype: str, request,
                                         run_on_npu, record_property) -> None:  # type: ignore[no-untyped-def]
    reason = hf_source.unavailable()
    if reason:
        pytest.skip(f"training forward: {reason}")
    device = request.config.stash[SESSION_KEY].device
    enabled = switch == "on"
    target = pick_target(device.kind, device.npu_missing)
    report = run_on_npu(run_training_case, layout, enabled, dtype, target.name,
                        env=target.switch_env(enabled)).value
    record_property("logprob_report", report.summary())
    if report.vacuous:  # another computation than the one claimed: never a pass
        pytest.fail(f"{layout}: {report.vacuous}\n{report.table()}", pytrace=False)
    outcome, why = judge("micro-batch", report.equal, report.cases, f"training-{layout}",
                         device.kind, dtype, enabled, threads=report.threads,
                         first_op=report.first_divergent_op)
    where = (report.first_divergence or {}).get("sentence", "")
    if outcome == "failed":
        pytest.fail(f"{why}\n{report.table()}\n{where}", pytrace=False)
    if outcome == "xfailed":
        pytest.xfail(f"{why}; {where}" if where else why)
    print(report.table())
