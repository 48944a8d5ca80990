"""Hostile and broken inputs to the nightly report: each is reported and skipped, never a
crash, a hang, a write outside the history folder or a truncated earlier report."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness.cli import main as cli
from harness.report import history_folder as hist
from harness.report.compare import compare
from harness.report.load import load_results
from tests.fixtures import nights
from tests.test_report import _test, _write


def _run(tmp_path: Path, date: str | None, tests: list[dict[str, object]],
         name: str = "a3") -> Path:
    """A night of ``tests`` cut from a real one (tests/fixtures/nights.py); no ``date``: a
    header without its start time."""
    header = nights.header(name, date or "2026-11-30")
    if not date:
        del header["start"]
    return _write(tmp_path / f"{name}-{date or 'nodate'}.jsonl",
                  [header, *tests, nights.footer(exitstatus=0)])


def _render(tmp_path: Path, *inputs: Path, history: Path | None = None) -> dict[str, object]:
    out = tmp_path / "out"
    args = ["report", "render", *map(str, inputs), "--out", str(out)]
    if history is not None:
        args += ["--history", str(history)]
    assert cli(args) == 0
    return json.loads((out / "summary.json").read_text())


def test_a_line_nested_1000_deep_is_skipped_here_and_in_history(tmp_path: Path) -> None:
    deep = "[" * 1000 + "]" * 1000
    path = _run(tmp_path, "2026-11-29", [_test("t::ok", "passed")])
    path.write_text(path.read_text() + '{"type": "test", "id": "t::deep", "outcome": '
                    f'"passed", "logprob_report": {deep}}}\n')
    header_deep = {"type": "header", "runner": "a3", "start": "2026-11-29T00:00:00",
                   "manifest": json.loads("[" * 900 + "]" * 900)}
    _write(tmp_path / "h.jsonl", [nights.Unchecked(header_deep), _test("t::ok", "passed")])
    history = tmp_path / "history"
    hist.add([path, tmp_path / "h.jsonl"], history)
    tonight = _run(tmp_path, "2026-11-30", [_test("t::ok", "failed")])
    summary = _render(tmp_path, tonight, history=history)
    assert [r["test"] for r in summary["new_failures"]] == ["t::ok"]
    run = load_results(path)
    # too deep to load: kept by the id and outcome found at its start, and counted
    assert run.tests["t::deep"].outcome == "passed" and run.recovered == 1
    assert "could not be read: nested too deep to read" in run.tests["t::deep"].longrepr


def test_a_lone_surrogate_never_truncates_the_earlier_report(tmp_path: Path) -> None:
    good = _run(tmp_path, "2026-11-30", [_test("t::ok", "passed")])
    _render(tmp_path, good)
    before = (tmp_path / "out" / "report.html").read_text()
    bad = _run(tmp_path, "2026-12-01", [_test("t::s", "skipped", reason="\ud800 lone")],
               name="x")
    summary = _render(tmp_path, bad)
    after = (tmp_path / "out" / "report.html").read_text()
    assert after and after != before and "lone" in after
    assert list(summary["skipped_by_reason"]) == ["? lone"]


def test_an_input_without_a_date_takes_the_others_and_never_compares_with_itself(
        tmp_path: Path) -> None:
    history = tmp_path / "history"
    hist.add([_run(tmp_path, "2026-11-29", [_test("t::a", "passed")])], history)
    hist.add([_run(tmp_path, "2026-11-30", [_test("t::a", "failed")], name="b")], history)
    undated = tmp_path / "junit.xml"
    undated.write_text('<testsuite name="s"><testcase classname="t" name="b">'
                       '<failure message="boom"/></testcase></testsuite>')
    dated = _run(tmp_path, "2026-11-30", [_test("t::a", "failed")])
    summary = _render(tmp_path, dated, undated, history=history)
    assert summary["date"] == "2026-11-30"
    # tonight's own filed results are not "history": a new failure, not "still failing"
    assert [r["test"] for r in summary["new_failures"]] == ["t::a", "t::b"]
    assert any("no start date in" in p and "taken as 2026-11-30" in p
               for p in summary["problems"])
    alone = _render(tmp_path, undated)
    assert alone["date"] != "unknown-date" and "today, UTC" in " ".join(alone["problems"])


def test_a_duplicate_id_keeps_the_worst_outcome_and_says_so(tmp_path: Path) -> None:
    path = _run(tmp_path, "2026-11-30", [_test("t::dup", "passed"),
                                         _test("t::dup", "failed", longrepr="boom")])
    run = load_results(path)
    assert run.tests["t::dup"].outcome == "failed"
    assert any("appears again (passed, then failed); the worst is kept" in p
               for p in run.problems)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_a_fifo_and_a_link_to_dev_zero_in_history_are_refused(tmp_path: Path) -> None:
    history = tmp_path / "history"
    night = history / "2026-11-29"
    night.mkdir(parents=True)
    os.mkfifo(night / "fifo.jsonl")
    (night / "zero.jsonl").symlink_to("/dev/zero")
    tonight = _run(tmp_path, "2026-11-30", [_test("t::a", "passed")])
    proc = subprocess.run([sys.executable, "-m", "harness", "report", "render", str(tonight),
                           "--out", str(tmp_path / "out"), "--history", str(history)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "fifo.jsonl: a FIFO (named pipe), not a results file: not read" in proc.stderr
    assert "zero.jsonl: a symbolic link: not followed" in proc.stderr


def test_history_never_writes_through_a_link_and_keep_drops_linked_nights(
        tmp_path: Path) -> None:
    history, outside = tmp_path / "history", tmp_path / "outside"
    outside.mkdir()
    victim = outside / "victim.txt"
    victim.write_text("precious")
    night = history / "2026-11-30"
    night.mkdir(parents=True)
    (night / "a3.jsonl").symlink_to(victim)
    (history / "2026-11-01").symlink_to(outside, target_is_directory=True)
    messages = hist.add([_run(tmp_path, "2026-11-30", [_test("t::a", "passed")])], history,
                        keep=1)
    assert victim.read_text() == "precious" and not (night / "a3.jsonl").is_symlink()
    assert any("dropped 2026-11-01" in m for m in messages)
    assert outside.is_dir() and victim.exists()  # the link went, not what it pointed to
    (history / "2026-12-01").symlink_to(outside, target_is_directory=True)
    refused = hist.add([_run(tmp_path, "2026-12-01", [_test("t::a", "passed")])], history)
    assert "is a symbolic link" in refused[0] and not (outside / "a3.jsonl").exists()


def test_a_second_session_on_the_same_results_path_is_refused(pytester: pytest.Pytester,
                                                               tmp_path: Path) -> None:
    results = tmp_path / "results.jsonl"
    marker = tmp_path / "first-running"
    pytester.makepyfile(test_slow=f"""
