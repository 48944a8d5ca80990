"""Preflight: the runner's stack is coherent before anything else is judged. Each failure
names the component and the fix. On a CPU runner the torch_npu and ops-package checks skip
(nothing to check); an Ascend runner that declares them required (``--harness-require
torch_npu,batch_invariant_ops``, as the nightly workflow's Ascend rows do) fails instead."""

from __future__ import annotations

import pytest

from harness import preflight
from harness.devices import has_module
from harness.manifest import read_packages


@pytest.fixture(scope="module")
def stack() -> dict[str, dict[str, object]]:
    return read_packages()


def test_torch_and_torch_npu_match(stack: dict[str, dict[str, object]]) -> None:
    npu = stack["torch_npu"]["version"]
    if npu is None:
        pytest.skip("torch_npu is not installed: no torch / torch_npu pair to check")
    problem = preflight.torch_pair_problem(str(stack["torch"]["version"]), str(npu))
    assert problem is None, problem


def test_the_ops_package_registers_every_op_vllm_ascend_uses(
        run_on_npu: object, stack: dict[str, dict[str, object]]) -> None:
    used = preflight.ops_used_by("vllm_ascend")
    if not used:
        pytest.skip("vllm_ascend is not installed (or calls no batch_invariant_ops op)")
    if not has_module("batch_invariant_ops"):
        pytest.skip("batch_invariant_ops is not installed: vllm-ascend's AscendC ops path "
                    f"needs {', '.join(sorted(used))}")
    missing = run_on_npu(preflight.unregistered, sorted(used)).value  # type: ignore[operator]
    assert missing == [], (
        f"batch_invariant_ops does not register {', '.join(missing)}, which vllm-ascend "
        f"{stack['vllm_ascend']['version']} calls: rebuild and reinstall the ops package "
        "from the same vllm-ascend checkout (csrc/build_batch_invariant_ops.sh)")
