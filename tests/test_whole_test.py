"""Whole-test isolation (marker and --isolate-all) and the bad-fork guard for pytest-forked."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import needs_torch

MATRIX = """
import os, signal, sys, threading, time
import pytest

@pytest.fixture
def data():
    return {"answer": 42}

@pytest.fixture
def pytest_pid():
    return os.getpid()

def test_pass(data, tmp_path):
    (tmp_path / "f").write_text("x")
    assert data["answer"] == 42

def test_fail():
    value = 1 + 1
    assert value == 3

def test_skip():
    pytest.skip("skipped inside")

@pytest.mark.xfail(strict=True, reason="known")
def test_xfail_strict_fails_as_expected():
    assert False

@pytest.mark.xfail(strict=True, reason="known")
def test_xpass_strict():
    pass

@pytest.mark.xfail(strict=False, reason="maybe")
def test_xpass_lenient():
    pass

def test_imperative_xfail():
    pytest.xfail("not yet")

def test_crash():
    os.kill(os.getpid(), signal.SIGSEGV)

@pytest.mark.isolation_timeout(2)
def test_hang():
    time.sleep(600)

@pytest.mark.parametrize("n", [1, 2])
def test_param(n):
    assert n in (1, 2)

class TestClass:
    def setup_method(self):
        self.base = 10

    def test_method(self, data):
        assert self.base + data["answer"] == 52

def test_pid_differs(pytest_pid):
    print("child pid", os.getpid())
    assert os.getpid() != pytest_pid
"""

EXPECTED = dict(passed=5, failed=4, skipped=1, xfailed=2, xpassed=1)


def _check_matrix_output(out: str) -> None:
    assert "assert 2 == 3" in out  # the child's rewritten assertion
    assert "isolated child killed by SIGSEGV" in out
    assert "still running after 2 s" in out
    assert "[XPASS(strict)] known" in out
    assert "skipped inside" in out


def test_isolate_all_matrix(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_matrix=MATRIX)
    result = pytester.runpytest("--isolate-all", "-rA")
    result.assert_outcomes(**EXPECTED)
    _check_matrix_output(result.stdout.str())
    result.stdout.fnmatch_lines(["*Captured isolated child #1 (pid *) stdout call*",
                                 "child pid *"])


def test_marker_matrix(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_matrix="import pytest\npytestmark = pytest.mark.isolated\n" + MATRIX)
    result = pytester.runpytest("-rA")
    result.assert_outcomes(**EXPECTED)
    _check_matrix_output(result.stdout.str())


def test_matrix_under_xdist(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_matrix=MATRIX)
    result = pytester.runpytest("--isolate-all", "-n", "2")
    result.assert_outcomes(**EXPECTED)


def test_without_isolation_the_child_env_is_absent(pytester: pytest.Pytester) -> None:
    """Control: the same file unisolated runs in-process (so the marker is what isolates)."""
    pytester.makepyfile(test_matrix=MATRIX)
    result = pytester.runpytest("-k", "pid_differs")
    result.assert_outcomes(failed=1)


def test_marker_timeout_and_env(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        import os, time, pytest

        @pytest.mark.isolated(env={"ONLY_IN_CHILD": "yes"})
        def test_env():
            assert os.environ["ONLY_IN_CHILD"] == "yes"

        @pytest.mark.isolated(timeout=2)
        def test_timeout():
            time.sleep(600)

        def test_parent_env_untouched():
            assert "ONLY_IN_CHILD" not in os.environ
        """
    )
    result = pytester.runpytest()
    result.assert_outcomes(passed=2, failed=1)
    result.stdout.fnmatch_lines(["*still running after 2 s*"])


