"""The preflight checks can fail: each is shown catching a broken stack."""

from __future__ import annotations

import pytest

from harness import preflight, run_isolated
from harness.devices import has_module


def test_a_torch_npu_built_for_another_torch_is_named_with_the_fix() -> None:
    assert preflight.torch_pair_problem("2.14.0", "2.14.0.post2") is None
    assert preflight.torch_pair_problem("2.14.0+cpu", "2.14.0") is None
    problem = preflight.torch_pair_problem("2.13.0+cpu", "2.14.0")
    assert problem is not None and "torch_npu 2.14.0, which is built for torch 2.14.0: " \
        "install torch==2.14.0" in problem


@pytest.mark.skipif(not has_module("vllm_ascend"), reason="the upstream set is not installed")
def test_the_ops_vllm_ascend_calls_are_read_from_its_sources() -> None:
    used = preflight.ops_used_by("vllm_ascend")
    assert {"npu_mm_batch_invariant", "npu_matmul_batch_invariant",
            "npu_reduce_sum_batch_invariant"} <= used


def _unregistered_with_the_stand_in(ops: list[str]) -> list[str]:
    from harness import standin

    standin.install()  # a CPU-backed ops package registering four batch-invariant ops
    return preflight.unregistered(ops)


def test_an_op_the_package_does_not_register_is_named() -> None:
    ops = ["npu_mm_batch_invariant", "npu_matmul_batch_invariant",
           "npu_softmax_batch_invariant"]  # the last: no package registers it
    missing = run_isolated(_unregistered_with_the_stand_in, ops, method="spawn").value
    assert missing == ["npu_softmax_batch_invariant"]


def test_the_preflight_suite_skips_on_cpu_and_fails_when_required(
        pytester: pytest.Pytester) -> None:
    from pathlib import Path

    suite = Path(__file__).parent.parent / "suites" / "test_stack_preflight.py"
    pytester.makepyfile(test_preflight=suite.read_text())
    plain = pytester.runpytest("--harness-results=")
    plain.assert_outcomes(skipped=2)
    required = pytester.runpytest("--harness-results=", "--harness-require",
                                  "torch_npu,batch_invariant_ops")
    required.assert_outcomes(failed=2)
    required.stdout.fnmatch_lines(["*required capability 'torch_npu' is missing*"])
