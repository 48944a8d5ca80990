"""The pytest-level contract of the plugin, seen from real pytest sessions (pytester)."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import needs_torch
from tests.process_checks import PYTEST_AT_A_TERMINAL, assert_gone


@pytest.mark.parametrize("isolation", ["spawn", "forkserver"])
def test_outcomes_map_one_to_one(pytester: pytest.Pytester, isolation: str) -> None:
    pytester.makepyfile(
        """
        import os, signal, pytest

        def test_value(run_on_npu):
            assert run_on_npu(lambda: 6 * 7).value == 42

        def test_skip(run_on_npu):
            run_on_npu(lambda: pytest.skip("skipped in the child"))

        def test_xfail(run_on_npu):
            run_on_npu(lambda: pytest.xfail("xfailed in the child"))

        def test_fail(run_on_npu):
            run_on_npu(lambda: pytest.fail("failed in the child"))

        def check_in_child():
            value = 1 + 1
            assert value == 3, "child arithmetic"

        def test_assert(run_on_npu):
            run_on_npu(check_in_child)

        def test_crash(run_on_npu):
            run_on_npu(lambda: os.kill(os.getpid(), signal.SIGSEGV))
        """
    )
    result = pytester.runpytest("-rA", "--isolation", isolation)
    result.assert_outcomes(passed=1, skipped=1, xfailed=1, failed=3)
    out = result.stdout.str()
    result.stdout.fnmatch_lines(["SKIPPED [[]1[]] test_outcomes_map_one_to_one*.py:*: skipped in the child"])
    result.stdout.fnmatch_lines([
        "XFAIL test_outcomes_map_one_to_one*.py::test_xfail - *xfailed in the child",
        "FAILED test_outcomes_map_one_to_one*.py::test_fail - Failed: failed in the child",
    ], consecutive=False)
    # the child's traceback, with the assertion rewritten by pytest, is in the failure output
    assert "traceback in isolated child" in out
    assert "AssertionError: child arithmetic" in out
    assert "assert 2 == 3" in out
    assert "isolated child killed by SIGSEGV" in out


def test_canary_a_failing_child_fails_its_test(pytester: pytest.Pytester) -> None:
    """If the harness ever stops running the child's function, this canary turns green."""
    pytester.makepyfile(
        """
        def always_fails():
            raise AssertionError("the canary ran and failed")

        def test_canary(run_on_npu):
            run_on_npu(always_fails)
        """
    )
    result = pytester.runpytest()
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*AssertionError: the canary ran and failed*"])


def test_child_output_is_a_report_section_and_property(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        import sys
        def talk():
            print("hello from the child")
            print("warning from the child", file=sys.stderr)
            assert False, "show sections"

        def test_sections(run_on_npu):
            run_on_npu(talk)
        """
    )
    result = pytester.runpytest("--junitxml=out.xml")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "*- Captured isolated child #1 (pid *, *) stdout call -*",
        "hello from the child",
        "*- Captured isolated child #1 (pid *, *) stderr call -*",
        "warning from the child",
    ])
    xml = (pytester.path / "out.xml").read_text()
    assert '<property name="isolation" value="raised AssertionError"' in xml


@needs_torch
def test_markers_and_strict_markers(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        import pytest, time, harness

        @pytest.mark.npu
        def test_needs_npu():
            raise AssertionError("must not run without an NPU")

        @pytest.mark.device("cuda", "npu")
        def test_accelerator_only():
            raise AssertionError("must not run on cpu")

        @pytest.mark.device("cpu")
        def test_cpu_device_in_child(run_on_npu):
            assert run_on_npu(lambda: str(harness.device())).value == "cpu"

        @pytest.mark.isolation_timeout(2)
        def test_marker_timeout(run_on_npu):
            run_on_npu(time.sleep, 600)
        """
    )
    result = pytester.runpytest("--strict-markers", "--device", "cpu", "-rA")
    result.assert_outcomes(passed=1, skipped=2, failed=1)
    out = result.stdout.str()
    assert "needs a real NPU: " in out
    assert "runs only on cuda, npu; the session device is cpu (--device cpu)" in out
    assert "still running after 2 s" in out


