"""Negative controls for the switch checks, and the vllm_ascend and vllm targets run against
the released code (the upstream set): vllm-ascend 0.23.0.post1 on the CPU-backed NPU
stand-in, vllm 0.33.0 on CPU. Broken releases and stand-ins appear only as negative
controls."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from harness import run_isolated
from harness.invariance import CHECKS, get_target, registry, switch_env
from harness.invariance.adapters import ReferenceTarget, VllmAscendTarget, VllmTarget
from harness.invariance.switch import SwitchObservation, case_inputs, judge, run_switch_case


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


def run_case(target, check: str, enabled: bool, *,  # type: ignore[no-untyped-def]
             env: dict[str, str] | None = None) -> list[str]:
    """One switch case through run_isolated (as the suite runs it); the judge's problems."""
    inputs = case_inputs(check)
    res = run_isolated(run_switch_case, target, check, enabled, inputs, method="forkserver",
                       env={**switch_env(enabled), **(env or {})}, events=target.event_patterns())
    return judge(target, check, enabled, inputs, res.value, res.events)


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
    assert len(problems) == 1 and problems[0].startswith(
        "expected batch_invariant_ops::mm to run, but it ran 0 times: torch.mm(a, b) "
        "dispatches aten::mm, and reference's switch changed only aten::_log_softmax (CPU), "
        "aten::matmul (CPU)"), problems
    # identity alone cannot tell; the declared op set can (harness/invariance/declared.toml)
    assert run_case(OnSkipsMm(), "switch", True) == [
        "reference's switch did not override aten::mm (declared at harness/invariance/"
        "reference.py enable_batch_invariant_mode()); it overrode aten::_log_softmax, "
        "aten::matmul, aten::mean.dim, aten::silu"]


