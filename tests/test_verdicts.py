"""A verdict is never greener than what happened: a child that wrote its result and then
died fails the check, through every entry point; a device error that surfaces at the next
synchronisation fails the check that caused it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from harness import ChildCrashed, ChildError, run_isolated


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
    # (test_whole only isolated: in-process it would patch this very process's os._exit)
    result = pytester.runpytest("-p", "no:cacheprovider", "--harness-results=r.jsonl", "-rf",
                                "-k", "through_run_on_npu")
    result.assert_outcomes(failed=1)
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


KILL_BETWEEN_CHECKS = """
import os, signal
import psutil

def test_server_killed_between_checks(run_on_npu):
    server = psutil.Process(run_on_npu(os.getppid).value)  # the server started that child
    assert "harness.isolation.server import serve" in " ".join(server.cmdline())
    server.send_signal(signal.SIGKILL)  # an OOM killer, a stray kill: between two checks
    res = run_on_npu(int, "2")
    assert res.value == 2
    assert any("replaced" in note and str(server.pid) in note for note in res.notes), res.notes
"""


@pytest.mark.parametrize("isolation", ["forkserver", "spawn"])
def test_a_server_that_died_between_checks_is_replaced_before_the_next(
        pytester: pytest.Pytester, isolation: str) -> None:
    pytester.makepyfile(test_between=KILL_BETWEEN_CHECKS)
    result = pytester.runpytest("-p", "no:cacheprovider", "--isolation", isolation, "-rA",
                                "-W", "default")
    result.assert_outcomes(passed=1)
    assert "ConnectionResetError" not in result.stdout.str()


def _workdirs_with(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    """Each work folder gets ``name`` as a link to /dev/full, where every write fails with
    ENOSPC, as on a full disk."""
    from harness.isolation import workdirs

    real_make = workdirs.make

    def make(kind: str) -> Path:
        folder = real_make(kind)
        if kind == "run":
            (folder / name).symlink_to("/dev/full")
        return folder

    monkeypatch.setattr(workdirs, "make", make)


@pytest.mark.parametrize("where", ["payload.pkl", "result.pkl.tmp"])
def test_a_full_disk_is_named_with_the_path_and_the_free_space(
        monkeypatch: pytest.MonkeyPatch, method: str, where: str) -> None:
    _workdirs_with(monkeypatch, where)
    with pytest.raises(ChildError) as info:
        run_isolated(int, "1", method=method)
    text = str(info.value)
    assert "no space left on device (ENOSPC) writing /" in text
    assert "npu-regress-run-" in text and "bytes free of" in text and "TMPDIR" in text
    if where == "result.pkl.tmp":
        assert text.startswith("the isolated child could not write its work folder")


FILLS_THE_DISK = """
import contextlib, os, tempfile

def test_one(run_on_npu):
    assert run_on_npu(int, "1").value == 1

def test_two_after_the_disk_filled(run_on_npu):
    # the night goes on while the disk fills up (tempfile chose TMPDIR while it had room)
    assert tempfile.gettempdir() == os.environ["TMPDIR"]
    for n, size in enumerate((65536, 4096, 1)):
        with open(os.path.join(os.environ["TMPDIR"], f"filler{n}"), "wb", buffering=0) as fh, \\
                contextlib.suppress(OSError):
            while True:
                fh.write(b"0" * size)
    assert run_on_npu(int, "2").value == 2