def test_unpicklable_fixture_is_named(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        import threading, pytest

        @pytest.fixture
        def lock():
            return threading.Lock()

        @pytest.mark.isolated
        def test_uses_lock(lock):
            pass
        """
    )
    result = pytester.runpytest()
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*isolated test: the value of fixture 'lock' (lock) cannot be "
                                 "sent to the child process*"])
    assert "During handling" not in result.stdout.str()  # one message, no chained internals


def test_a_unittest_class_marked_isolated_runs_in_a_child(pytester: pytest.Pytester,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: unittest.TestCase tests ran silently in the pytest process."""
    import os

    monkeypatch.setenv("PYTEST_PARENT_PID", str(os.getpid()))
    pytester.makepyfile(
        """
        import os, unittest, pytest

        @pytest.mark.isolated
        class TestMarked(unittest.TestCase):
            def test_pid(self):
                self.assertNotEqual(os.getpid(), int(os.environ["PYTEST_PARENT_PID"]))

        class TestUnmarked(unittest.TestCase):
            def test_pid(self):
                self.assertEqual(os.getpid(), int(os.environ["PYTEST_PARENT_PID"]))
        """
    )
    pytester.runpytest_inprocess().assert_outcomes(passed=2)


@pytest.mark.parametrize("fixture", ["cache"])
def test_a_fixture_of_the_pytest_process_is_one_clear_line(pytester: pytest.Pytester,
                                                          fixture: str) -> None:
    pytester.makepyfile(f"def test_x({fixture}):\n    pass\n")
    result = pytester.runpytest("--isolate-all")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        f"*isolated test: fixture {fixture!r} belongs to the pytest process and cannot be "
        "used in the isolated child; keep this test in the pytest process with "
        "@pytest.mark.isolated(False).*"])
    assert "Traceback" not in result.stdout.str() and "During handling" not in result.stdout.str()
    opted_out = pytester.makepyfile(
        f"import pytest\n@pytest.mark.isolated(False)\ndef test_x({fixture}):\n    pass\n")
    pytester.runpytest("--isolate-all", opted_out).assert_outcomes(passed=1)


@needs_torch
def test_existing_plain_file_passes_unchanged(pytester: pytest.Pytester) -> None:
    source = Path(__file__).parent / "plain" / "test_plain_checks.py"
    pytester.makepyfile(test_plain=source.read_text())
    plain = pytester.runpytest()
    isolated = pytester.runpytest("--isolate-all")
    plain.assert_outcomes(passed=8, skipped=1)
    isolated.assert_outcomes(passed=8, skipped=1)


GUARD_CONFTEST = """
def pytest_harness_accelerator_state(config):
    return "CUDA is initialised in the pytest process (simulated)"
"""
FORKED_FILE = """
import os, pytest
SETUP = []

@pytest.fixture
def device_fixture():
    SETUP.append(1)
    return "would touch the device"

def test_forked_by_option(device_fixture):
    pass

@pytest.mark.forked
def test_forked_by_marker(device_fixture):
    pass

def test_not_forked():
    assert os.getpid() == int(os.environ["PYTEST_PARENT_PID"])
"""


def test_fork_guard_fails_instead_of_forking(pytester: pytest.Pytester,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    monkeypatch.setenv("PYTEST_PARENT_PID", str(os.getpid()))
    pytester.makeconftest(GUARD_CONFTEST)
    pytester.makepyfile(test_forked=FORKED_FILE)
    result = pytester.runpytest("-k", "marker or not_forked")
    # reported as an error in setup: it fails before any fixture (device code) runs
    result.assert_outcomes(passed=1, errors=1)
    result.stdout.fnmatch_lines([
        "*not forked: CUDA is initialised in the pytest process (simulated), and a process "
        "forked from it would crash or hang*Run with --isolate-all*"])
    by_option = pytester.runpytest("--forked", "-k", "by_option")
    by_option.assert_outcomes(errors=1)
    assert "not forked: CUDA is initialised" in by_option.stdout.str()


#: pytest-forked 1.7.5 cannot carry pytest 9.2's reports (its fork marshals them, and 9.2
#: added an unmarshallable field): every forked test "EXITED with status 3", which the
#: plugin's probe turns into a named setup failure (test_broken_pytest_forked_fails_...)
forked_works = pytest.mark.skipif(
    tuple(int(x) for x in pytest.__version__.split(".")[:2]) >= (9, 2),
    reason="pytest-forked cannot run a test under pytest >= 9.2 (README: Pinned installs)")


@forked_works
def test_forked_still_works_without_a_live_device(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        import os, pytest
        PARENT = os.getpid()

        @pytest.mark.forked
        def test_runs_in_a_fork():
            assert os.getpid() != PARENT
        """
    )
    pytester.runpytest().assert_outcomes(passed=1)


BROKEN_FORKED = Path(__file__).parent / "fakes" / "broken_forked"
PROBED_FILE = """
import pytest
RAN = []

@pytest.fixture(scope="session")
def session_resource():
    yield "held"
    RAN.append("session teardown")

@pytest.mark.forked
def test_forked_one(session_resource):
    RAN.append("one")

@pytest.mark.forked
def test_forked_two():
    RAN.append("two")

def test_not_forked(session_resource):
    assert RAN == []
"""


def _with_broken_forked(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Load the fake pytest-forked (its fork exits with status 3) in place of the real one."""
    import os

    log = pytester.path / "forks.log"
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        [str(BROKEN_FORKED), *filter(None, [os.environ.get("PYTHONPATH")])]))
    monkeypatch.setenv("FAKE_FORKED_LOG", str(log))
    return log


