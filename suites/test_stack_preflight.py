"""Preflight: the runner's stack is coherent before anything else is judged. Each failure
names the component and the fix. On a CPU runner the torch_npu, ops-package, CANN and driver
checks skip (nothing to check); an Ascend runner that declares them required
(``--harness-require torch_npu,batch_invariant_ops,cann``, as the nightly workflow's Ascend
rows do) fails instead."""

from __future__ import annotations

import pytest

from harness.hardware import NpuVersions, preflight
from harness.plugin.stack_manifest import read_packages
from harness.stack.devices import has_module


@pytest.fixture(scope="module")
def stack() -> dict[str, dict[str, object]]:
    return read_packages()


def test_the_stack_is_one_its_releases_pair(request: pytest.FixtureRequest,
                                            record_property: object) -> None:
    """vllm-ascend's compatibility matrix (vLLM, torch / torch_npu, triton-ascend) and the
    stack pieces' own Requires-Dist: a runner with vllm-ascend 0.23.0.post1 on vLLM 0.33.0
    fails here, and every failure of its night is filed "on an unsupported stack"."""
    from harness.plugin import SESSION_KEY

    pairing = request.config.stash[SESSION_KEY].stack.get("pairing") or {}
    record_property("stack_pairing", pairing)  # type: ignore[operator]
    if not pairing:
        pytest.skip("no pairing verdict recorded for this session")
    problems = pairing.get("problems", [])
    assert not problems, "the stack is not one its releases pair:\n- " + "\n- ".join(problems)


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


def test_cann_meets_what_vllm_ascend_is_released_for(
        npu_versions: NpuVersions, stack: dict[str, dict[str, object]]) -> None:
    release = stack["vllm_ascend"]["version"]
    if release is None:
        pytest.skip("vllm_ascend is not installed: no CANN requirement to check")
    stated = preflight.stated_cann(str(release), preflight.installed_matrix())
    if stated is None:
        pytest.skip(f"vllm-ascend {release} is in neither its own compatibility matrix (not "
                    "installed beside it) nor harness.hardware.preflight.STATED_CANN: add it there")
    if not npu_versions.cann_version:
        pytest.skip(f"CANN is not detected on this runner ({_tried(npu_versions, 'cann')})")
    problem = preflight.cann_problem(npu_versions.cann_version, str(release), *stated)
    assert problem is None, problem


def test_the_driver_version_is_readable_beside_cann(npu_versions: NpuVersions) -> None:
    """vllm-ascend names no HDK number (its guide defers to the CANN release notes), so the
    minimum is the runner's to declare (``--harness-require driver>=VERSION``); what is
    checked here is that the driver version can be read at all: the IPC decision and the
    manifest need it, and a container without the driver's files cannot show it."""
    if not npu_versions.cann_version:
        pytest.skip(f"CANN is not detected on this runner ({_tried(npu_versions, 'cann')}): "
                    "no Ascend stack whose driver to read")
    assert npu_versions.driver_version, (
        f"CANN {npu_versions.cann_version} is installed but the driver (HDK) version cannot be "
        f"read ({_tried(npu_versions, 'driver')}): mount /usr/local/Ascend/driver/version.info "
        "and npu-smi into the container (as vllm-ascend's install guide does), or set "
        "HARNESS_ASCEND_ROOT to the Ascend install that holds driver/version.info")


def _tried(npu: NpuVersions, what: str) -> str:
    """The sources that failed for ``what`` (cann / driver), for the skip or failure text."""
    words = {"cann": ("ascend_toolkit_install", "cann"), "driver": ("npu-smi", "version.info",
                                                                    "driver")}[what]
    failed = [e for e in npu.errors if any(w in e.lower() for w in words)]
    return "tried: " + "; ".join(failed) if failed else "no source tried"