"""


@pytest.mark.parametrize("isolation", ["spawn", "forkserver"])
def test_a_full_tmpdir_filesystem_fails_the_check_naming_it(
        pytester: pytest.Pytester, isolation: str) -> None:
    """A real full filesystem: TMPDIR on a 1 MiB tmpfs, filled to the last byte mid-run."""
    # short: the forkserver's socket lives under TMPDIR, and AF_UNIX paths are 107 bytes
    mount = Path(tempfile.mkdtemp(prefix="npr-full-", dir="/tmp"))
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)],
                          capture_output=True, check=False)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    try:
        pytester.makepyfile(test_disk=FILLS_THE_DISK)
        env = {**os.environ, "TMPDIR": str(mount)}
        proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider",
                               "--isolation", isolation, "-rf", "test_disk.py"],
                              cwd=pytester.path, env=env, capture_output=True, text=True,
                              timeout=300, check=False)
        out = proc.stdout + proc.stderr
        assert proc.returncode == 1, out
        assert "1 failed, 1 passed" in out, out
        assert "no space left on device (ENOSPC) writing " + str(mount) in out, out
        assert "0 bytes free of 1048576" in out, out
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)
        mount.rmdir()


def test_a_failure_s_whole_statement_is_kept_in_the_results(pytester: pytest.Pytester) -> None:
    """The bisect's signature reads every problem line as the check stated it, including a
    ``pytrace=False`` message of several bullets, in the parent and under ``--isolate-all``
    (the text alone would keep one line)."""
    pytester.makepyfile(test_statement="""
        import pytest

        def test_rows():
            pytest.fail("rows differ:\\n- the decode rows differ\\n- first divergent op: none "
                        "found", pytrace=False)
    """)
    for extra in ((), ("--isolate-all",)):
        pytester.runpytest("-p", "no:cacheprovider", "--harness-results=r.jsonl", *extra)
        [record] = [json.loads(line) for line in (pytester.path / "r.jsonl").read_text()
                    .splitlines() if '"type": "test"' in line]
        assert record["problems"] == ["the decode rows differ",
                                      "first divergent op: none found"], (extra, record)


def test_the_readme_lists_the_categories_the_results_file_holds() -> None:
    """One list: the README's, the schema's, and every category the harness sets."""
    import re

    from harness.report.schema import CATEGORIES

    readme = " ".join((Path(__file__).parent.parent / "README.md").read_text().split())
    listed = readme.split("A failure's `category` is one of: ", 1)[1].split(" (no category", 1)[0]
    assert tuple(re.findall(r"`([a-z-]+)`", listed)) == CATEGORIES
    import inspect

    from harness.plugin import results, verdicts

    code = inspect.getsource(verdicts)
    set_here = set(re.findall(r'_set\(report, "([a-z-]+)"', code)) | set(
        re.findall(r'return "([a-z-]+)", ', code)) | set(
        re.findall(r'return "([a-z-]+)"', inspect.getsource(results._category)))
    assert set_here and set_here <= set(CATEGORIES), set_here - set(CATEGORIES)
    assert {"vacuous", "not-comparable", "harness", "drift-grew"} <= set_here


def test_a_vacuous_or_not_comparable_failure_is_filed_as_such(pytester: pytest.Pytester
                                                              ) -> None:
    """Never a pass and never a release finding: the results file says which."""
    pytester.makepyfile(test_unproven="""
        import pytest

        def test_two_ranks(record_property):
            record_property("vacuous", "2 gloo ranks cannot show summation order")
            pytest.fail("vacuous: 2 gloo ranks cannot show summation order", pytrace=False)

        def test_other_weights(record_property):
            record_property("logprob_report", {"not_comparable": ["another checkpoint"]})
            pytest.fail("not comparable: another checkpoint", pytrace=False)

        def test_flat(record_property):
            record_property("logprob_report", {"vacuous": "all logprobs within 1e-9"})
            pytest.fail("vacuous input", pytrace=False)
    """)
    pytester.runpytest("-p", "no:cacheprovider", "--harness-results=r.jsonl")
    records = {r["id"].split("::")[1]: r for r in map(json.loads, (
        pytester.path / "r.jsonl").read_text().splitlines()) if r["type"] == "test"}
    assert {k: r["category"] for k, r in records.items()} == {
        "test_two_ranks": "vacuous", "test_other_weights": "not-comparable",
        "test_flat": "vacuous"}
    assert records["test_other_weights"]["verdict"]["reason"] == \
        "not comparable: another checkpoint"


def test_the_category_comes_from_the_check_and_a_text_fallback_says_so(
        pytester: pytest.Pytester) -> None:
    """Issue 67: a check states its category where it decides (``file_as``), whatever its
    failure text reads: the text "drift grew" of a vacuous check is filed vacuous, and a
    vacuous check with no recorded property is still vacuous. Text matching is the fallback
    for code that is not ours (an exception raised in the harness), and says so."""
    pytester.makepyfile(test_stated="""
        import pytest
        from harness.plugin.verdicts import file_as

        def test_vacuous_stated(record_property):
            file_as(record_property, "vacuous", "vacuous: no routing near-tie in 48 tokens")
            pytest.fail("drift grew: max_ulp 9 above its bound 3", pytrace=False)

        def test_nothing_stated(record_property):
            pytest.fail("vacuous: no routing near-tie in 48 tokens", pytrace=False)

        def test_unknown_category(record_property):
            file_as(record_property, "probably-fine", "no")
    """)
    pytester.runpytest("-p", "no:cacheprovider", "--harness-results=r.jsonl")
    records = {r["id"].split("::")[1]: r for r in map(json.loads, (
        pytester.path / "r.jsonl").read_text().splitlines()) if r["type"] == "test"}
    stated = records["test_vacuous_stated"]
    assert stated["category"] == "vacuous" and stated["verdict"] == {
        "category": "vacuous", "reason": "vacuous: no routing near-tie in 48 tokens",
        "by": "check"}, stated
    # nothing stated, nothing recorded: no category is made up from the words
    assert records["test_nothing_stated"]["category"] is None
    assert "is not one of release-finding" in records["test_unknown_category"]["longrepr"]


def test_a_category_read_from_the_failure_text_says_so() -> None:
    """The fallback: an exception raised in the harness's own code, read from the text."""
    from harness.plugin.verdicts import BY_TEXT, HARNESS_DIR, Verdicts

    class Report:
        longrepr = ('Traceback (most recent call last):\n  File "'
                    f'{HARNESS_DIR / "drift" / "table.py"}", line 3, in load\n'
                    "KeyError: 'row'\n")
        user_properties: list = []

    found = Verdicts.__new__(Verdicts)
    found.stack, found._declared = {}, set()
    report = Report()
    found._file(report)  # type: ignore[arg-type]
    [(name, verdict)] = report.user_properties
    assert name == "verdict" and verdict["category"] == "harness" and verdict["by"] == BY_TEXT
