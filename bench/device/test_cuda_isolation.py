"""Isolation on a real CUDA device (issue 48): the paths a CPU runner never executes.

Each test needs a CUDA device; without one (the script's dry mode, CI) each skips, naming
that it needs one. Run by ``bench/device/cuda_check.sh``."""

from __future__ import annotations

import os
import signal

import psutil
import pytest

import harness

torch = pytest.importorskip("torch")
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason="needs a CUDA device (bench/device/cuda_check.sh)")
pytestmark = needs_cuda


def _matmul_on_cuda(n: int) -> dict[str, object]:
    import torch

    g = torch.Generator().manual_seed(0)
    a = torch.randn(n, n, generator=g)
    b = torch.randn(n, n, generator=g)
    got = (a.cuda() @ b.cuda()).cpu()
    return {"device": torch.cuda.get_device_name(0), "pid": os.getpid(),
            "max_abs_diff": float((got - a @ b).abs().max()),
            "initialised": torch.cuda.is_initialized()}


@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_a_child_computes_on_cuda_and_its_value_comes_back(method: str) -> None:
    value = harness.run_isolated(_matmul_on_cuda, 256, method=method, timeout=120).value
    assert value["pid"] != os.getpid()
    assert value["initialised"] is True
    assert value["max_abs_diff"] < 1e-2  # TF32 may be on: the bits are not the question here
    print(f"{method}: {value}")


def test_the_parent_initialising_cuda_does_not_break_its_children() -> None:
    """Fork after CUDA init is unsafe: a spawn child and a forkserver child (the server
    never initialised CUDA) still work once this process has."""
    torch.zeros(1, device="cuda")
    assert torch.cuda.is_initialized()
    for method in ("spawn", "forkserver"):
        assert harness.run_isolated(_matmul_on_cuda, 64, method=method,
                                    timeout=120).value["initialised"]


def _queue_a_faulting_kernel() -> str:
    """An out-of-bounds gather: the device asserts asynchronously; nothing here waits."""
    import torch

    x = torch.zeros(4, device="cuda")
    index = torch.tensor([1 << 20], device="cuda")
    x[index]  # noqa: B018 - queued; the fault surfaces at the next synchronisation
    return "returned before the kernel's fault was seen"


def test_an_asynchronous_kernel_fault_fails_the_check_that_launched_it() -> None:
    """The child synchronises before it trusts a result: the fault is this check's failure,
    not a pass (and not a later check's)."""
    with pytest.raises((RuntimeError, harness.ChildCrashed)) as caught:
        harness.run_isolated(_queue_a_faulting_kernel, timeout=120)
    text = str(caught.value)
    assert "device-side assert" in text or "CUDA error" in text or "index" in text, text
    print(f"fault reported as {type(caught.value).__name__}: {text.splitlines()[0]}")


TOKEN = "npu-regress-device-grandchild"


def _hold_cuda_and_spawn_a_grandchild() -> None:
    import subprocess
    import sys

    import torch

    torch.zeros(1, device="cuda")
    subprocess.Popen([sys.executable, "-c", f"import time; time.sleep(600)  # {TOKEN}"])
    os.kill(os.getpid(), signal.SIGKILL)


def test_a_child_killed_while_holding_cuda_leaves_nothing_behind() -> None:
    """The grandchild, known by a token in its command line (the harness's own long-lived
    helper process is no leak: a first version of this test counted it, pid 799 on the
    H200)."""
    with pytest.raises(harness.ChildCrashed, match="SIGKILL"):
        harness.run_isolated(_hold_cuda_and_spawn_a_grandchild, timeout=120)
    left = [p.pid for p in psutil.process_iter(["cmdline"])
            if TOKEN in " ".join(p.info["cmdline"] or ())
            and p.status() != psutil.STATUS_ZOMBIE]
    assert left == []
