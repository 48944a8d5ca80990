"""The preflight checks can fail: each is shown catching a broken stack."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from harness import run_isolated
from harness.hardware import preflight
from harness.stack.devices import has_module

#: these runs expect what a machine without an Ascend stack shows (a real torch_npu or
#: npu-smi answers before a stand-in install's version files)
WITHOUT_ASCEND = pytest.mark.skipif(
    has_module("torch_npu") or shutil.which("npu-smi") is not None,
    reason="a real Ascend stack is present: these runs expect a machine without one")


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
    from harness.invariance import standin

    standin.install()  # a CPU-backed ops package registering four batch-invariant ops
    return preflight.unregistered(ops)


def test_an_op_the_package_does_not_register_is_named() -> None:
    ops = ["npu_mm_batch_invariant", "npu_matmul_batch_invariant",
           "npu_softmax_batch_invariant"]  # the last: no package registers it
    missing = run_isolated(_unregistered_with_the_stand_in, ops, method="spawn").value
    assert missing == ["npu_softmax_batch_invariant"]


@WITHOUT_ASCEND
def test_the_preflight_suite_skips_on_cpu_and_fails_when_required(
        pytester: pytest.Pytester) -> None:
    suite = Path(__file__).parent.parent / "suites" / "test_stack_preflight.py"
    pytester.makepyfile(test_preflight=suite.read_text())
    plain = pytester.runpytest("--harness-results=")
    plain.assert_outcomes(passed=1, skipped=4)  # the pairing is checked on every runner
    required = pytester.runpytest("--harness-results=", "--harness-require",
                                  "torch_npu,batch_invariant_ops,cann")
    required.assert_outcomes(passed=1, failed=4)
    required.stdout.fnmatch_lines(["*required capability 'torch_npu' is missing*"])


def test_a_cann_older_than_the_release_names_it_and_the_fix() -> None:
    assert preflight.cann_problem("9.1.0", "0.23.0.post1", "9.1.0", "m") is None
    assert preflight.cann_problem("9.2.0", "0.23.0.post1", "9.1.0", "m") is None
    problem = preflight.cann_problem("8.5.0", "0.23.0.post1", "9.1.0", "the matrix")
    assert problem is not None and problem.startswith(
        "CANN 8.5.0 is older than 9.1.0, the CANN vllm-ascend 0.23.0.post1 is released for "
        "(read from the matrix): install CANN 9.1.0")
    assert "or vllm-ascend 0.15.0rc1 (released for CANN 8.5.0)" in problem
    assert "8.3.RC2" not in str(preflight.cann_problem("8.3.RC2", "0.11.0", "8.3.RC2", "m"))
    assert "older than 8.3.RC2" in str(preflight.cann_problem("8.3.RC1", "0.11.0", "8.3.RC2",
                                                              "m"))
    assert "cannot compare" in str(preflight.cann_problem("banana", "0.23.0", "9.1.0", "m"))


@pytest.mark.skipif(preflight.installed_matrix() is None,
                    reason="vllm-ascend's compatibility matrix is not installed beside it "
                           "(bash ci/setup.sh --upstream unpacks it)")
def test_the_built_in_cann_table_agrees_with_vllm_ascends_own_matrix() -> None:
    matrix = preflight.installed_matrix()
    assert matrix is not None
    rows = preflight.parse_matrix(matrix.read_text())
    assert rows["0.23.0.post1"] == "9.1.0" and len(rows) > 30
    assert {r: c for r, c in preflight.STATED_CANN.items() if rows.get(r) != c} == {}
    assert preflight.stated_cann("v0.23.0.post1", matrix) == ("9.1.0", str(matrix))
    assert preflight.stated_cann("0.19.1rc1")[0] == "8.5.1"  # type: ignore[index]
    assert preflight.stated_cann("0.99.0", matrix) is None


def _ascend_root(root: Path, cann: str, driver: str | None) -> Path:
    """A stand-in Ascend install: the CANN and driver version files only."""
    import platform

    info = root / "ascend-toolkit" / "latest" / f"{platform.machine()}-linux"
    info.mkdir(parents=True)
    (info / "ascend_toolkit_install.info").write_text(f"package_name=Ascend-cann-toolkit\n"
                                                       f"version={cann}\n")
    if driver:
        (root / "driver").mkdir()
        (root / "driver" / "version.info").write_text(f"Version={driver}\n")
    return root


@pytest.mark.skipif(not has_module("vllm_ascend"), reason="the upstream set is not installed")
@WITHOUT_ASCEND
def test_an_old_cann_and_an_unreadable_driver_fail_the_preflight(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    suite = Path(__file__).parent.parent / "suites" / "test_stack_preflight.py"
    pytester.makepyfile(test_preflight=suite.read_text())
    only = ["-k", "cann or driver", "--harness-results="]
    monkeypatch.delenv("ASCEND_HOME_PATH", raising=False)
    monkeypatch.setenv("HARNESS_ASCEND_ROOT", str(_ascend_root(pytester.path / "old",
                                                               "8.5.0", None)))
    broken = pytester.runpytest(*only)
    broken.assert_outcomes(failed=2)
    broken.stdout.fnmatch_lines([
        "*CANN 8.5.0 is older than 9.1.0, the CANN vllm-ascend 0.23.0.post1 is released for*",
        "*driver (HDK) version cannot be read*mount /usr/local/Ascend/driver/version.info*"])
    monkeypatch.setenv("HARNESS_ASCEND_ROOT", str(_ascend_root(pytester.path / "good",
                                                               "9.1.0", "25.5.rc1")))
    pytester.runpytest(*only).assert_outcomes(passed=2)
