"""Negative controls for the switch checks, and the vllm_ascend / vllm adapters run
against fake modules built from the facts file."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from harness import run_isolated
from harness.invariance import CHECKS, get_target, registry, switch_env
from harness.invariance.adapters import ReferenceTarget, VllmAscendTarget, VllmTarget
from harness.invariance.switch import case_inputs, judge, run_switch_case

FAKES = str(Path(__file__).parent / "fakes")


class OnRegistersNothing(ReferenceTarget):
    """Broken on purpose: 'on' sets the variable but installs nothing."""

    def set_switch(self, enabled: bool) -> None:
        import os

        os.environ["VLLM_BATCH_INVARIANT"] = "1" if enabled else "0"


class OffLeaks(ReferenceTarget):
    """Broken on purpose: 'off' still installs the invariant ops (a leaked registration)."""

    def set_switch(self, enabled: bool) -> None:
        import os

        os.environ["VLLM_BATCH_INVARIANT"] = "1" if enabled else "0"
        self._module().enable_batch_invariant_mode()


def run_case(target, check: str, enabled: bool, *, fakes: bool = False,  # type: ignore[no-untyped-def]
             env: dict[str, str] | None = None) -> list[str]:
    """One switch case through run_isolated (as the suite runs it); the judge's problems."""
    inputs = case_inputs(check)
    fn = _with_fakes if fakes else run_switch_case
    res = run_isolated(fn, target, check, enabled, inputs, method="forkserver",
                       env={**switch_env(enabled), **(env or {})}, events=target.event_patterns())
    return judge(target, check, enabled, inputs, res.value, res.events)


def _with_fakes(*args):  # type: ignore[no-untyped-def]
    sys.path.insert(0, FAKES)
    return run_switch_case(*args)


@pytest.mark.parametrize("check", CHECKS)
def test_on_that_registers_nothing_fails_every_enabled_case(check: str) -> None:
    problems = run_case(OnRegistersNothing(), check, True)
    assert problems, f"the broken 'on' passed {check}"
    assert any("off by identity" in p for p in problems)


@pytest.mark.parametrize("check", CHECKS)
def test_off_that_leaks_fails_every_disabled_case(check: str) -> None:
    problems = run_case(OffLeaks(), check, False)
    assert problems, f"the leaking 'off' passed {check}"
    assert any("on by identity" in p for p in problems)


@pytest.mark.parametrize("check", ["mm", "matmul", "torch_sum", "tensor_sum", "add_rms_norm"])
def test_leak_is_caught_by_events_alone(check: str) -> None:
    """Even a target that lies about its identity is caught by the counted events."""

    class LyingLeak(OffLeaks):
        def is_enabled(self) -> bool:
            return False

    problems = run_case(LyingLeak(), check, False)
    assert any("expected no batch_invariant_ops::" in p for p in problems), problems


class OffLeaksLogSoftmax(ReferenceTarget):
    """Broken on purpose: 'off' leaves one aten override that no check runs (_log_softmax),
    while identity and the checked ops all read 'off'."""

    def set_switch(self, enabled: bool) -> None:
        import os

        import torch

        os.environ["VLLM_BATCH_INVARIANT"] = "1" if enabled else "0"
        if enabled:
            self._module().init_batch_invariance()
        else:
            lib = torch.library.Library("aten", "IMPL")
            lib.impl("_log_softmax", self._module()._log_softmax_override, "CPU")
            torch.__dict__.setdefault("_test_leaked_libs", []).append(lib)


@pytest.mark.parametrize("check", CHECKS)
def test_off_that_leaks_an_unchecked_override_fails_every_disabled_case(check: str) -> None:
    problems = run_case(OffLeaksLogSoftmax(), check, False)
    assert problems == ["with the switch off, reference changed the dispatcher: "
                        "aten::_log_softmax (CPU)"], problems


class OnSkipsMm(ReferenceTarget):
    """Broken on purpose: 'on' by identity (the library exists, torch.sum is replaced) but
    aten::mm is never routed to the invariant op."""

    def set_switch(self, enabled: bool) -> None:
        from unittest import mock

        import torch

        original = torch.library.Library.impl

        def impl(lib, name, *args, **kwargs):  # type: ignore[no-untyped-def]
            return None if name == "mm" else original(lib, name, *args, **kwargs)

        with mock.patch.object(torch.library.Library, "impl", impl):
            super().set_switch(enabled)