def test_broken_pytest_forked_fails_in_setup_naming_versions_and_ways_out(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    log = _with_broken_forked(pytester, monkeypatch)
    pytester.makepyfile(test_probed=PROBED_FILE)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    # both forked tests fail in setup, before their fixtures or bodies run; the plain one passes
    result.assert_outcomes(passed=1, errors=2)
    import importlib.metadata

    forked_version = importlib.metadata.version("pytest-forked")
    below = ".".join(pytest.__version__.split(".")[:2])
    result.stdout.fnmatch_lines([
        f"*not forked: pytest-forked {forked_version} cannot run tests under pytest "
        f"{pytest.__version__}: a no-op test forked through it came back as \"*running the test "
        "EXITED with status 3\"*Two ways out: run it with --isolate-all (or mark the test "
        f"@pytest.mark.isolated)*pip install 'pytest<{below}'*"])
    assert "ERROR test_probed.py::test_forked_one - Failed: not forked: pytest-forked" in \
        result.stdout.str()
    # one probe fork for the whole session, none for the refused tests themselves
    assert log.read_text().splitlines() == ["::npu-regress-forked-probe"]
    # the first way out works as written: under --isolate-all the same tests run isolated
    isolated = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--isolate-all",
                                             "-k", "forked_one or forked_two")
    isolated.assert_outcomes(passed=2)


def test_no_forked_test_means_no_probe(pytester: pytest.Pytester,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    log = _with_broken_forked(pytester, monkeypatch)
    pytester.makepyfile(test_plain="def test_plain():\n    pass\n")
    pytester.runpytest_subprocess("-p", "no:cacheprovider").assert_outcomes(passed=1)
    assert not log.exists()


@forked_works
def test_probe_runs_no_session_fixture_teardown(pytester: pytest.Pytester) -> None:
    """With the real pytest-forked (the pinned versions): the probe's fork sets up and tears
    down only itself. A session fixture's teardown runs once in the forked test's child (as
    pytest-forked always does) and once at the end, never a third time in the probe."""
    log = pytester.path / "teardowns.log"
    pytester.makepyfile(test_probed=f"""
        import pytest

        @pytest.fixture(scope="session")
        def resource():
            yield
            with open({str(log)!r}, "a") as fh:
                fh.write("teardown\\n")

        def test_first(resource):
            pass

        @pytest.mark.forked
        def test_forked():
            pass
        """)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=2)
    assert log.read_text().splitlines() == ["teardown", "teardown"]


@needs_torch
def test_default_state_sees_a_real_cuda_flag(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    from harness.plugin.whole_test import default_accelerator_state

    assert default_accelerator_state() is None
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    assert default_accelerator_state() == "CUDA is initialised in the pytest process"
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    monkeypatch.setattr(torch.cuda, "_is_in_bad_fork", lambda: True)
    assert default_accelerator_state() == "the CUDA runtime is in a bad-fork state"


def test_tests_using_run_on_npu_are_not_wrapped(pytester: pytest.Pytester) -> None:
    """Under --isolate-all, a test whose checks already go through run_on_npu runs as it is
    (its fixture, a closure over the pytest session, could not travel anyway)."""
    pytester.makepyfile(
        """
        import os
        PARENT = os.getpid()

        def test_checks(run_on_npu):
            assert os.getpid() == PARENT
            assert run_on_npu(os.getpid).value != PARENT
        """
    )
    pytester.runpytest("--isolate-all").assert_outcomes(passed=1)
