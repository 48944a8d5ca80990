"""The whole switch contract: what each release declares its "on" sets besides kernels
(environment, deterministic algorithms, config; ``harness/invariance/declared.toml``), the
operator set it overrides, and an "on" that installs nothing. Negative controls break each
on purpose: a copy of the release with one override removed, with its ops package hidden."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness import run_isolated
from harness.invariance import declared
from harness.invariance.adapters import ReferenceTarget, VllmAscendTarget
from harness.invariance.switch import case_inputs, judge, run_switch_case


def run_case(target, check: str, enabled: bool, fn=run_switch_case) -> list[str]:  # type: ignore[no-untyped-def]
    inputs = case_inputs(check)
    res = run_isolated(fn, target, check, enabled, inputs, method="forkserver",
                       env=target.switch_env(enabled), events=target.event_patterns())
    return judge(target, check, enabled, inputs, res.value, res.events)


class OnWithoutDeterminism(ReferenceTarget):
    """Broken on purpose: 'on' forgets torch.use_deterministic_algorithms."""

    def set_switch(self, enabled: bool) -> None:
        import os

        os.environ["VLLM_BATCH_INVARIANT"] = "1" if enabled else "0"
        if enabled:
            os.environ["HCCL_DETERMINISTIC"] = "strict"
            self._module().enable_batch_invariant_mode()


class OffSetsHccl(ReferenceTarget):
    """Broken on purpose: 'off' still makes HCCL deterministic."""

    def set_switch(self, enabled: bool) -> None:
        import os

        super().set_switch(enabled)
        os.environ["HCCL_DETERMINISTIC"] = "strict"


class OnAlsoOverridesBmm(ReferenceTarget):
    """Broken on purpose: 'on' overrides one operator more than it declares."""

    def set_switch(self, enabled: bool) -> None:
        import torch

        super().set_switch(enabled)
        if enabled:
            self.extra = torch.library.Library("aten", "IMPL")
            self.extra.impl("bmm", lambda a, b: torch.ops.aten.bmm.default(a, b), "CPU")


def test_the_reference_meets_its_declaration() -> None:
    assert run_case(ReferenceTarget(), "switch", True) == []
    assert run_case(ReferenceTarget(), "switch", False) == []


def test_an_on_without_one_declared_override_fails_naming_it() -> None:
    problems = run_case(OnWithoutDeterminism(), "mm", True)
    assert problems == [
        "with the switch on, reference did not set torch.use_deterministic_algorithms(True, "
        "warn_only=True) (the child read {'enabled': False, 'warn_only': False}); declared at "
        "harness/invariance/reference.py override_envs_for_invariance() (as vllm-ascend's)"]


def test_an_off_that_sets_an_override_fails_naming_it() -> None:
    problems = run_case(OffSetsHccl(), "mm", False)
    assert problems == [
        "with the switch off, reference set HCCL_DETERMINISTIC=strict; declared for 'on' at "
        "harness/invariance/reference.py override_envs_for_invariance() (as vllm-ascend's)"]


def test_an_undeclared_override_fails_naming_the_operator() -> None:
    problems = run_case(OnAlsoOverridesBmm(), "switch", True)
    assert len(problems) == 1 and problems[0].startswith(
        "reference's switch also overrode aten::bmm on CPU, which its declaration"), problems


def test_an_inherited_override_does_not_make_off_look_set(monkeypatch: pytest.MonkeyPatch
                                                          ) -> None:
    """A runner that exports HCCL_DETERMINISTIC must not fail every 'off' case."""
    monkeypatch.setenv("HCCL_DETERMINISTIC", "strict")
    assert run_case(ReferenceTarget(), "mm", False) == []


def test_a_declaration_of_an_unknown_kind_is_named(tmp_path: Path) -> None:
    bad = tmp_path / "declared.toml"
    bad.write_text('[[override]]\ntarget = "x"\nrelease = "*"\nkind = "envs"\nname = "A"\n'
                   'value = "1"\nsource = "s"\n')
    with pytest.raises(ValueError, match=r"override 'A' has kind 'envs'; use one of env, "
                                         r"deterministic, config"):
        declared.load("x", None, bad)


# --- the released vllm-ascend, on the CPU-backed stand-in ---------------------------------

def _needs_vllm_ascend() -> None:
    reason = VllmAscendTarget().unavailable("cpu", None)
    if reason:
        pytest.skip(f"{reason} (bash ci/setup.sh --upstream installs vllm-ascend's sources)")


def test_vllm_ascend_declares_what_its_release_sets() -> None:
    _needs_vllm_ascend()
    found = VllmAscendTarget().declared()
    assert found.ops == {"aten::mm", "aten::matmul", "aten::sum"}
    assert [o.shown() for o in found.overrides] == [
        "HCCL_DETERMINISTIC=strict", "LCCL_DETERMINISTIC=1",
        "torch.use_deterministic_algorithms(True, warn_only=True)",
        "config.weight_nz_mode=0", "config.enable_matmul_allreduce=False"]
    assert run_case(VllmAscendTarget(), "switch", True) == []
    assert run_case(VllmAscendTarget(), "switch", False) == []


def rerun_edited(module, name: str, edit) -> None:  # type: ignore[no-untyped-def]
    """A negative control's seed: the release's function ``name``, its source edited by
    ``edit`` (which must change it) and run again in its own module."""
    import inspect
    import textwrap

    source = textwrap.dedent(inspect.getsource(getattr(module, name)))
    edited = edit(source)
    assert edited != source
    exec(compile(edited, module.__file__, "exec"), module.__dict__)  # noqa: S102


def _without_hccl(*args):  # type: ignore[no-untyped-def]
    """Negative control: the release's override_envs_for_invariance with its
    HCCL_DETERMINISTIC line removed."""
    from harness.invariance import standin

    standin.install()
    import vllm_ascend.batch_invariant as module

    rerun_edited(module, "override_envs_for_invariance", lambda source: "\n".join(
        line for line in source.splitlines() if "HCCL_DETERMINISTIC" not in line))
    return run_switch_case(*args)


def test_a_release_without_one_env_override_fails_naming_it() -> None:
    _needs_vllm_ascend()
    target = VllmAscendTarget()
    problems = run_case(target, "mm", True, _without_hccl)
    assert problems == [
        f"with the switch on, {target.release()} did not set HCCL_DETERMINISTIC=strict (the "
        "child read None); declared at vllm_ascend/batch_invariant.py:83 "
        "override_envs_for_invariance()"]


def _ops_package_hidden(*args):  # type: ignore[no-untyped-def]
    """Negative control: a runner whose AscendC ops package is missing."""
    import sys

    from harness.invariance import standin

    standin.install()
    sys.modules["batch_invariant_ops"] = None  # type: ignore[assignment]
    return run_switch_case(*args)


@pytest.mark.parametrize("check", ["switch", "mm"])
def test_on_that_installs_nothing_says_why_in_the_release_s_words(check: str) -> None:
    _needs_vllm_ascend()
    target = VllmAscendTarget()
    problems = run_case(target, check, True, _ops_package_hidden)
    assert problems[0] == (
        f"VLLM_BATCH_INVARIANT=1 asked {target.release()} to switch on, and it installed "
        "nothing (no kernel changed, off by identity); its log said: WARNING vllm.logger: "
        "Batch-invariant mode requested but Triton or AscendC batch-invariant "
        "ops is not available.skipping batch-invariant initialization.. A runner without the "
        "ops package does this: see suites/test_stack_preflight.py::test_the_ops_package_"
        "registers_every_op_vllm_ascend_uses (and --harness-require batch_invariant_ops)"), \
        problems


# --- values on random floats: a batch-dependent override ----------------------------------

SPLIT_REDUCE_SUM = '''
def reduce_sum(x, dim=None, keepdim=False):
    # seeded: above 2 rows, the invariant kernel on each half of the row, added (another
    # rounding order; the kernel still runs, so the op checks' events see nothing wrong)
    if x.device.type == "npu" and x.dim() >= 2 and x.shape[0] > 2:
        h = x.shape[-1] // 2
        return _released_reduce_sum(x[..., :h].contiguous(), -1, keepdim) + \\
            _released_reduce_sum(x[..., h:].contiguous(), -1, keepdim)
    return _released_reduce_sum(x, dim, keepdim)
'''


def _batch_split_reduce_sum(*args):  # type: ignore[no-untyped-def]
    """Negative control: vllm-ascend's reduce_sum split by batch size (it slices its input:
    the stand-in device must run that as the NPU would)."""
    from harness.invariance import standin
    from harness.invariance.values import run_value_case

    standin.install()
    import vllm_ascend.batch_invariant as module

    module._released_reduce_sum = module.reduce_sum
    exec(SPLIT_REDUCE_SUM, module.__dict__)  # noqa: S102 - the seeded copy, in its module
    return run_value_case(*args)


def test_the_value_cases_pass_on_the_release_and_fail_a_batch_split_override() -> None:
    from harness.invariance import values

    _needs_vllm_ascend()
    target = VllmAscendTarget()
    cases = {dtype: values.inputs("sum", dtype) for dtype in values.DTYPES}
    env = target.switch_env(True)
    res = run_isolated(values.run_value_case, target, "sum", cases, method="forkserver", env=env)
    assert values.judge(target, "sum", res.value) == []
    seeded = run_isolated(_batch_split_reduce_sum, target, "sum", cases, method="forkserver",
                          env=env)
    problems = values.judge(target, "sum", seeded.value)
    assert problems, "a reduce_sum split by batch size passed the value case"
    assert all(p.startswith(f"with the switch on, {target.release()}'s aten::sum is "
                            "batch-variant: torch.sum(x, dim=-1) gives the probe row other bits")
               for p in problems), problems
    assert {d["batch"] for d in seeded.value["differs"]} == {7, 32}  # not 2: below the split
    # the op checks' small integers cannot see it: every partial sum is exact
    assert run_case(target, "torch_sum", True,
                    lambda *a: _split_then(run_switch_case, *a)) == []


def _split_then(fn, *args):  # type: ignore[no-untyped-def]
    from harness.invariance import standin

    standin.install()
    import vllm_ascend.batch_invariant as module

    module._released_reduce_sum = module.reduce_sum
    exec(SPLIT_REDUCE_SUM, module.__dict__)  # noqa: S102
    return fn(*args)


# --- call forms: a rebinding that sends a form where the kernel cannot go ------------------

def _tensor_sum_rebound(*args):  # type: ignore[no-untyped-def]
    """Negative control: vllm-ascend's later change (PR #14949) seeded into 0.23.0.post1:
    Tensor.sum follows reduce_sum, so x.sum(dim=0) reaches the last-dim-only kernel."""
    from harness.invariance import standin
    from harness.invariance.call_forms import run_forms

    standin.install()
    import vllm_ascend.batch_invariant as module

    released = module.enable_batch_invariant_mode

    def enable() -> None:
        import torch

        released()
        if module._batch_invariant_LIB is not None:
            torch.Tensor.sum = module.reduce_sum

    module.enable_batch_invariant_mode = enable
    return run_forms(*args)


def test_a_tensor_sum_rebinding_that_sends_dim_0_to_the_kernel_fails() -> None:
    from harness.invariance import call_forms

    _needs_vllm_ascend()
    target = VllmAscendTarget()
    given = call_forms.inputs()
    off = run_isolated(call_forms.run_forms, target, "sum", False, given, method="forkserver",
                       env=target.switch_env(False)).value
    released = run_isolated(call_forms.run_forms, target, "sum", True, given,
                            method="forkserver", env=target.switch_env(True)).value
    seeded = run_isolated(_tensor_sum_rebound, target, "sum", True, given,
                          method="forkserver", env=target.switch_env(True)).value
    before = call_forms.judge(target, "sum", off, released)
    after = call_forms.judge(target, "sum", off, seeded)
    new = [p for p in after if p not in before]
    assert new and all("`x.sum(" in p for p in new), new
    assert any(p.startswith(f"with the switch on, {target.release()}: `x.sum(0)` raised "
                            "RuntimeError: EZ1001: Provided dim only support last dim")
               for p in new), new


def test_every_call_form_works_on_the_reference() -> None:
    from harness.invariance import call_forms

    target = ReferenceTarget()
    given = call_forms.inputs()
    for case in ("sum", "mm", "matmul", "log_softmax", "mean"):
        got = {enabled: run_isolated(call_forms.run_forms, target, case, enabled, given,
                                     method="forkserver", env=target.switch_env(enabled)).value
               for enabled in (False, True)}
        assert call_forms.judge(target, case, got[False], got[True]) == [], case
