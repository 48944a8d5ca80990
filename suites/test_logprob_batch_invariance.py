"""Cross-batch-size logprob bit-equality: a probe sequence's prompt and decode logprobs at
batch size 1 must equal, bit for bit, its logprobs inside batches of 2..32 at the first,
a middle and the last slot. Switch on: every case equal. Switch off: the inverse control,
which must find a difference where the device is known to be batch-variant (one table of
measurements, ``harness.logprobs.expectations``; "no difference" there fails: the sweep or
the comparison is broken); where it is not known (bf16 on some CPUs), the case says so as
an XFAIL instead of passing or failing silently."""

from __future__ import annotations

import pytest

from harness.invariance import switch_env
from harness.logprobs import vllm_source
from harness.logprobs.cases import pick_target, run_logprob_case
from harness.logprobs.expectations import judge_inverse
from harness.plugin import SESSION_KEY


@pytest.mark.isolation_timeout(600)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("switch", ["on", "off"])
@pytest.mark.parametrize("source", ["tiny", "vllm"])
def test_logprob_batch_invariance(source: str, switch: str, dtype: str, request,
                                  run_on_npu, record_property) -> None:  # type: ignore[no-untyped-def]
    device = request.config.stash[SESSION_KEY].device
    if source == "vllm":
        reason = vllm_source.unavailable(device.kind)
        if reason:
            pytest.skip(f"vLLM logprob source: {reason}")
    enabled = switch == "on"
    target = pick_target(device.kind, device.npu_missing)
    report = run_on_npu(run_logprob_case, source, enabled, dtype, target.name,
                        env=switch_env(enabled)).value
    record_property("logprob_report", report.summary())
    if enabled:
        assert report.equal, "\n" + report.table()
        return
    outcome, why = judge_inverse(report.equal, report.cases, source, device.kind, dtype)
    if outcome == "failed":
        pytest.fail(why, pytrace=False)
    if outcome == "xfailed":
        pytest.xfail(why)
    print(report.table())
