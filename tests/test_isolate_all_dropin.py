"""--isolate-all as a drop-in: the same failure text as plain pytest, doctests isolated,
the common fixtures of the pytest process usable, the collected modules preloaded."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

import pytest

from tests.conftest import needs_torch

FAILING = '''
import unittest
import pytest

def helper(x):
    assert x == [1, 2, 4]

def test_list():
    assert [1, 2, 3] == [1, 2, 4]

def test_nested():
    helper([1, 2, 3])

def test_dict():
    assert {"a": 1, "b": 2} == {"a": 1, "b": 3}

def test_long_text():
    assert "\\n".join(map(str, range(40))) == "\\n".join(map(str, range(1, 41)))

def test_raise():
    raise ValueError("bad value")

def test_pfail():
    pytest.fail("explicit")

class T(unittest.TestCase):
    def test_eq(self):
        self.assertEqual({"a": 1}, {"a": 2})

    def test_sub(self):
        for i in range(4):
            with self.subTest(i=i):
                self.assertLess(i, 2)

def double(x):
    """
    >>> double(3)
    7
    """
    return 2 * x
'''


def _normalised(text: str) -> str:
    """Output without timings, our header line and the plugin's per-test properties."""
    text = re.sub(r" in [0-9.]+s", " in Xs", text)
    return "\n".join(line for line in text.splitlines()
                     if not line.startswith("npu-regress: --isolate-all:")
                     and "generated xml file" not in line)


def _junit(path: str) -> dict[str, tuple[str | None, str | None]]:
    root = ET.parse(path).getroot()
    out = {}
    for case in root.iter("testcase"):
        failure = case.find("failure")
        out[case.get("name") or ""] = (None, None) if failure is None else \
            (failure.get("message"), failure.text)
    return out


@pytest.mark.parametrize("args", [(), ("--tb=short",), ("--tb=line",), ("-vv", "-l")],
                         ids=["auto", "short", "line", "vv-locals"])
def test_failures_read_exactly_as_in_process(pytester: pytest.Pytester,
                                             args: tuple[str, ...]) -> None:
    """Before: the last traceback line was harness/plugin/whole_test.py:154, the assertion
    diff was gone, unittest failures read "Failed: Traceback ...", and subtests were one
    whole-test FAILED."""
    pytester.makepyfile(test_failing=FAILING)
    base = ["-p", "no:cacheprovider", "--doctest-modules", *args]
    plain = pytester.runpytest(*base, "--junitxml=plain.xml")
    isolated = pytester.runpytest(*base, "--isolate-all", "--junitxml=isolated.xml")
    assert _normalised(isolated.stdout.str()) == _normalised(plain.stdout.str())
    out = isolated.stdout.str()
    assert "whole_test.py" not in out and "harness/" not in out
    if not args:
        assert "test_failing.py:8: AssertionError" in out  # the test's own last line
        assert "At index 2 diff: 3 != 4" in out
        if int(pytest.__version__.split(".")[0]) >= 9:  # pytest 8 has no subtest reports
            assert "SUBFAILED(i=2) test_failing.py::T::test_sub" in out
        assert "FAILED test_failing.py::T::test_eq - AssertionError: {'a': 1} != {'a': 2}" \
            in out
    assert _junit(str(pytester.path / "isolated.xml")) == \
        _junit(str(pytester.path / "plain.xml"))


def test_failures_read_the_same_under_xdist(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_failing=FAILING)
    base = ["-p", "no:cacheprovider", "-n", "2", "-p", "no:randomly"]
    plain = pytester.runpytest(*base)
    isolated = pytester.runpytest(*base, "--isolate-all")
    summary = re.compile(r"^(FAILED|SUBFAILED|ERROR)")
    assert sorted(line for line in isolated.stdout.lines if summary.match(line)) == \
        sorted(line for line in plain.stdout.lines if summary.match(line))
    assert "At index 2 diff: 3 != 4" in isolated.stdout.str()


