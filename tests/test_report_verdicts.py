"""The report is never greener than the night: an interrupted or killed night, a line that
cannot be read, a bad history or clock, odd inputs and outputs that would not fit. Each
test reproduces a situation that read green (or wrong) before."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from harness.cli import main as cli
from harness.report import history_folder as hist
from harness.report.load import load_results
from tests.process_checks import PYTEST_AT_A_TERMINAL
from tests.test_report import FOOTER, _header, _test, _write

SLOW_NIGHT = """
import time
def test_a(): pass
def test_b(): assert False, "b broke"
def test_slow(): time.sleep(600)
def test_never(): pass
"""


def _render(tmp_path: Path, *inputs: Path, history: Path | None = None,
            status: int = 0) -> tuple[dict, str, str]:
    out = tmp_path / "out"
    args = ["report", "render", *map(str, inputs), "--out", str(out)]
    if history is not None:
        args += ["--history", str(history)]
    assert cli(args) == status
    return (json.loads((out / "summary.json").read_text()), (out / "report.html").read_text(),
            (out / "summary.md").read_text())


def _first_screen(html: str) -> str:
    """What is above the failure cards and the matrix: the alerts and the runner lines."""
    return html.split('<ul class="news"', 1)[0]


def _start_night(tmp_path: Path, *extra: str) -> subprocess.Popen[bytes]:
    (tmp_path / "test_night.py").write_text(SLOW_NIGHT)
    proc = subprocess.Popen(
        [*PYTEST_AT_A_TERMINAL, "-p", "no:cacheprovider", "--harness-results=r.jsonl",
         "--junitxml=j.xml", "--harness-runner=a3", *extra, "test_night.py"],
        cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True)
    for _ in range(600):  # bounded: until test_slow is running (a, b written)
        text = (tmp_path / "r.jsonl").read_text() if (tmp_path / "r.jsonl").exists() else ""
        if text.count('"type": "test"') >= 2:
            break
        time.sleep(0.1)
    time.sleep(0.3)
    return proc


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGKILL])
def test_an_interrupted_night_says_so_on_the_first_screen(tmp_path: Path,
                                                          sig: signal.Signals) -> None:
    proc = _start_night(tmp_path)
    os.kill(proc.pid, sig)
    rc = proc.wait(timeout=120)
    lines = [json.loads(line) for line in (tmp_path / "r.jsonl").read_text().splitlines()]
    footer = lines[-1] if lines[-1]["type"] == "footer" else None
    if sig == signal.SIGKILL:
        assert footer is None and rc == -signal.SIGKILL
    else:
        assert footer["interrupted"] is True and footer["collected"] == 4
        assert footer["exitstatus"] == 2
        assert footer["signal"] == ("SIGTERM" if sig == signal.SIGTERM else None)
        # JUnit written for what ran; SIGTERM re-raised once everything was written
        junit = (tmp_path / "j.xml").read_text()
        assert 'name="test_a"' in junit and 'name="test_b"' in junit
        assert rc == (-signal.SIGTERM if sig == signal.SIGTERM else 2)
    # tonight against a night that ran all four: the two that never ran are "not run"
    history = tmp_path / "history"
    earlier = _write(tmp_path / "earlier.jsonl", [
        _header("a3", "2026-11-29"),
        *(_test(f"test_night.py::test_{n}", "passed") for n in ("a", "b", "slow", "never")),
        FOOTER])
    hist.add([earlier], history)
    summary, html, md = _render(tmp_path, tmp_path / "r.jsonl", history=history)
    assert summary["vanished"] == []
    assert sorted(r["test"] for r in summary["not_run"]) == [
        "test_night.py::test_never", "test_night.py::test_slow"]
    (state,) = summary["incomplete"]
    expected = {signal.SIGINT: "interrupted after 2 of 4 tests: exitstatus 2",
                signal.SIGTERM: "ended by SIGTERM after 2 of 4 tests: exitstatus 2",
                signal.SIGKILL: "no footer: the run was killed (or is still running) after "
                                "2 of 4 tests"}[sig]
    assert state["state"] == expected
    first = _first_screen(html)
    assert expected in first and 'class="alert alert-incomplete"' in first
    assert "No failures tonight" not in html
    assert expected in md


def test_a_night_with_no_failures_that_ended_early_is_not_called_green(
        tmp_path: Path) -> None:
    path = _write(tmp_path / "r.jsonl", [
        _header("a3", "2026-11-30"),
        {"type": "collected", "total": 3, "ids": ["t::a", "t::b", "t::c"]},
        _test("t::a", "passed")])
    summary, html, _ = _render(tmp_path, path)
    assert "No failures tonight" not in html
    assert "this is not a green night" in html
    assert summary["outcomes"]["not-run"] == 2


@pytest.mark.parametrize("how", ["3 MB", "200,000 deep"])
def test_a_failing_line_that_cannot_be_loaded_is_still_a_failure(tmp_path: Path,
                                                                 how: str) -> None:
    if how == "3 MB":
        bad = {"type": "test", "id": "t::big", "outcome": "failed",
               "logprob_report": {"rows": ["x" * 1000] * 3000}}
        text = json.dumps(bad)
    else:
        text = ('{"type": "test", "id": "t::big", "outcome": "failed", "logprob_report": '
                + "[" * 200_000 + "]" * 200_000 + "}")
    path = _write(tmp_path / "r.jsonl", [_header("a3", "2026-11-30"), _test("t::ok", "passed")],
                  tail=text + "\n" + json.dumps(FOOTER) + "\n")
    summary, html, _ = _render(tmp_path, path, status=1)
    assert [r["test"] for r in summary["new_failures"]] == ["t::big"]
    assert "No failures tonight" not in html
    assert "1 unreadable result lines (1 recovered by id and outcome" in _first_screen(html)


def test_a_line_with_nothing_recoverable_is_counted_on_the_first_screen(
        tmp_path: Path) -> None:
    path = _write(tmp_path / "r.jsonl", [_header("a3", "2026-11-30"), _test("t::ok", "passed")],
                  tail="{" * 10 + "garbage\n" + '{"type": "test", "id": "t::x", "outc\n'
                  + json.dumps(FOOTER) + "\n")
    summary, html, md = _render(tmp_path, path, status=1)
    assert summary["unreadable"] == [{"runner": "a3", "path": str(path), "unreadable": 2,
                                      "recovered": 0}]
    assert "2 unreadable result lines in" in _first_screen(html)
    assert "No failures tonight" not in html and "2 unreadable result lines" in md


def test_a_missing_history_folder_is_an_error(tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    path = _write(tmp_path / "r.jsonl", [_header("a3", "2026-11-30"), _test("t::a", "failed"),
                                         FOOTER])
    assert cli(["report", "render", str(path), "--out", str(tmp_path / "out"),
                "--history", str(tmp_path / "nope")]) == 2
    assert "--history" in capsys.readouterr().err and not (tmp_path / "out").exists()


def test_history_add_never_overwrites(tmp_path: Path) -> None:
    history = tmp_path / "history"
    first = _write(tmp_path / "1.jsonl", [_header("a3", "2026-11-30"), _test("t::a", "passed"),
                                          FOOTER])
    second = _write(tmp_path / "2.jsonl", [_header("a3", "2026-11-30"),
                                           _test("t::b", "passed"), FOOTER])
    hist.add([first], history)
    again = hist.add([first], history)
    assert "already filed" in again[0] and again.refused == 0
    beside = hist.add([second], history)
    assert "filed beside it" in beside[0]
    night = history / "2026-11-30"
    assert sorted(p.name for p in night.iterdir()) == ["a3.2.jsonl", "a3.jsonl"]
    assert (night / "a3.jsonl").read_bytes() == first.read_bytes()


def test_runner_names_that_file_alike_are_refused(tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    history = tmp_path / "history"
    one = _write(tmp_path / "1.jsonl", [_header("a3 runner", "2026-11-30"),
                                        _test("t::a", "passed"), FOOTER])
    two = _write(tmp_path / "2.jsonl", [_header("a3_runner", "2026-11-30"),
                                        _test("t::a", "failed"), FOOTER])
    assert cli(["report", "history", "add", str(one), str(two), "--history",
                str(history)]) == 1
    out = capsys.readouterr().out
    assert "not filed: runner 'a3_runner' files as a3_runner.jsonl, which holds runner " \
           "'a3 runner'" in out
    assert load_results(history / "2026-11-30" / "a3_runner.jsonl").runner == "a3 runner"


def test_a_night_is_filed_under_its_start_in_utc(tmp_path: Path) -> None:
    path = _write(tmp_path / "r.jsonl", [
        _header("a3", "2026-12-01", start="2026-12-01T01:30:00+08:00"),
        _test("t::a", "passed"), FOOTER])
    assert load_results(path).date == "2026-11-30"
    hist.add([path], tmp_path / "history")
    assert (tmp_path / "history" / "2026-11-30" / "a3.jsonl").is_file()


@pytest.mark.parametrize(("start", "words"), [("2096-11-30", "ahead of now"),
                                              ("2026-11-27", "from the other runners'")])
def test_a_clock_a_day_off_is_named_and_never_dates_the_report(tmp_path: Path, start: str,
                                                               words: str) -> None:
    now = time.strftime("%Y-%m-%d", time.gmtime())
    good = [_write(tmp_path / f"{r}.jsonl", [_header(r, now), _test("t::a", "passed"), FOOTER])
            for r in ("a2", "a3")]
    odd = _write(tmp_path / "odd.jsonl", [_header("a5", start), _test("t::a", "passed"),
                                          FOOTER])
    summary, html, _ = _render(tmp_path, *good, odd)
    assert summary["date"] == now
    (warning,) = summary["clock_warnings"]
    assert warning["runner"] == "a5" and words in warning["warning"]
    assert "not used to date the report" in _first_screen(html)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_a_fifo_or_a_device_is_named_and_the_other_inputs_still_render(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    os.mkfifo(tmp_path / "fifo.jsonl")
    good = _write(tmp_path / "r.jsonl", [_header("a3", "2026-11-30"), _test("t::a", "failed"),
                                         FOOTER])
    summary, _, _ = _render(tmp_path, tmp_path / "fifo.jsonl", Path("/dev/zero"), good,
                            status=1)
    err = capsys.readouterr().err
    assert "fifo.jsonl: a FIFO (named pipe), not a results file: not read" in err
    assert "/dev/zero: a character device, not a results file: not read" in err
    assert [r["test"] for r in summary["new_failures"]] == ["t::a"]


@pytest.mark.parametrize(("args", "words"), [
    (["--date", "30/11/2026"], "'30/11/2026' is not a date written YYYY-MM-DD"),
    (["--keep", "0"], "'0': give the number of nights to keep"),
    (["--keep", "-1"], "'-1': give the number of nights to keep"),
])
def test_history_add_refuses_bad_values_naming_them(tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str],
                                                    args: list[str], words: str) -> None:
    path = _write(tmp_path / "r.jsonl", [_header("a3", "2026-11-30"), FOOTER])
    with pytest.raises(SystemExit) as info:
        cli(["report", "history", "add", str(path), "--history", str(tmp_path / "h"), *args])
    assert info.value.code == 2 and words in capsys.readouterr().err
    assert not (tmp_path / "h").exists()


@pytest.mark.parametrize(("args", "words"), [
    (["--isolation-timeout", "-5"], "give a number of seconds greater than 0"),
    (["--isolation-timeout", "0"], "give a number of seconds greater than 0"),
    (["--device-count", "0"], "--device-count 0: the number of devices must be 1 or more"),
])
def test_bad_isolation_values_are_usage_errors(pytester: pytest.Pytester, args: list[str],
                                               words: str) -> None:
    pytester.makepyfile(test_x="def test_x(run_on_npu):\n    run_on_npu(int, '1')\n")
    result = pytester.runpytest(*args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert words in result.stderr.str()


def test_a_results_file_over_512_mb_is_read_as_a_stream(tmp_path: Path) -> None:
    """Sparse: 600 MB of apparent size (a hole of NULs between two halves) costs no disk;
    before, any file over 512 MB was refused whole ("0 tests", exit 0)."""
    path = _write(tmp_path / "r.jsonl", [_header("a3", "2026-11-30"), _test("t::a", "failed")])
    with open(path, "r+b") as fh:
        fh.truncate(600 * 1024 * 1024)
        fh.seek(0, os.SEEK_END)
        fh.write(b"\n" + json.dumps(_test("t::z", "passed")).encode() + b"\n"
                 + json.dumps(FOOTER).encode() + b"\n")
    run = load_results(path)
    assert run.refused is None and sorted(run.tests) == ["t::a", "t::z"]
    assert run.unreadable >= 1  # the hole is lines of NULs: counted, not a test


def test_nan_and_infinite_durations_are_n_a_and_not_drawn(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    path.write_text(json.dumps(_header("a3", "2026-11-30")) + "\n"
                    + '{"type": "test", "id": "t::a", "outcome": "passed", "duration": NaN}\n'
                    + '{"type": "footer", "exitstatus": 0, "duration": Infinity}\n')
    history = tmp_path / "history"
    hist.add([_write(tmp_path / "e.jsonl", [_header("a3", "2026-11-29"),
                                            _test("t::a", "passed"), FOOTER])], history)
    summary, html, _ = _render(tmp_path, path, history=history)
    assert "duration n/a" in html and "NaN" not in html and "Infinity" not in html
    text = (tmp_path / "out" / "summary.json").read_text()
    assert "NaN" not in text and "Infinity" not in text


def test_problems_summary_md_and_mass_failures_are_bounded(tmp_path: Path) -> None:
    tests = [_test(f"t::dup{i % 10}", "passed") for i in range(20_000)]  # 19,990 duplicates
    tests += [_test(f"t::mass{i}", "failed", longrepr="E   RuntimeError: device lost")
              for i in range(12_000)]
    path = _write(tmp_path / "r.jsonl", [_header("a3", "2026-11-30"), *tests, FOOTER])
    summary, html, md = _render(tmp_path, path)
    assert summary["problems_total"] == 19_990 and len(summary["problems"]) == 1000
    assert "the first 200 of 19990 problems shown" in html
    assert html.count('class="card"') == 1
    assert "and 11999 more tests with the same message" in html
    assert len(md.encode()) < 1024 * 1024
    assert "more rows in summary.json" in md
