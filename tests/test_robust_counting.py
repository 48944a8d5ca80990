"""A loaded machine is not a finding: the recorder that needs no warm-up counts (and says
so), and a timeout tells a slow machine from a hang."""

from __future__ import annotations

import pytest

import harness
from harness.isolation.result import ChildTimeout, IsolatedResult
from harness.stack import dispatch
from tests.conftest import needs_torch


def _mm() -> float:
    import torch

    a = torch.ones(4, 4)
    return float(torch.mm(a, a).sum())


@needs_torch
def test_the_default_recorder_needs_no_warm_up_and_is_named() -> None:
    import torch

    with harness.count_events("aten::mm") as counts:
        torch.mm(torch.ones(2, 2), torch.ones(2, 2))
    assert counts == {"aten::mm": 1}
    assert counts.recorder == "record-function"  # type: ignore[attr-defined]
    res = harness.run_isolated(_mm, events=["aten::mm"])
    assert res.events == {"aten::mm": 1} and res.recorder == "record-function"


@needs_torch
def test_kineto_counts_the_same_when_asked_for(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(dispatch.RECORDER_ENV, "kineto")
    res = harness.run_isolated(_mm, events=["aten::mm"])
    assert res.events == {"aten::mm": 1} and res.recorder == "kineto"


def test_an_unknown_recorder_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(dispatch.RECORDER_ENV, "perf")
    with pytest.raises(ValueError, match="HARNESS_RECORDER='perf': use one of auto"):
        dispatch.choose_recorder("cpu")
    assert dispatch.choose_recorder("npu", "auto") == "autograd"


@pytest.mark.parametrize(("cpu", "says"), [(170.0, "a slow (loaded) machine"),
                                           (3.0, "it was mostly waiting: a hang")])
def test_a_timeout_says_how_loaded_the_machine_was(cpu: float, says: str) -> None:
    res = IsolatedResult(pid=7, timeout=180.0, outcome="timeout", extras={"timeout_load": {
        "load_avg_1m": 19.5, "cores": 2, "child_cpu_s": cpu, "wall_s": 180.0}})
    text = str(ChildTimeout(res))
    assert "machine load average 19.5 on 2 cores" in text
    assert f"used {cpu:g} s of CPU in 180 s" in text and says in text


def test_a_real_timeout_carries_the_load() -> None:
    import time

    with pytest.raises(ChildTimeout) as info:
        harness.run_isolated(time.sleep, 30, timeout=1.5)
    assert "machine load average" in str(info.value)
    assert "it was mostly waiting" in str(info.value)


def test_a_heavy_target_gets_a_budget_from_its_start_cost(monkeypatch: pytest.MonkeyPatch) -> None:
    from harness.invariance.adapters import ReferenceTarget, VerlTarget

    monkeypatch.setattr("os.getloadavg", lambda: (20.0, 0.0, 0.0))
    monkeypatch.setattr("os.cpu_count", lambda: 2)
    assert ReferenceTarget().time_budget(180.0) == 180.0
    assert VerlTarget().time_budget(180.0) == pytest.approx(180.0 + 4 * 10.5 * 10)
    monkeypatch.setattr("os.getloadavg", lambda: (0.1, 0.0, 0.0))
    assert VerlTarget().time_budget(180.0) == pytest.approx(180.0 + 42.0)