def test_npu_skip_names_the_missing_package(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        import pytest
        @pytest.mark.npu
        def test_needs_npu():
            pass
        """
    )
    result = pytester.runpytest("-rs")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["*needs a real NPU: torch_npu is not installed*"])


@needs_torch
def test_header_names_device_and_versions(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("def test_x(): pass")
    result = pytester.runpytest()
    result.stdout.fnmatch_lines([
        "npu-regress: device=cpu x1 (auto: torch_npu is not installed; no CUDA device); "
        "torch=2.*; torch_npu=absent; isolation=auto, timeout 180 s"
    ])


def test_isolation_timeout_ini_and_option(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\nharness_isolation_timeout = 42\n")
    pytester.makepyfile("def test_x(): pass")
    pytester.runpytest().stdout.fnmatch_lines(["*timeout 42 s*"])
    pytester.runpytest("--isolation-timeout", "7").stdout.fnmatch_lines(["*timeout 7 s*"])


def test_bad_device_is_a_usage_error(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("def test_x(): pass")
    result = pytester.runpytest("--device", "npu")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--device npu was requested but torch_npu is not installed*"])


def test_xdist_workers_pin_children_to_devices(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        import os, pytest

        @pytest.mark.parametrize("i", range(4))
        def test_pinned(run_on_npu, i):
            worker = int(os.environ["PYTEST_XDIST_WORKER"][2:])
            seen = run_on_npu(lambda: os.environ.get("CUDA_VISIBLE_DEVICES")).value
            assert seen == str(worker % 2)
        """
    )
    result = pytester.runpytest("-n", "2", "--device", "cuda", "--device-count", "2")
    result.assert_outcomes(passed=4)


def test_empty_suite_is_not_an_error_of_ours(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest()
    assert result.ret == pytest.ExitCode.NO_TESTS_COLLECTED


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_interrupted_pytest_ends_running_children(tmp_path: Path, sig: signal.Signals) -> None:
    """Ctrl-C or SIGTERM to pytest while a child (with a grandchild) runs leaves nothing."""
    pidfile = tmp_path / "pids"
    (tmp_path / "test_long.py").write_text(
        "import os, subprocess, sys, time\n"
        "def long_child(pidfile):\n"
        "    p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
        "    open(pidfile, 'w').write(f'{os.getpid()} {p.pid}')\n"
        "    time.sleep(600)\n"
        "def test_long(run_on_npu):\n"
        f"    run_on_npu(long_child, {str(pidfile)!r})\n"
    )
    proc = subprocess.Popen(
        [*PYTEST_AT_A_TERMINAL, "-p", "no:cacheprovider", str(tmp_path / "test_long.py")],
        cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        for _ in range(600):  # bounded wait for the child to report its pids
            if pidfile.exists() and len(pidfile.read_text().split()) == 2:
                break
            time.sleep(0.1)
        pids = [int(p) for p in pidfile.read_text().split()]
        os.kill(proc.pid, sig)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert_gone(pids)


#: a forkserver without torch: what these tests kill and replace is the server, whatever
#: it holds (each start would otherwise import torch again)
LIGHT_SERVER = ("--isolation-preload", "pytest,harness")

KILLS_ITS_FORKSERVER = """
import os, signal, time

def kill_my_forkserver():
    os.kill(os.getppid(), signal.SIGKILL)  # a forked child's parent is the forkserver
    time.sleep(60)

def test_a_kills(run_on_npu):
    run_on_npu(kill_my_forkserver)

def test_b_{second}(run_on_npu):
    {body}

def test_c_after(run_on_npu):
    assert run_on_npu(int, "3").value == 3
"""


@pytest.mark.parametrize("method", ["auto", "forkserver"])
def test_a_dead_forkserver_is_named_and_replaced(pytester: pytest.Pytester, method: str) -> None:
    """kill -9 of the forkserver mid-session: the test in flight fails naming it, the next
    test gets a new server (one warning), and the session goes on."""
    pytester.makepyfile(KILLS_ITS_FORKSERVER.format(
        second="passes", body='assert run_on_npu(int, "2").value == 2'))
    result = pytester.runpytest("--isolation", method, "-p", "no:cacheprovider", "-W",
                                "default", *LIGHT_SERVER)
    result.assert_outcomes(failed=1, passed=2)
    result.stdout.fnmatch_lines([
        "*ChildError*the forkserver that started this child died while it ran (pid *, "
        "killed by SIGKILL); the child was ended with it*",
        "*HarnessWarning: the forkserver died (pid *, killed by SIGKILL); started a new one "
        "(pid *)*"])


@pytest.mark.parametrize("method", ["auto", "forkserver"])
def test_a_replacement_that_dies_too(pytester: pytest.Pytester, method: str) -> None:
    """auto goes on with spawn, saying so; an explicit forkserver fails each later test
    with the reason."""
    pytester.makepyfile(KILLS_ITS_FORKSERVER.format(
        second="kills_again", body="run_on_npu(kill_my_forkserver)"))
    result = pytester.runpytest("--isolation", method, "-p", "no:cacheprovider", "-W",
                                "default", *LIGHT_SERVER)
    if method == "auto":
        result.assert_outcomes(failed=2, passed=1)
        result.stdout.fnmatch_lines(["*HarnessWarning: the forkserver died (pid *), and its "
                                     "replacement too (pid *): isolating with spawn from now "
                                     "on*"])
    else:
        result.assert_outcomes(failed=3)
        result.stdout.fnmatch_lines(["*ForkServerUnavailable: the forkserver died (pid *, "
                                     "killed by SIGKILL), and its replacement too (pid *, "
                                     "killed by SIGKILL)*"])