def test_on_by_identity_without_routing_mm_fails_on_events() -> None:
    problems = run_case(OnSkipsMm(), "mm", True)
    assert problems == ["expected batch_invariant_ops::mm to run, but it ran 0 times"], problems
    assert run_case(OnSkipsMm(), "switch", True) == []  # identity alone cannot tell


def test_on_names_the_whole_footprint() -> None:
    target = ReferenceTarget()
    inputs = case_inputs("switch")
    res = run_isolated(run_switch_case, target, "switch", True, inputs, method="forkserver",
                       env=switch_env(True), events=target.event_patterns())
    assert res.value["dispatcher_footprint"] == {
        "aten::_log_softmax": ["CPU"], "aten::matmul": ["CPU"], "aten::mean.dim": ["CPU"],
        "aten::mm": ["CPU"], "aten::silu": ["CPU"]}


def test_enabled_case_does_not_leak_into_the_next() -> None:
    target = ReferenceTarget()
    assert run_case(target, "mm", True) == []
    assert run_case(target, "mm", False) == []
    assert run_case(target, "torch_sum", False) == []


@pytest.mark.parametrize("check", CHECKS)
@pytest.mark.parametrize("enabled", [False, True])
def test_reference_passes_every_case(check: str, enabled: bool) -> None:
    assert run_case(ReferenceTarget(), check, enabled) == []


def test_wrong_values_are_caught() -> None:
    target = ReferenceTarget()
    inputs = case_inputs("mm")
    got = {"switch_env": "1", "enabled_by_identity": True,
           "out": (inputs["a"].float() @ inputs["b"].float()) + 1}
    problems = judge(target, "mm", True, inputs, got, {"batch_invariant_ops::mm": 1})
    assert problems == ["mm out differs from the fp32 CPU reference (max abs diff 1.0); "
                        "rtol=0, atol=0 required"]


# --- vllm_ascend against the fakes ---------------------------------------------------------

@pytest.mark.parametrize("check", CHECKS)
@pytest.mark.parametrize("enabled", [False, True])
def test_vllm_ascend_adapter_on_fakes(check: str, enabled: bool) -> None:
    assert run_case(VllmAscendTarget(), check, enabled, fakes=True) == []


@pytest.mark.parametrize("broken, enabled", [("on-noop", True), ("off-leaks", False)])
@pytest.mark.parametrize("check", ["switch", "mm", "add_rms_norm", "fused_infer_attention_score"])
def test_vllm_ascend_adapter_catches_broken_fakes(check: str, broken: str, enabled: bool) -> None:
    problems = run_case(VllmAscendTarget(), check, enabled, fakes=True,
                        env={"FAKE_BI_BROKEN": broken})
    assert problems


def test_vllm_ascend_config_is_patched_not_required() -> None:
    """init_batch_invariance reads get_ascend_config(), which raises un-patched."""

    def check() -> tuple[str | None, str | None]:
        import os

        sys.path.insert(0, FAKES)
        VllmAscendTarget().set_switch(True)
        return os.environ.get("HCCL_DETERMINISTIC"), os.environ.get("LCCL_DETERMINISTIC")

    assert run_isolated(check, method="forkserver").value == ("strict", "1")


def test_vllm_ascend_unavailable_reasons(monkeypatch: pytest.MonkeyPatch) -> None:
    target = VllmAscendTarget()
    assert target.unavailable("cpu", "torch_npu is not installed") == "torch_npu is not installed"
    monkeypatch.syspath_prepend(FAKES)
    assert target.unavailable("cpu", "torch_npu is installed but reports no NPU") == \
        "needs an NPU: torch_npu is installed but reports no NPU"
    assert target.unavailable("npu", None) is None


def test_vllm_ascend_broken_install_fails_not_skips(tmp_path: Path) -> None:
    (tmp_path / "vllm_ascend").mkdir()
    (tmp_path / "vllm_ascend" / "__init__.py").write_text("raise ImportError('libhccl.so missing')")

    def run() -> None:
        sys.path[:0] = [str(tmp_path), FAKES]
        VllmAscendTarget().set_switch(True)

    with pytest.raises(ImportError, match="libhccl.so missing"):
        run_isolated(run, method="forkserver")


# --- vllm: the released module (vllm 0.33.0 of the upstream set) on CPU ----------------------

def _needs_vllm() -> None:
    reason = VllmTarget().unavailable("cpu", None)
    if reason:
        pytest.skip(f"{reason} (bash ci/setup.sh --upstream installs vllm 0.33.0)")


