"""Device detection and per-worker pinning, with fake torch_npu installs (no NPU here)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from harness.stack.devices import DeviceError, detect, pinning_env, worker_index


def fake_torch_npu(root: Path, body: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Install a fake torch_npu (module + dist-info) visible here and in the probe subprocess."""
    pkg = root / "torch_npu"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(body)
    meta = root / "torch_npu-2.13.0.dist-info"
    meta.mkdir()
    (meta / "METADATA").write_text("Metadata-Version: 2.1\nName: torch_npu\nVersion: 2.13.0\n")
    monkeypatch.syspath_prepend(str(root))
    monkeypatch.setenv("PYTHONPATH", str(root))
    sys.modules.pop("torch_npu", None)


def test_cpu_build_without_torch_npu_is_cpu() -> None:
    info = detect("auto")
    assert (info.kind, info.count) == ("cpu", 1)
    assert info.npu_missing == "torch_npu is not installed"
    assert info.torch_npu_version is None


def test_fake_npus_are_detected_in_a_probe(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_torch_npu(tmp_path, "class npu:\n    device_count = staticmethod(lambda: 8)\n", monkeypatch)
    info = detect("auto")
    assert (info.kind, info.count, info.npu_missing) == ("npu", 8, None)
    assert info.torch_npu_version == "2.13.0"
    assert "torch_npu=2.13.0" in info.header()


def test_torch_npu_with_no_device_falls_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_torch_npu(tmp_path, "class npu:\n    device_count = staticmethod(lambda: 0)\n", monkeypatch)
    info = detect("auto")
    assert info.kind == "cpu"
    assert info.npu_missing == "torch_npu is installed but reports no NPU"
    with pytest.raises(DeviceError, match="--device npu was requested but torch_npu is installed"):
        detect("npu")


def test_broken_torch_npu_is_an_error_not_a_cpu_run(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    fake_torch_npu(tmp_path, "raise ImportError('libascendcl.so: cannot open shared object')\n",
                   monkeypatch)
    with pytest.raises(DeviceError, match="torch_npu is installed but failed to import: "
                                          "ImportError: libascendcl.so"):
        detect("auto")


def test_explicit_cpu_never_probes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("harness.stack.devices.probe", lambda: pytest.fail("probed"))
    info = detect("cpu")
    assert info.kind == "cpu"
    assert info.npu_missing == "torch_npu is not installed"


def test_count_override_skips_the_probe(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("harness.stack.devices.probe", lambda: pytest.fail("probed"))
    info = detect("cuda", count_override=4)
    assert (info.kind, info.count) == ("cuda", 4)
    assert info.npu_missing == "torch_npu is not installed"
    assert info.reason == "--device cuda; --device-count 4"


@pytest.mark.parametrize(
    "kind, count, worker, environ, expected",
    [
        ("npu", 2, "gw3", {}, {"ASCEND_RT_VISIBLE_DEVICES": "1"}),
        ("cuda", 4, "gw5", {}, {"CUDA_VISIBLE_DEVICES": "1"}),
        ("npu", 2, "gw1", {"ASCEND_RT_VISIBLE_DEVICES": "4,6"}, {"ASCEND_RT_VISIBLE_DEVICES": "6"}),
        ("npu", 1, "gw1", {}, {}),
        ("npu", 8, None, {}, {}),
        ("cpu", 8, "gw1", {}, {}),
    ],
)
def test_pinning(kind: str, count: int, worker: str | None, environ: dict[str, str],
                 expected: dict[str, str]) -> None:
    assert pinning_env(kind, count, worker, environ) == expected


def test_worker_index() -> None:
    assert worker_index("gw12") == 12
    assert worker_index("master") is None
    assert worker_index(None) is None


def test_thread_budget_under_xdist() -> None:
    import os

    from harness.stack.devices import thread_budget_env

    cpus = len(os.sched_getaffinity(0))
    assert thread_budget_env({}) == {}
    assert thread_budget_env({"PYTEST_XDIST_WORKER_COUNT": "1"}) == {}
    share = str(max(1, cpus // 2))
    assert thread_budget_env({"PYTEST_XDIST_WORKER_COUNT": "2"}) == {
        "HARNESS_TORCH_THREADS": share, "OMP_NUM_THREADS": share}
    assert thread_budget_env({"PYTEST_XDIST_WORKER_COUNT": "2", "OMP_NUM_THREADS": "3"}) == {
        "HARNESS_TORCH_THREADS": "3", "OMP_NUM_THREADS": "3"}


def test_forkserver_children_take_their_thread_share(pytester: pytest.Pytester) -> None:
    import os

    share = int(os.environ.get("OMP_NUM_THREADS") or max(1, len(os.sched_getaffinity(0)) // 2))
    pytester.makepyfile(
        f"""
        def threads():
            import torch
            return torch.get_num_threads()

        def test_share(run_on_npu):
            assert run_on_npu(threads).value == {share}
        """
    )
    pytester.runpytest("-n", "2", "--isolation", "forkserver").assert_outcomes(passed=1)
