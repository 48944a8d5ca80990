"""The SGLang target on the released 0.5.23 sources (the default profile): its switch meets
its declaration, the on -> off case names what ``disable_batch_invariant_mode()`` leaves
patched, and negative controls break each expectation on purpose: an off that restores
everything passes, an off that restores nothing fails naming the kernels, a switch that
drops one override fails naming the operator, a switch with its ops package hidden fails
saying it installed nothing."""

from __future__ import annotations

import pytest

from harness import run_isolated
from harness.invariance import on_off
from harness.invariance.adapters import SglangTarget
from harness.invariance.switch import run_switch_case
from tests.test_switch_contract import _ops_package_hidden, rerun_edited, run_case

REBINDS = ("torch.ops.npu.npu_fused_infer_attention_score",
           "torch_npu._npu_fused_infer_attention_score_get_max_workspace",
           "torch_npu.npu_add_rms_norm", "torch_npu.npu_fused_infer_attention_score")


def _needs_sglang() -> None:
    reason = SglangTarget().unavailable("cpu", "no NPU here")
    if reason:
        pytest.skip(f"{reason} (bash ci/setup.sh --upstream installs SGLang's sources)")


def on_then_off(target) -> list[str]:  # type: ignore[no-untyped-def]
    res = run_isolated(on_off.run_on_then_off, target, method="forkserver",
                       env=target.switch_env(False))
    return on_off.judge(target, res.value)


def test_sglang_declares_what_its_release_registers() -> None:
    _needs_sglang()
    target = SglangTarget()
    found = target.declared()
    assert found.ops == {"aten::mm", "aten::matmul", "aten::mean.dim", "aten::_log_softmax"}
    assert found.rebinds == set(REBINDS) and found.overrides == []
    for check in ("switch", "mm", "add_rms_norm", "fused_infer_attention_score"):
        assert run_case(target, check, True) == [], check
        assert run_case(target, check, False) == [], check


def test_on_then_off_names_each_rebinding_disable_leaves() -> None:
    _needs_sglang()
    target = SglangTarget()
    problems = on_then_off(target)
    assert [p.split(" is still rebound")[0] for p in problems] == [
        f"after {target.release()}'s disable_batch_invariant_mode(), {name}"
        for name in REBINDS]
    assert all(p.endswith("(rebound at sglang/srt/batch_invariant_ops/batch_invariant_ops.py:"
                          "1058-1067 enable_batch_invariant_mode())") for p in problems)
    assert "npu_add_rms_norm_batch_invariant" in problems[2]


class FixedOff(SglangTarget):
    """Negative control (passing side): an off that also restores the torch_npu bindings."""

    def set_switch(self, enabled: bool) -> None:
        import torch
        import torch_npu

        self._saved = {"fia": torch_npu.npu_fused_infer_attention_score,
                       "ws": torch_npu._npu_fused_infer_attention_score_get_max_workspace,
                       "rms": torch_npu.npu_add_rms_norm,
                       "op": torch.ops.npu.npu_fused_infer_attention_score}
        super().set_switch(enabled)

    def switch_off(self) -> bool:
        import torch
        import torch_npu

        super().switch_off()
        torch_npu.npu_fused_infer_attention_score = self._saved["fia"]
        torch_npu._npu_fused_infer_attention_score_get_max_workspace = self._saved["ws"]
        torch_npu.npu_add_rms_norm = self._saved["rms"]
        torch.ops.npu.npu_fused_infer_attention_score = self._saved["op"]
        return True


class NoOff(SglangTarget):
    """Negative control: an off that does nothing (the library stays)."""

    def switch_off(self) -> bool:
        return True


def test_an_off_that_restores_everything_passes_and_one_that_restores_nothing_fails() -> None:
    _needs_sglang()
    assert on_then_off(FixedOff()) == []
    problems = on_then_off(NoOff())
    release = SglangTarget().release()
    assert problems[0] == f"{release} is still on by identity after disable_batch_invariant_mode()"
    assert [p.split(" still has")[0] for p in problems[1:5]] == [
        f"after {release}'s disable_batch_invariant_mode(), {op}"
        for op in ("aten::_log_softmax", "aten::matmul", "aten::mean.dim", "aten::mm")]


def _without_log_softmax(*args):  # type: ignore[no-untyped-def]
    """Negative control: the release's enable_batch_invariant_mode with its _log_softmax
    registration removed."""
    import sys

    from harness.invariance import sglang_switch, standin, standin_triton

    standin.install()
    standin_triton.install()
    module = sglang_switch.load()

    def cut(source: str) -> str:
        start = source.index('        _batch_invariant_LIB.impl(\n            '
                             '"aten::_log_softmax", npu_log_softmax')
        return source[:start] + source[source.index(")\n", start) + 2:]

    rerun_edited(module, "enable_batch_invariant_mode", cut)
    # the gate imports it from the package, which bound the released one at import
    sys.modules["sglang.srt.batch_invariant_ops"].enable_batch_invariant_mode = \
        module.enable_batch_invariant_mode
    return run_switch_case(*args)


def test_a_switch_that_drops_one_override_fails_naming_the_operator() -> None:
    _needs_sglang()
    target = SglangTarget()
    problems = run_case(target, "switch", True, _without_log_softmax)
    assert problems == [
        f"{target.release()}'s switch did not override aten::_log_softmax (declared at "
        "sglang/srt/batch_invariant_ops/batch_invariant_ops.py:1048-1057 "
        "enable_batch_invariant_mode()); it overrode aten::matmul, aten::mean.dim, aten::mm"]


def test_a_runner_without_the_ops_package_cannot_turn_sglang_on() -> None:
    """SGLang imports the AscendC package unguarded: "on" raises where vllm-ascend declines
    with a warning; the case fails with the import error, not as a pass."""
    _needs_sglang()
    target = SglangTarget()
    with pytest.raises(ModuleNotFoundError, match="import of batch_invariant_ops halted"):
        run_case(target, "switch", True, _ops_package_hidden)