import pathlib, time
def test_slow():
    pathlib.Path({str(marker)!r}).write_text("1")
    time.sleep(30)
""")
    first = subprocess.Popen([sys.executable, "-m", "pytest", "-p", "no:cacheprovider",
                              f"--harness-results={results}", "test_slow.py"],
                             cwd=pytester.path, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    try:
        for _ in range(600):  # bounded wait for the first session to hold the file
            if marker.exists() or first.poll() is not None:
                break
            time.sleep(0.1)
        second = pytester.runpytest_subprocess(f"--harness-results={results}", "test_slow.py",
                                               "-k", "nothing")
        assert second.ret == pytest.ExitCode.USAGE_ERROR
        second.stderr.fnmatch_lines([f"*--harness-results {results}: another pytest session "
                                     f"(pid {first.pid} on *) is writing this results file*"])
    finally:
        first.kill()
        first.wait()
    header = json.loads(results.read_text().splitlines()[0])
    assert header["type"] == "header"  # the first session's file is whole


def test_a_full_disk_stops_the_writing_not_the_tests(pytester: pytest.Pytester) -> None:
    results = pytester.path / "results.jsonl"
    results.symlink_to("/dev/full")  # every write fails with ENOSPC, as on a full disk
    pytester.makepyfile("def test_a():\n    pass\ndef test_b():\n    assert 0\n")
    result = pytester.runpytest_subprocess(f"--harness-results={results}", "-W", "default")
    result.assert_outcomes(passed=1, failed=1)
    assert result.ret == pytest.ExitCode.INTERNAL_ERROR
    result.stdout.fnmatch_lines(["*npu-regress: results LOST after 2 tests*No space left*"])
    # one warning, when the first write failed (the header, at session start)
    both = result.stdout.str() + result.stderr.str()
    assert both.count("writing results failed") == 1 and "ResultsLost" in both
    assert "INTERNALERROR" not in both


def test_a_read_only_out_folder_is_one_clear_error(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    if os.geteuid() == 0:
        out = Path("/proc/npu-regress-out")  # not writable even for root
    else:
        out = tmp_path / "ro"
        out.mkdir()
        out.chmod(0o500)
    tonight = _run(tmp_path, "2026-11-30", [_test("t::a", "passed")])
    assert cli(["report", "render", str(tonight), "--out", str(out)]) == 2
    assert f"--out {out}: cannot write the report there" in capsys.readouterr().err


def test_a_1000_character_id_wraps_inside_its_column(tmp_path: Path) -> None:
    long_id = "t::" + "x" * 990
    _render(tmp_path, _run(tmp_path, "2026-11-30", [_test(long_id, "failed")]))
    css = (Path(__file__).parent.parent / "harness" / "report" / "templates" /
           "report.css").read_text()
    assert "td.test-id { min-width: 12em; max-width: 40em; overflow-wrap: anywhere; }" in css
    assert long_id in (tmp_path / "out" / "report.html").read_text()
    assert compare([load_results(tmp_path / "a3-2026-11-30.jsonl")], []).tests == [long_id]


def test_the_writer_and_the_loader_share_one_schema(pytester: pytest.Pytester) -> None:
    """The writer stamps ``harness.report.schema.SCHEMA`` in the header and lays each line out
    with ``schema.line``; the loader reads every line type it writes."""
    from harness.report import schema

    pytester.makepyfile(test_s="def test_a(): pass\ndef test_b(): assert 0\n")
    pytester.runpytest_subprocess("-p", "no:cacheprovider", "--harness-results=r.jsonl")
    lines = [json.loads(x) for x in (pytester.path / "r.jsonl").read_text().splitlines()]
    assert [x["type"] for x in lines] == [schema.HEADER, schema.COLLECTED, schema.TEST,
                                          schema.TEST, schema.FOOTER]
    assert lines[0]["schema"] == schema.SCHEMA
    raw = (pytester.path / "r.jsonl").read_text().splitlines()[2]
    assert raw.startswith('{"type": "test", "id": "test_s.py::test_a", "outcome": "passed"')
    run = load_results(pytester.path / "r.jsonl")
    assert run.schema_problem is None and run.footer is not None and run.collected == 2
    assert {t.outcome for t in run.tests.values()} == {"passed", "failed"}


def test_a_file_of_a_newer_schema_is_read_and_said(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """A night written by a newer npu-regress: what can be read is, and the reader says it
    may misread the rest (exit status 1), instead of a quiet partial page."""
    from harness.report import schema

    newer = _write(tmp_path / "a3.jsonl", [  # a header this contract refuses: unchecked
        nights.Unchecked(nights.header("a3", "2026-12-01", schema=schema.SCHEMA + 1)),
        _test("t::a", "passed"), nights.footer(exitstatus=0)])
    run = load_results(newer)
    assert run.schema_problem and f"schema {schema.SCHEMA + 1}" in run.schema_problem
    assert list(run.tests) == ["t::a"]
    assert cli(["report", "render", str(newer), "--out", str(tmp_path / "out")]) == 1
    assert "newer than this reader's" in capsys.readouterr().err
