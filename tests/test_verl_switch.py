"""The verl target against the released code (the upstream set): verl 0.9.1's own
``run_ppo`` turns the rollout option ``full_determinism`` into VLLM_BATCH_INVARIANT (for its
driver and, through the Ray runtime env, its workers), then vllm-ascend 0.23.0.post1 runs
on the CPU-backed NPU stand-in. Each case here starts a local Ray: about 10 s."""

from __future__ import annotations

from typing import Any

import pytest

from harness import run_isolated
from harness.invariance.adapters import VerlTarget
from harness.invariance.switch import case_inputs, judge, run_switch_case
from harness.stack.upstream import UpstreamApiMoved

#: what vllm-ascend 0.23.0.post1 registers on the NPU key when verl turns the switch on
VLLM_ASCEND_FOOTPRINT = {"aten::matmul": ["PrivateUse1"], "aten::mm": ["PrivateUse1"],
                         "aten::sum": ["PrivateUse1"]}


def _needs_verl() -> None:
    reason = VerlTarget().unavailable("cpu", None)
    if reason:
        pytest.skip(f"{reason} (bash ci/setup.sh --upstream installs verl and vllm-ascend)")


def _switch_case(child: Any, target: VerlTarget, enabled: bool) -> tuple[dict, list[str]]:  # type: ignore[type-arg]
    inputs = case_inputs("switch")
    res = run_isolated(child, target, "switch", enabled, inputs, method="forkserver",
                       env=target.switch_env(enabled), events=target.event_patterns(),
                       timeout=240)
    return res.value, judge(target, "switch", enabled, inputs, res.value, res.events)


@pytest.mark.parametrize("enabled", [False, True], ids=["off", "on"])
def test_real_verl_turns_the_switch(enabled: bool) -> None:
    """full_determinism false leaves every invariant op unregistered; true registers
    vllm-ascend's; the Ray actor verl starts sees the matching variable either way."""
    _needs_verl()
    got, problems = _switch_case(run_switch_case, VerlTarget(), enabled)
    assert problems == []
    assert got.dispatcher_footprint == (VLLM_ASCEND_FOOTPRINT if enabled else {})
    assert got.enabled_by_identity is enabled
    assert got.evidence["ray_worker_env"]["VLLM_BATCH_INVARIANT"] == ("1" if enabled else "0")
    assert got.switch_env == ("1" if enabled else None)  # verl sets it only when on


def _verl_ignores_false(*args: Any) -> dict:  # type: ignore[type-arg]
    """Negative control: a verl whose run_ppo turns determinism on whatever the option says."""
    import verl.trainer.main_ppo as main_ppo

    real = main_ppo.run_ppo

    def run_ppo(config: Any, runner: Any) -> None:
        config.actor_rollout_ref.rollout.full_determinism = True
        real(config, runner)

    main_ppo.run_ppo = run_ppo
    return run_switch_case(*args)


def test_a_verl_that_ignores_full_determinism_false_fails_the_off_case() -> None:
    _needs_verl()
    got, problems = _switch_case(_verl_ignores_false, VerlTarget(), False)
    release = VerlTarget().release()
    assert problems == [
        "a Ray actor started by verl's run_ppo saw VLLM_BATCH_INVARIANT='1' with "
        "full_determinism=False, expected '0'",
        # what vllm-ascend's "on" declares it sets, all set with verl's switch off
        *(f"with the switch off, {release} set {what}; declared for 'on' at "
          f"vllm_ascend/batch_invariant.py:{line} override_envs_for_invariance(){more}"
          for what, line, more in (
              ("HCCL_DETERMINISTIC=strict", 83, ""), ("LCCL_DETERMINISTIC=1", 84, ""),
              ("torch.use_deterministic_algorithms(True, warn_only=True)", 88,
               " (vllm-ascend PR #11818: A5 ops not deterministic by default)"),
              ("config.weight_nz_mode=0", 80, ""),
              ("config.enable_matmul_allreduce=False", 81, ""))),
        "VLLM_BATCH_INVARIANT='1' in the child, expected '0'",
        "with the switch off, verl changed the dispatcher: aten::matmul (PrivateUse1), "
        "aten::mm (PrivateUse1), aten::sum (PrivateUse1)",
        "verl is on by identity although VLLM_BATCH_INVARIANT=0"]


def _verl_without_run_ppo(*args: Any) -> dict:  # type: ignore[type-arg]
    import verl.trainer.main_ppo as main_ppo

    del main_ppo.run_ppo
    return run_switch_case(*args)


def test_verl_without_run_ppo_is_upstream_drift() -> None:
    _needs_verl()
    with pytest.raises(UpstreamApiMoved) as caught:
        _switch_case(_verl_without_run_ppo, VerlTarget(), True)
    assert caught.value.args[0] == ("upstream API moved: verl 0.9.1 has no "
                                    "verl.trainer.main_ppo.run_ppo")


def test_verl_unavailable_reasons(monkeypatch: pytest.MonkeyPatch) -> None:
    import harness.invariance.adapters as adapters

    monkeypatch.setattr(adapters, "has_module", lambda name: name != "verl")
    assert VerlTarget().unavailable("cpu", None) == "verl is not installed"
    monkeypatch.setattr(adapters, "has_module", lambda name: name == "verl")
    assert VerlTarget().unavailable("cpu", None) == "vllm_ascend is not installed"
    # the harness never sets verl's switch; it only unsets what vllm-ascend's "on" sets
    assert VerlTarget().switch_env(True) == {"HCCL_DETERMINISTIC": None,
                                             "LCCL_DETERMINISTIC": None}