VLLM_CPU_FOOTPRINT = {"aten::_log_softmax": ["CPU"], "aten::_softmax": ["CPU"],
                      "aten::bmm": ["CPU"], "aten::bmm.out": ["CPU"], "aten::mean.dim": ["CPU"],
                      "aten::softmax": ["CPU"]}


def test_real_vllm_switch_on_cpu() -> None:
    """vllm 0.33.0 enables on CPU: on by identity with its whole footprint; off changes
    nothing."""
    _needs_vllm()
    target = VllmTarget()
    for enabled in (False, True):
        inputs = case_inputs("switch")
        res = run_isolated(run_switch_case, target, "switch", enabled, inputs,
                           method="forkserver", env=switch_env(enabled),
                           events=target.event_patterns())
        assert judge(target, "switch", enabled, inputs, res.value, res.events) == []
        assert res.value["dispatcher_footprint"] == (VLLM_CPU_FOOTPRINT if enabled else {})


def _vllm_without_lib(enabled: bool) -> dict:  # type: ignore[type-arg]
    """Negative control: the real module with its private handle renamed."""
    import vllm.model_executor.determinism.batch_invariant as module

    module._batch_invariant_LIB_v2 = module.__dict__.pop("_batch_invariant_LIB")
    return run_switch_case(VllmTarget(), "switch", enabled, case_inputs("switch"))


def test_a_renamed_vllm_symbol_is_upstream_drift() -> None:
    from harness.upstream import UpstreamDrift

    _needs_vllm()
    with pytest.raises(UpstreamDrift) as caught:
        run_isolated(_vllm_without_lib, True, method="forkserver", env=switch_env(True))
    assert caught.value.args[0] == ("upstream drift: vllm 0.33.0 has no "
                                    "vllm.model_executor.determinism.batch_invariant."
                                    "_batch_invariant_LIB")


def test_vllm_reasons(monkeypatch: pytest.MonkeyPatch) -> None:
    import harness.invariance.adapters as adapters

    target = VllmTarget()
    monkeypatch.setattr(adapters, "has_module", lambda name: False)
    assert target.unavailable("cpu", None) == "vllm is not installed"
    monkeypatch.setattr(adapters, "has_module", lambda name: True)
    assert target.unavailable("npu", None) == "runs on CUDA or CPU: the session device is npu"
    assert target.unavailable("cpu", None) is None
    assert "no batch_invariant_ops:: event" in target.not_applicable("mm")


def test_registry_and_unknown_target() -> None:
    assert list(registry())[:3] == ["reference", "vllm_ascend", "vllm"]
    with pytest.raises(KeyError, match="unknown batch-invariance target 'nope'"):
        get_target("nope")


def test_suite_event_counts_land_in_junit(pytester: pytest.Pytester) -> None:
    suite = Path(__file__).parent.parent / "suites" / "test_batch_invariant_switch.py"
    pytester.makepyfile(test_switch_copy=suite.read_text())
    result = pytester.runpytest("--bi-target", "reference", "--junitxml=j.xml", "-o",
                                "junit_family=xunit1", "-k", "mm and enabled and not disabled")
    result.assert_outcomes(passed=1)
    xml = (pytester.path / "j.xml").read_text()
    assert 'name="dispatch_events" value="{&quot;batch_invariant_ops::mm&quot;: 1}"' in xml


def test_namespace_is_shared_with_a_vendor_fragment() -> None:
    """Our ops and a vendor's (the fake AscendC package) live side by side in one namespace."""

    def both() -> list[bool]:
        import torch

        import harness.invariance.reference  # noqa: F401

        sys.path.insert(0, FAKES)
        import batch_invariant_ops  # noqa: F401

        ns = torch.ops.batch_invariant_ops
        return [hasattr(ns, "mm"), hasattr(ns, "reduce_sum"), hasattr(ns, "npu_mm_batch_invariant")]

    assert run_isolated(both, method="forkserver").value == [True, True, True]


def test_count_events_is_top_level_api() -> None:
    """``harness.count_events`` as the README documents it (the same function)."""
    import torch

    import harness
    from harness import dispatch

    assert harness.count_events is dispatch.count_events
    with harness.count_events("aten::mm", "batch_invariant_ops::") as counts:
        torch.mm(torch.ones(2, 2), torch.ones(2, 2))
    assert counts == {"aten::mm": 1}
