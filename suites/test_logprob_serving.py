"""Logprob bit-equality under serving load, on the engine source (vLLM on CPU, CUDA or NPU,
one code path: ``harness.logprobs.serving``). Each case starts its own engine in its own
isolated process and lets the engine's scheduler decide:

- ``concurrent``: the probe served alone vs while eight other requests (mixed lengths,
  ``max_tokens``, sampling, logprobs) arrive over 12 steps: it joins a batch mid-decode,
  others join and leave during its decode;
- ``repeat-under-load``: the same load three times, the same bits for the probe;
- ``prefix-cache``: the probe with its 128-token prefix cached by an earlier request vs
  computed cold, and its prompt logprobs after that request vs first and in either order
  within one step;
- ``preemption``: the probe preempted (a 4-block KV cache) and recomputed vs not;
- ``lora-mix``: the probe on a seeded LoRA adapter alone vs beside requests for the base
  model and two adapters;
- ``prompt-cache-read``: the probe's prompt logprobs with its prefix read from the cache
  (``skip_reading_prefix_cache=False``) vs computed cold; whatever the switch, an entry of a
  cached position must name the prompt's own token;
- ``test_logprob_serving_http``: the concurrent case through ``vllm serve`` and 12
  concurrent HTTP clients.

Each case proves its condition from the scheduler (co-resident requests, joins and leaves,
cached tokens, preemptions), else it fails as vacuous, never passes. Switch off: the
inverse control (a difference passes: the comparison can see one; none is an XFAIL that
says so); a difference is judged against its row's envelope (``expectations.toml``: the
"drift grew" failure); switch on: the property must hold; repeat-under-load must hold
either way."""

from __future__ import annotations

import pytest

from harness.logprobs import serving, vllm_source
from harness.logprobs.expectations import judge_drift
from harness.plugin import SESSION_KEY
from harness.plugin.verdicts import file_as


@pytest.mark.isolation_timeout(600)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("switch", ["on", "off"])
@pytest.mark.parametrize("prop", serving.PROPERTIES)
def test_logprob_serving(prop: str, switch: str, dtype: str, request, run_on_npu,
                         record_property) -> None:  # type: ignore[no-untyped-def]
    device = request.config.stash[SESSION_KEY].device
    reason = vllm_source.unavailable(device.kind)
    if reason:
        pytest.skip(f"serving cases (vLLM engine): {reason}")
    enabled = switch == "on"
    # vLLM imported before the fork, by a server in the child's own variables
    report = run_on_npu(serving.run_serving_case, prop, enabled, dtype,
                        env=vllm_source.child_env("vllm", enabled, device.kind),
                        preload=vllm_source.CHILD_IMPORTS).value
    # the logprob family's property: the report shows these rows beside the batch-size ones
    record_property("logprob_report", report.summary())
    if report.vacuous:  # the condition the property claims did not happen: never a pass
        file_as(record_property, "vacuous", f"vacuous: {prop}: {report.vacuous}")
        pytest.fail(f"{prop}: {report.vacuous}\n{report.table()}", pytrace=False)
    if report.wrong:  # wrong whatever the switch: no size to judge
        pytest.fail(f"{prop}: wrong whatever the switch:\n"
                    + "".join(f"- {line}\n" for line in report.wrong) + report.table(),
                    pytrace=False)
    outcome, why, drift = judge_drift(prop, report.equal, report.cases, "vllm", device.kind,
                                      dtype, enabled, first_op=report.first_divergent_op,
                                      figures=report.figures())
    record_property("drift", [drift])
    if outcome == "failed":
        pytest.fail(f"{why}\n{report.table()}", pytrace=False)
    if outcome == "xfailed":
        pytest.xfail(f"{why}; {report.condition}")
    print(report.table())


@pytest.mark.isolation_timeout(600)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("switch", ["on", "off"])
def test_logprob_serving_http(switch: str, dtype: str, request, run_on_npu,
                              record_property) -> None:  # type: ignore[no-untyped-def]
    """The concurrent case through ``vllm serve`` with concurrent HTTP clients
    (``harness.logprobs.serving.over_http``): the probe alone vs while 12 clients send mixed
    requests; the server's running-requests gauge must show the probe and 3 others, else
    vacuous. No first divergent op (the engine is in the server's process)."""
    from harness.logprobs.serving import over_http

    device = request.config.stash[SESSION_KEY].device
    reason = vllm_source.unavailable(device.kind)
    if reason:
        pytest.skip(f"serving cases (vLLM server): {reason}")
    enabled = switch == "on"
    report = run_on_npu(over_http.run_http_case, enabled, dtype,
                        env={"VLLM_BATCH_INVARIANT": None}).value
    record_property("logprob_report", report.summary())
    if report.vacuous:
        file_as(record_property, "vacuous", f"vacuous: {report.prop}: {report.vacuous}")
        pytest.fail(f"{report.prop}: {report.vacuous}\n{report.table()}", pytrace=False)
    outcome, why, drift = judge_drift("serving-http", report.equal, report.cases, "vllm",
                                      device.kind, dtype, enabled, figures=report.figures())
    record_property("drift", [drift])
    if outcome == "failed":
        pytest.fail(f"{why}\n{report.table()}", pytrace=False)
    if outcome == "xfailed":
        pytest.xfail(f"{why}; {report.condition}")
    print(report.table())