def test_a_conftest_assertrepr_compare_hook_still_explains(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(
        "def pytest_assertrepr_compare(op, left, right):\n"
        "    if op == '==' and isinstance(left, int):\n"
        "        return ['custom explanation', f'   {left} vs {right}']\n")
    pytester.makepyfile("def test_x():\n    assert 1 == 2\n")
    result = pytester.runpytest("--isolate-all")
    result.stdout.fnmatch_lines(["*custom explanation*", "*1 vs 2*"])


DOCTESTS = '''
import os

def pid():
    """
    >>> os.getpid() != PARENT
    True
    """

def shared():
    """
    >>> SHARED["n"]
    1
    >>> 1 + 1
    3
    """
'''


def test_doctests_run_in_the_isolated_child(pytester: pytest.Pytester) -> None:
    """Before: doctests ran in the pytest process under --isolate-all, without a note."""
    pytester.makeconftest(
        "import os, pytest\n"
        "@pytest.fixture(autouse=True)\n"
        "def namespace(doctest_namespace):\n"
        "    doctest_namespace['PARENT'] = os.getpid()\n"
        "    doctest_namespace['SHARED'] = {'n': 1}\n")
    pytester.makepyfile(test_docs=DOCTESTS)
    pytester.makefile(".txt", notes=">>> import os\n>>> os.getpid() != PARENT\nTrue\n")
    plain = pytester.runpytest("--doctest-modules", "--doctest-glob=*.txt", "-p",
                               "no:cacheprovider")
    plain.assert_outcomes(passed=0, failed=3)  # in process, the pid is the parent's
    isolated = pytester.runpytest("--doctest-modules", "--doctest-glob=*.txt",
                                  "-p", "no:cacheprovider", "--isolate-all")
    isolated.assert_outcomes(passed=2, failed=1)
    isolated.stdout.fnmatch_lines(["*[[]doctest[]] test_docs.shared*", "*Expected:*", "*3*",
                                   "*Got:*", "*2*", "*test_docs.py:*: DocTestFailure"])


VIEWS = '''
import pytest

@pytest.fixture(params=["a", "b"])
def letter(request):
    return request.param

@pytest.mark.slow(level=2)
@pytest.mark.parametrize("n", [1])
def test_views(request, pytestconfig, tmp_path_factory, letter, n):
    import os
    assert os.getpid() != int(os.environ["PYTEST_PARENT_PID"])
    assert request.node.name == f"test_views[{letter}-1]"
    assert request.node.get_closest_marker("slow").kwargs == {"level": 2}
    assert request.node.callspec.params["n"] == 1
    assert "letter" in request.fixturenames
    assert request.function.__name__ == "test_views"
    assert request.config.getoption("harness_isolate_all") is True
    assert pytestconfig.getini("python_files") == ["test_*.py", "*_test.py"]
    assert pytestconfig.rootpath.is_dir()
    made = tmp_path_factory.mktemp("made")
    assert made.is_dir() and made.parent == tmp_path_factory.getbasetemp()

def test_what_cannot_cross_is_one_line(request):
    request.getfixturevalue("tmp_path")
'''


def test_request_pytestconfig_and_tmp_path_factory_work(pytester: pytest.Pytester,
                                                        monkeypatch: pytest.MonkeyPatch
                                                        ) -> None:
    """Before: each failed with "belongs to the pytest process"."""
    import os

    monkeypatch.setenv("PYTEST_PARENT_PID", str(os.getpid()))
    pytester.makepyfile(test_views=VIEWS)
    result = pytester.runpytest("--isolate-all", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=2, failed=1)
    result.stdout.fnmatch_lines([
        "*AttributeError: request.getfixturevalue('tmp_path') is not available in an "
        "isolated test: it belongs to the pytest process*"])


def test_the_server_holds_the_test_modules_and_no_torch_they_do_not_use(
        pytester: pytest.Pytester) -> None:
    """A suite that never imports torch must not wait for (or see warnings of) its import;
    its children fork from a server that already imported the test module."""
    pytester.makepyfile(
        test_mods="""
        import sys
        IMPORTS = []
        IMPORTS.append(1)

        def test_no_torch():
            assert "torch" not in sys.modules

        def test_module_was_imported_once_before_the_fork():
            assert IMPORTS == [1]
        """)
    result = pytester.runpytest("--isolate-all", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines([
        "npu-regress: --isolate-all: each test forks from an isolation server holding 1 test "
        "module(s) and 0 conftest(s); torch not loaded"])
    assert "NumPy" not in result.stdout.str() + result.stderr.str()


def test_a_module_that_makes_forking_unsafe_falls_back_and_says_why(
        pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_threads="""
        import os, threading, time
        threading.Thread(target=time.sleep, args=(30,), daemon=True).start()

        def test_runs_anyway():
            assert True
        """)
    result = pytester.runpytest("--isolate-all", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines([
        "npu-regress: --isolate-all: test modules not preloaded in the isolation server "
        "(*test_threads.py starts 1 thread(s) at import*); each isolated test imports its "
        "module in its child"])


def test_a_module_whose_import_fails_in_the_server_is_named(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_once="""
        import os
        os.close(os.open("imported-once", os.O_CREAT | os.O_EXCL))  # a second import fails

        def test_x():
            pass
        """)
    result = pytester.runpytest("--isolate-all", "-p", "no:cacheprovider")
    result.stdout.fnmatch_lines([
        "*not preloaded: 1 module(s) whose import fails there (*test_once.py: FileExistsError: "
        "*), imported by their own children"])


@needs_torch
def test_run_on_npu_tests_get_torch_in_the_server(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_mixed="""
        def check():
            import sys
            return "torch" in sys.modules

        def test_checks(run_on_npu):
            assert run_on_npu(check).value is True  # forked from a server holding torch

        def test_plain():
            pass
        """)
    result = pytester.runpytest("--isolate-all", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["npu-regress: --isolate-all: *; torch loaded"])


def test_a_crash_or_hang_is_located_at_the_test(pytester: pytest.Pytester) -> None:
    """Before: the report's location was harness/plugin/whole_test.py."""
    pytester.makepyfile(
        test_dies="""
        import os, signal, time
        import pytest

        def test_crash():
            os.kill(os.getpid(), signal.SIGSEGV)

        @pytest.mark.isolation_timeout(2)
        def test_hang():
            time.sleep(600)
        """)
    result = pytester.runpytest("--isolate-all", "-p", "no:cacheprovider", "--tb=line")
    result.assert_outcomes(failed=2)
    result.stdout.fnmatch_lines([
        "*test_dies.py:5: harness.ChildCrashed: isolated child killed by SIGSEGV*",
        "*test_dies.py:9: harness.ChildTimeout: isolated child * still running after 2 s*"])
    assert "whole_test.py" not in result.stdout.str()
