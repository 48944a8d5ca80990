"""A verdict is never greener than what happened: a child that wrote its result and then
died fails the check, through every entry point; a device error that surfaces at the next
synchronisation fails the check that caused it."""

from __future__ import annotations

import signal

import pytest

from harness import ChildCrashed, run_isolated


@pytest.fixture(params=["spawn", "forkserver"])
def method(request: pytest.FixtureRequest) -> str:
    return request.param


def return_then_die(how: str) -> int:
    """Return 42; the child's last act (``os._exit`` after the result is written) then
    dies the way ``how`` says, as a device runtime that faults in teardown would."""
    import os
    import signal

    real_exit = os._exit

    def dying_exit(code: int) -> None:
        if how == "exit3":
            real_exit(3)
        os.kill(os.getpid(), getattr(signal, how))

    os._exit = dying_exit
    return 42


@pytest.mark.parametrize(("how", "words"), [
    ("SIGSEGV", "returned a result, then was killed by SIGSEGV during exit"),
    ("SIGABRT", "returned a result, then was killed by SIGABRT during exit"),
    ("exit3", "returned a result, then exited with code 3 during exit"),
])
def test_a_crash_after_the_result_fails_and_keeps_the_result(method: str, how: str,
                                                            words: str) -> None:
    with pytest.raises(ChildCrashed) as info:
        run_isolated(return_then_die, how, method=method)
    assert words in str(info.value)
    res = info.value.result
    assert res.outcome == "crashed"
    assert res.value == 42  # the result stays readable
    if how != "exit3":
        assert res.signal == getattr(signal, how)
        assert "Fatal Python error" in res.stack or "Current thread" in res.stack


def skip_then_die() -> None:
    import os
    import signal

    import pytest

    os._exit = lambda code: os.kill(os.getpid(), signal.SIGSEGV)
    pytest.skip("nothing to check here")


def test_a_skip_followed_by_a_crash_is_a_crash_not_a_skip() -> None:
    with pytest.raises(ChildCrashed, match=r"skipped \(nothing to check here\), then was "
                                           r"killed by SIGSEGV during exit"):
        run_isolated(skip_then_die)


def raise_then_die() -> None:
    import os
    import signal

    os._exit = lambda code: os.kill(os.getpid(), signal.SIGSEGV)
    raise ValueError("bad value")


def test_a_failure_followed_by_a_crash_stays_that_failure_and_says_so() -> None:
    with pytest.raises(ValueError, match="bad value") as info:
        run_isolated(raise_then_die)
    assert any("killed by SIGSEGV during exit" in n for n in info.value.__notes__)


def late_device_error() -> int:
    """A kernel whose error surfaces at the next synchronisation (stood in for on CPU: the
    CUDA runtime says it is initialised and its synchronize raises, as it does after an
    illegal memory access)."""
    import torch

    def synchronize() -> None:
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    torch.cuda.is_initialized = lambda: True
    torch.cuda.synchronize = synchronize
    return 1


def test_a_late_device_error_fails_the_check_that_caused_it(method: str) -> None:
    with pytest.raises(RuntimeError, match="illegal memory access"):
        run_isolated(late_device_error, method=method)


POST_RESULT = """
import os, signal

def return_then_segv():
    os._exit = lambda code: os.kill(os.getpid(), signal.SIGSEGV)
    return 42

def test_through_run_on_npu(run_on_npu):
    assert run_on_npu(return_then_segv).value == 42

def test_whole(request):
    os._exit = lambda code: os.kill(os.getpid(), signal.SIGSEGV)
"""


def test_a_crash_after_the_result_fails_through_pytest(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_post=POST_RESULT.replace("(request)", "()"))
    result = pytester.runpytest("-p", "no:cacheprovider", "--harness-results=r.jsonl", "-rf")
    result.assert_outcomes(failed=1, passed=1)  # test_whole runs in-process: it never exits
    result.stdout.fnmatch_lines(["*returned a result, then was killed by SIGSEGV during exit*"])
    result = pytester.runpytest("-p", "no:cacheprovider", "--isolate-all",
                                "--harness-results=r.jsonl", "-rf")
    result.assert_outcomes(failed=2)
    result.stdout.fnmatch_lines([
        "*FAILED test_post.py::test_through_run_on_npu*",
        "*FAILED test_post.py::test_whole*"])
    assert result.stdout.str().count("returned a result, then was killed by SIGSEGV") >= 2
    text = (pytester.path / "r.jsonl").read_text()
    assert '"outcome": "failed"' in text and "passed" not in text.split('"counts"')[1]
