"""``run_on_npu(..., preload=...)``: a module that reads the environment at import is imported
before the fork by a server started in the child's own environment
(``harness.isolation.keyed``), one server per environment, reused; the control shows why: the
same module in the session's preload keeps the value the session's server saw, whatever the
child's ``env`` says."""

from __future__ import annotations

import pytest

PROBE = """
import os

VALUE = os.environ.get("NPU_REGRESS_PROBE")
IMPORTED_IN = os.getpid()
IMPORTER_PARENT = os.getppid()
"""

CHECKS = """
import os


def seen():
    import probe_at_import

    return probe_at_import.VALUE, probe_at_import.IMPORTED_IN, os.getpid()


def test_keyed(run_on_npu):
    got = [run_on_npu(seen, env={"NPU_REGRESS_PROBE": value},
                      preload=("probe_at_import",)).value for value in ("a", "b", "a")]
    assert [value for value, _, _ in got] == ["a", "b", "a"]
    # imported before the fork (in a server), not by the child
    assert all(imported != child for _, imported, child in got)
    # one server per environment, the first reused for the third check
    assert got[0][1] == got[2][1] != got[1][1]
    # each forked from the session's server (which holds the session's preload), not a
    # fresh interpreter that imports it all again: a plain check's parent is that server
    session_server = run_on_npu(os.getppid).value
    probe = lambda: (lambda m: (m.IMPORTED_IN, m.IMPORTER_PARENT))(  # noqa: E731
        __import__("probe_at_import"))
    branches = [run_on_npu(probe, env={"NPU_REGRESS_PROBE": value},
                           preload=("probe_at_import",)).value for value in ("a", "b")]
    assert {parent for _, parent in branches} == {session_server}, (branches, session_server)
    # and a plain check's end (the session's server then ends what its children left)
    # left the branches and theirs alone: "a"'s server is the one of the first check
    assert branches[0][0] == got[0][1], (branches, got)


def test_session_preload(run_on_npu):
    value, imported, child = run_on_npu(seen, env={"NPU_REGRESS_PROBE": "b"}).value
    assert imported != child
    print(f"SESSION-PRELOAD-SAW {value!r}")
"""


def test_a_module_read_at_import_sees_the_child_s_environment(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    pytester.makepyfile(probe_at_import=PROBE, test_checks=CHECKS)
    # the servers' path: where the probe module is (a fresh interpreter each)
    monkeypatch.setenv("PYTHONPATH", str(pytester.path))
    monkeypatch.delenv("NPU_REGRESS_PROBE", raising=False)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-s", "-k", "test_keyed",
                                           "-W", "error::harness.plugin.session.HarnessWarning")
    result.assert_outcomes(passed=1)


def test_the_control_the_session_preload_keeps_the_session_s_value(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    pytester.makepyfile(probe_at_import=PROBE, test_checks=CHECKS)
    monkeypatch.setenv("PYTHONPATH", str(pytester.path))
    monkeypatch.delenv("NPU_REGRESS_PROBE", raising=False)
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "-s", "-k", "test_session_preload",
        "--isolation-preload", "torch,pytest,harness,probe_at_import")
    result.assert_outcomes(passed=1)
    # the child asked for "b"; the module had read the session's (unset) value
    result.stdout.fnmatch_lines(["*SESSION-PRELOAD-SAW None*"])