def test_on_names_the_whole_footprint() -> None:
    target = ReferenceTarget()
    inputs = case_inputs("switch")
    res = run_isolated(run_switch_case, target, "switch", True, inputs, method="forkserver",
                       env=switch_env(True), events=target.event_patterns())
    assert res.value.dispatcher_footprint == {
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
    got = SwitchObservation(switch_env="1", enabled_by_identity=True,
                            outputs={"out": (inputs["a"].float() @ inputs["b"].float()) + 1})
    problems = judge(target, "mm", True, inputs, got, {"batch_invariant_ops::mm": 1})
    assert problems == ["mm out differs from the fp32 CPU reference (max abs diff 1.0); "
                        "rtol=0, atol=0 required"]


# --- vllm_ascend: the released sources (0.23.0.post1) on the CPU-backed NPU stand-in --------

def _needs_vllm_ascend() -> None:
    reason = VllmAscendTarget().unavailable("cpu", None)
    if reason:
        pytest.skip(f"{reason} (bash ci/setup.sh --upstream installs vllm-ascend's sources)")


#: what vllm-ascend 0.23.0.post1 does on the NPU key (measured: the release's own code)
VLLM_ASCEND_FOOTPRINT = {"aten::matmul": ["PrivateUse1"], "aten::mm": ["PrivateUse1"],
                         "aten::sum": ["PrivateUse1"]}


@pytest.mark.parametrize("check", CHECKS)
@pytest.mark.parametrize("enabled", [False, True])
def test_real_vllm_ascend_on_the_standin(check: str, enabled: bool) -> None:
    """Every case passes, but one: v0.23.0 registers aten::sum, not aten::sum.dim_IntList, and
    replaces torch.sum, not Tensor.sum, so x.sum(-1) never runs the invariant op."""
    _needs_vllm_ascend()
    problems = run_case(VllmAscendTarget(), check, enabled)
    if check == "tensor_sum" and enabled:
        assert problems == [
            "expected batch_invariant_ops::npu_reduce_sum_batch_invariant to run, but it ran 0 "
            "times: x.sum(-1) dispatches aten::sum.dim_IntList (x.sum() is aten::sum), and "
            "vllm-ascend 0.23.0.post1's switch changed only aten::matmul (PrivateUse1), "
            "aten::mm (PrivateUse1), aten::sum (PrivateUse1) on the dispatcher"]
    else:
        assert problems == []


def test_real_vllm_ascend_footprint_and_env() -> None:
    _needs_vllm_ascend()

    def on() -> tuple[dict, str | None, str | None]:  # type: ignore[type-arg]
        import os

        from harness.stack.dispatch import footprint, registrations

        target = VllmAscendTarget()
        target.device()
        target.load()
        before = registrations()
        target.set_switch(True)
        return (footprint(before, registrations()), os.environ.get("HCCL_DETERMINISTIC"),
                os.environ.get("LCCL_DETERMINISTIC"))

    # get_ascend_config() is patched (the real one needs a live vLLM config)
    assert run_isolated(on, method="forkserver", env=switch_env(True)).value == (
        VLLM_ASCEND_FOOTPRINT, "strict", "1")


def _bit_off_mm(*args):  # type: ignore[no-untyped-def]
    """Negative control: the stand-in AscendC mm returns results one ULP off."""
    import torch

    from harness.invariance import reference

    real = reference._mm_impl

    def off_by_one_ulp(a, b):  # type: ignore[no-untyped-def]
        out = real(a, b)
        return torch.nextafter(out, torch.full_like(out, float("inf")))

    reference._mm_impl = off_by_one_ulp
    return run_switch_case(*args)


def test_a_standin_op_that_returns_a_different_bit_fails_its_case() -> None:
    _needs_vllm_ascend()
    target = VllmAscendTarget()
    inputs = case_inputs("mm")
    res = run_isolated(_bit_off_mm, target, "mm", True, inputs, method="forkserver",
                       env=switch_env(True), events=target.event_patterns())
    problems = judge(target, "mm", True, inputs, res.value, res.events)
    assert len(problems) == 1 and problems[0].startswith(
        "mm out differs from the fp32 CPU reference"), problems


def _renamed_lib(*args):  # type: ignore[no-untyped-def]
    from harness.invariance import standin

    standin.install()  # the release imports torch_npu at module level
    import vllm_ascend.batch_invariant as module

    module._batch_invariant_LIB_v2 = module.__dict__.pop("_batch_invariant_LIB")
    return run_switch_case(*args)


def test_a_renamed_vllm_ascend_symbol_is_upstream_drift() -> None:
    from harness.stack.upstream import UpstreamApiMoved

    _needs_vllm_ascend()
    with pytest.raises(UpstreamApiMoved) as caught:
        run_isolated(_renamed_lib, VllmAscendTarget(), "switch", True, {},
                     method="forkserver", env=switch_env(True))
    assert caught.value.args[0] == ("upstream API moved: vllm-ascend 0.23.0.post1 has no "
                                    "vllm_ascend.batch_invariant._batch_invariant_LIB")


def _enable_registers_nothing(*args):  # type: ignore[no-untyped-def]
    """Negative control: the release's enable with its registrations lost (the handle is
    still set first, as v0.23.0 does): on by identity, nothing routed."""
    import torch

    original = torch.library.Library.impl
    torch.library.Library.impl = lambda *a, **k: None  # type: ignore[method-assign]
    try:
        return run_switch_case(*args)
    finally:
        torch.library.Library.impl = original  # type: ignore[method-assign]


@pytest.mark.parametrize("check", ["mm", "matmul"])
def test_a_release_that_registers_nothing_fails_on_events(check: str) -> None:
    _needs_vllm_ascend()
    target = VllmAscendTarget()
    inputs = case_inputs(check)
    res = run_isolated(_enable_registers_nothing, target, check, True, inputs,
                       method="forkserver", env=switch_env(True),
                       events=target.event_patterns())
    problems = judge(target, check, True, inputs, res.value, res.events)
    assert any(p.startswith(f"expected {target.OPS[check]} to run, but it ran 0 times")
               for p in problems), problems
    assert res.value.enabled_by_identity is True  # identity alone could not tell


def test_vllm_ascend_unavailable_reasons(monkeypatch: pytest.MonkeyPatch) -> None:
    import harness.invariance.adapters as adapters

    target = VllmAscendTarget()
    monkeypatch.setattr(adapters, "has_module", lambda name: name != "vllm_ascend")
    assert target.unavailable("cpu", None) == "vllm_ascend is not installed"
    monkeypatch.setattr(adapters, "has_module", lambda name: name != "batch_invariant_ops")
    assert target.unavailable("npu", None) == "batch_invariant_ops is not installed"
    assert target.unavailable("cpu", "no NPU") == (
        "torch_npu is installed but the session has no NPU (no NPU): the CPU stand-in would "
        "hide it")
    monkeypatch.setattr(adapters, "has_module", lambda name: name == "vllm_ascend")
    assert target.unavailable("cpu", None) is None  # the stand-in
    assert target.unavailable("cuda", None) == (
        "runs on an NPU or on the CPU stand-in: the session device is cuda")


def test_vllm_ascend_broken_install_fails_not_skips(tmp_path: Path) -> None:
    (tmp_path / "vllm_ascend").mkdir()
    (tmp_path / "vllm_ascend" / "__init__.py").write_text("raise ImportError('libhccl.so missing')")

    def run() -> None:
        sys.path.insert(0, str(tmp_path))
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
        assert res.value.dispatcher_footprint == (VLLM_CPU_FOOTPRINT if enabled else {})


def _vllm_without_lib(enabled: bool) -> dict:  # type: ignore[type-arg]
    """Negative control: the real module with its private handle renamed."""
    import vllm.model_executor.determinism.batch_invariant as module

    module._batch_invariant_LIB_v2 = module.__dict__.pop("_batch_invariant_LIB")
    return run_switch_case(VllmTarget(), "switch", enabled, case_inputs("switch"))


def test_a_renamed_vllm_symbol_is_upstream_drift() -> None:
    from harness.stack.upstream import UpstreamApiMoved

    _needs_vllm()
    with pytest.raises(UpstreamApiMoved) as caught:
        run_isolated(_vllm_without_lib, True, method="forkserver", env=switch_env(True))
    assert caught.value.args[0] == ("upstream API moved: vllm 0.33.0 has no "
                                    "vllm.model_executor.determinism.batch_invariant."
                                    "_batch_invariant_LIB")


def test_vllm_reasons(monkeypatch: pytest.MonkeyPatch) -> None:
    import harness.invariance.adapters as adapters

    target = VllmTarget()
    monkeypatch.setattr(adapters, "has_module", lambda name: False)
    assert target.unavailable("cpu", None) == "vllm is not installed"
    monkeypatch.setattr(adapters, "has_module", lambda name: True)
    path = next((p for m in target.MODULES if (p := adapters.source_file(m))), None)
    if path is None:
        pytest.skip("vllm is not installed (bash ci/setup.sh --upstream)")
    if adapters.registration_keys(path.read_text()) == {"CUDA"}:  # vLLM 0.23.0 / 0.24.0
        for kind in ("cpu", "npu"):
            assert "registers its batch-invariant kernels on the CUDA dispatch key only" in \
                target.unavailable(kind, None)
        assert target.unavailable("cuda", None) is None
    else:  # vllm 0.33.0 (the forward profile): the key follows its platform
        assert target.unavailable("npu", None) == \
            "runs on CUDA or CPU: the session device is npu"
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
    """Our ops and a vendor's (the stand-in AscendC package) live side by side in one
    namespace."""

    def both() -> list[bool]:
        import torch

        import harness.invariance.reference  # noqa: F401
        from harness.invariance import standin

        standin.install()
        import batch_invariant_ops  # noqa: F401

        ns = torch.ops.batch_invariant_ops
        return [hasattr(ns, "mm"), hasattr(ns, "reduce_sum"), hasattr(ns, "npu_mm_batch_invariant")]

    assert run_isolated(both, method="forkserver").value == [True, True, True]


def test_count_events_is_top_level_api() -> None:
    """``harness.count_events`` as the README documents it (the same function)."""
    import torch

    import harness
    from harness.stack import dispatch

    assert harness.count_events is dispatch.count_events
    with harness.count_events("aten::mm", "batch_invariant_ops::") as counts:
        torch.mm(torch.ones(2, 2), torch.ones(2, 2))
    assert counts == {"aten::mm": 1}


def test_the_release_finding_reaches_the_results_file(pytester: pytest.Pytester) -> None:
    """The real suite against vllm-ascend 0.23.0.post1 on the stand-in: tensor_sum with the
    switch on fails, naming op, call and release, as a finding about the release."""
    import json

    _needs_vllm_ascend()
    suite = Path(__file__).parent.parent / "suites" / "test_batch_invariant_switch.py"
    pytester.makepyfile(test_switch_copy=suite.read_text())
    out = pytester.path / "r.jsonl"
    result = pytester.runpytest("--bi-target", "vllm_ascend", "--harness-results", str(out),
                                "-k", "tensor_sum or mm-enabled", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=2, failed=1)
    records = {r["id"].rsplit("[", 1)[-1]: r for r in map(json.loads, out.read_text().splitlines())
               if r["type"] == "test"}
    failed = records["vllm_ascend-tensor_sum-enabled]"]
    assert failed["category"] == "release-finding"
    assert failed["release_finding"] == "vllm-ascend 0.23.0.post1"
    assert "vllm-ascend 0.23.0.post1 tensor_sum with the switch on" in failed["longrepr"]
    assert "x.sum(-1) dispatches aten::sum.dim_IntList" in failed["longrepr"]
    assert records["vllm_ascend-mm-enabled]"]["dispatch_events"] == {
        "batch_invariant_ops::npu_mm_batch_invariant": 1}


def test_a_vllm_whose_import_fails_fails_in_the_child(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Found by file, not by import: a broken install is a failure, never a skip."""
    module_dir = tmp_path / "vllm" / "model_executor" / "determinism"
    module_dir.mkdir(parents=True)
    (tmp_path / "vllm" / "__init__.py").write_text("")
    (tmp_path / "vllm" / "model_executor" / "__init__.py").write_text(
        "raise ImportError(\"No module named 'urllib3' (broken install)\")\n")
    (module_dir / "__init__.py").write_text("")
    (module_dir / "batch_invariant.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert VllmTarget().unavailable("cpu", None) is None

    def run() -> None:
        sys.path.insert(0, str(tmp_path))
        VllmTarget().set_switch(True)

    with pytest.raises(ImportError, match="urllib3"):
        run_isolated(run, method="forkserver")
