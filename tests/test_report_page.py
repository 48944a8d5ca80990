"""The nightly page as a person sees it: a three-night, two-runner history with a new failure
of each check family, opened in headless Chromium at 1400 px and 400 px wide. Facts are read
from the page's own layout (a probe script, allowed by its hash, in a copy of the page);
the screenshots are written to reports/screenshots/ as artifacts."""

from __future__ import annotations

import base64
import hashlib
import html
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from harness.cli import main as cli
from harness.report.page import family_of
from harness.stack.devices import DeviceInfo
from tests.fixtures import nights

ROOT = Path(__file__).parent.parent
ARTIFACTS = ROOT / "reports" / "screenshots"
SWITCH = "suites/test_batch_invariant_switch.py::test_switch[reference-{}-{}]"
LOGPROB = "suites/test_logprob_batch_invariance.py::test_logprob_batch_invariance[tiny-{}-{}]"
HARDWARE = "suites/test_ascend_hardware.py::test_hardware[{}]"


def _header(runner: str, date: str, *, npu: bool) -> dict[str, object]:
    """A real night's header (tests/fixtures/nights.py): the CPU runner's, or the A3
    machine's that the hardware spoof made the plugin write. That night's children ran on
    the CPU, so an A3 runner's session of two NPUs (its device, torch and torch_npu) is put
    in through the harness's own ``DeviceInfo``."""
    record = nights.header(runner, date, npu=npu)
    if npu:
        record["device"] = DeviceInfo(kind="npu", count=2, reason="auto: 2 NPUs",
                                      npu_missing=None, torch_version="2.14.0",
                                      torch_npu_version="2.14.0").to_dict()
        record["packages"] = {**record["packages"], "torch": "2.14.0", "torch_npu": "2.14.0"}
    return record


_test = nights.result


SWITCH_FAIL = (
    "E   AssertionError: reference mm with the switch on:\n"
    "E   - expected batch_invariant_ops::mm to run, but it ran 0 times\n"
    "E   events counted: {}")
LOGPROB_REPORT = {"source": "tiny(float32) [switch on: reference]", "equal": False, "cases": 42,
                  "mismatches": 6, "batch_sizes_differing": [8], "phases_differing": ["decode"],
                  "max_ulp": 3, "first": {"phase": "decode", "batch_size": 8, "slot": "last",
                                          "position": 7, "token_index": 5}}
LOGPROB_FAIL = ("E   AssertionError: \nE   tiny(float32): 6 of 42 cases differ from batch size 1\n"
                "E     phase  batch  slot  pos\nE    decode      8  last    7")
HARDWARE_FAIL = (
    "E   AssertionError: soc-256: expected hardware A3, got UNKNOWN\n"
    "E   sources: soc_version from torch_npu.npu.get_soc_version(); the sources disagree: "
    "SoC 256 is A3 for torch_npu, unsupported for vllm-ascend")


def _night(tmp: Path, runner: str, date: str, *, npu: bool, broken: bool) -> Path:
    records: list[dict[str, object]] = [_header(runner, date, npu=npu)]
    for check in ("switch", "mm", "matmul", "torch_sum", "tensor_sum"):
        for state in ("disabled", "enabled"):
            test_id = SWITCH.format(check, state)
            if broken and npu and check == "mm" and state == "enabled":
                records.append(_test(test_id, "failed", longrepr=SWITCH_FAIL,
                                     dispatch_events={}))
            else:
                records.append(_test(test_id, "passed", dispatch_events={
                    "batch_invariant_ops::mm": 1} if state == "enabled" else {}))
    for dtype in ("float32", "bfloat16"):
        for switch in ("on", "off"):
            test_id = LOGPROB.format(switch, dtype)
            if broken and npu and switch == "on" and dtype == "float32":
                records.append(_test(test_id, "failed", longrepr=LOGPROB_FAIL,
                                     logprob_report=LOGPROB_REPORT, children=[nights.child(
                                         pid=4242, outcome="returned", signal=None,
                                         summary="returned in 3.1 s",
                                         stderr_tail="W1130 engine warning\n")]))
            elif switch == "off" and dtype == "bfloat16":
                records.append(_test(test_id, "xfailed", reason="inverse control found nothing"))
            else:
                records.append(_test(test_id, "passed"))
    for case in ("soc-250", "soc-256", "name-Ascend910B3", "ipc-a5-pod"):
        test_id = HARDWARE.format(case)
        if broken and npu and case == "soc-256":
            records.append(_test(test_id, "failed", longrepr=HARDWARE_FAIL))
        else:
            records.append(_test(test_id, "passed"))
    records.append(_test("suites/test_ascend_hardware.py::test_conformance[verl-soc-250]",
                         "skipped", reason="verl is not installed"))
    records.append(nights.footer(exitstatus=1 if broken else 0, duration=95.0))
    return nights.write(tmp / f"{runner}-{date}.jsonl", records)


def _three_nights(tmp: Path) -> Path:
    history, out = tmp / "history", tmp / "out"
    for date in ("2026-11-28", "2026-11-29"):
        nights = [_night(tmp, r, date, npu=r == "a3", broken=False) for r in ("a3", "cpu")]
        assert cli(["report", "history", "add", *map(str, nights), "--history",
                    str(history)]) == 0
    tonight = [_night(tmp, r, "2026-11-30", npu=r == "a3", broken=True) for r in ("a3", "cpu")]
    assert cli(["report", "render", *map(str, tonight), "--out", str(out), "--history",
                str(history)]) == 0
    return out


def _chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if shutil.which(name):
            return str(shutil.which(name))
    if os.environ.get("CI"):
        pytest.fail("Chromium is missing on a CI machine: ci/setup.sh --test installs it")
    pytest.skip("Chromium is not installed (ci/setup.sh --test installs Debian's chromium)")


PROBE = """(function () {
  var H = window.innerHeight, W = window.innerWidth;
  var out = {width: W, height: H, scrollWidth: document.documentElement.scrollWidth,
             runnersBottom: document.getElementById("runners").getBoundingClientRect().bottom,
             runnerLines: document.querySelectorAll("li.runner-line").length,
             filterShown: !document.getElementById("filter-wrap").hidden, cardTops: [],
             cardFamilies: []};
  document.querySelectorAll("article.card").forEach(function (c) {
    out.cardTops.push(Math.round(c.getBoundingClientRect().top));
    out.cardFamilies.push(c.getAttribute("data-family"));
  });
  var rows = document.querySelectorAll("tr.test-row");
  out.rows = rows.length;
  var box = document.getElementById("filter");
  box.value = "logprob";
  box.dispatchEvent(new Event("input"));
  out.shownAfterFilter = Array.prototype.filter.call(rows, function (r) {
    return !r.hidden; }).length;
  out.filterCount = document.getElementById("filter-count").textContent;
  parent.document.body.setAttribute("data-probe", JSON.stringify(out));
})();"""


def _probe(browser: str, page: Path, width: int, height: int,
           probe: str = PROBE) -> dict[str, object]:
    """Load a copy of the page (plus ``probe``, allowed by its hash) in a frame of the given
    size, and read what the probe measured."""
    text = page.read_text()
    digest = "'sha256-" + base64.b64encode(hashlib.sha256(probe.encode()).digest()).decode() + "'"
    text = text.replace("script-src ", f"script-src {digest} ", 1)
    text = text.replace("</body>", f"<script>{probe}</script></body>", 1)
    probed = page.with_name(f"probed-{width}.html")
    probed.write_text(text)
    outer = page.with_name(f"frame-{width}.html")
    outer.write_text(f'<!doctype html><body style="margin:0"><iframe src="{probed.name}" '
                     f'style="width:{width}px;height:{height}px;border:0"></iframe></body>')
    dom = subprocess.run(
        [browser, "--headless", "--no-sandbox", "--disable-gpu", "--allow-file-access-from-files",
         f"--window-size={width + 100},{height + 100}", "--virtual-time-budget=5000",
         "--dump-dom", outer.as_uri()],
        capture_output=True, text=True, timeout=120, check=False).stdout
    found = re.search(r'data-probe="([^"]*)"', dom)
    assert found, f"the probe did not run (CSP or script error): {dom[:500]}"
    return json.loads(html.unescape(found.group(1)))


def _screenshot(browser: str, page: Path, width: int, height: int, name: str) -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    shot = ARTIFACTS / name
    subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu",
                    "--hide-scrollbars", f"--window-size={width},{height}",
                    f"--screenshot={shot}", page.as_uri()],
                   capture_output=True, timeout=120, check=False)
    assert shot.is_file() and shot.stat().st_size > 10_000, shot
    return shot


def test_families_are_named_by_their_suite_file() -> None:
    assert family_of(SWITCH.format("mm", "enabled")) == "switch"
    assert family_of(LOGPROB.format("on", "float32")) == "logprob"
    assert family_of(HARDWARE.format("soc-250")) == "hardware"
    assert family_of("tests/test_other.py::test_x") == "other"


def test_three_nights_summary_names_one_new_failure_per_family(tmp_path: Path) -> None:
    out = _three_nights(tmp_path)
    summary = json.loads((out / "summary.json").read_text())
    assert sorted((family_of(r["test"]), r["runner"]) for r in summary["new_failures"]) == [
        ("hardware", "a3"), ("logprob", "a3"), ("switch", "a3")]
    page = (out / "report.html").read_text()
    assert "a3</span>: <span class=\"chip\">A3</span>, 2 devices" in page
    assert "torch_npu 2.14.0 &middot; CANN 8.3.RC1 &middot; driver 25.3.rc1.2" in page
    assert "cpu</span>: <span class=\"chip\">CPU</span>, 1 device" in page
    assert "expected vs seen:\nexpected batch_invariant_ops::mm to run, but it ran 0 times" in page
    assert "6 of 42 cases differ from batch size 1; batch sizes [8]" in page
    assert "SoC 256 is A3 for torch_npu, unsupported for vllm-ascend" in page
    assert "a3: child 4242: returned in 3.1 s" in page


@pytest.mark.parametrize("width, height", [(1400, 1000), (400, 900)])
def test_first_screen_holds_runners_and_failure_cards(tmp_path: Path, width: int,
                                                      height: int) -> None:
    browser = _chromium()
    out = _three_nights(tmp_path)
    page = out / "report.html"
    shot = _screenshot(browser, page, width, height, f"nightly-{width}px.png")
    facts = _probe(browser, page, width, height)
    print(f"screenshot {shot}; DOM facts at {width} px: {json.dumps(facts)}")
    assert facts["width"] == width and facts["runnerLines"] == 2
    assert facts["runnersBottom"] <= height, facts  # every runner line on the first screen
    tops = facts["cardTops"]
    assert facts["cardFamilies"] == ["hardware", "logprob", "switch"], facts
    if width >= 1400:
        assert all(top < height for top in tops), facts  # every card starts on screen one
    else:
        assert tops[0] < height, facts  # the first card starts on screen one
    assert facts["scrollWidth"] <= width, facts  # nothing forces sideways scrolling
    assert facts["filterShown"] is True
    assert facts["rows"] == 19  # 10 switch + 4 logprob + 4 hardware + 1 conformance skip
    assert facts["shownAfterFilter"] == 4 and facts["filterCount"] == "4 of 19 rows", facts


def test_without_scripts_the_page_is_whole_and_unfiltered(tmp_path: Path) -> None:
    out = _three_nights(tmp_path)
    page = (out / "report.html").read_text()
    assert '<p id="filter-wrap" hidden>' in page  # the filter appears only with scripts
    assert page.count('<tr class="test-row">') == 19 and " hidden>" not in page.split(
        "</h1>", 1)[1].replace('<p id="filter-wrap" hidden>', "")
    csp = html.unescape(re.search(r'http-equiv="Content-Security-Policy" content="([^"]*)"',
                                  page).group(1))
    assert csp.startswith("default-src 'none'; style-src 'sha256-")
    assert "unsafe-inline" not in csp and "unsafe-eval" not in csp
    assert "http" not in page.split("<body>", 1)[1]  # no external asset of any kind


def test_one_night_says_trends_need_two(tmp_path: Path) -> None:
    night = _night(tmp_path, "cpu", "2026-11-30", npu=False, broken=False)
    assert cli(["report", "render", str(night), "--out", str(tmp_path / "out")]) == 0
    page = (tmp_path / "out" / "report.html").read_text()
    assert "drawn from the second night on: 1 night(s) so far" in page
    assert "<polyline" not in page and 'id="no-failures"' in page


ALERT_PROBE = """(function () {
  var out = {height: window.innerHeight, alerts: [], bottoms: []};
  document.querySelectorAll("#alerts li.alert").forEach(function (a) {
    out.alerts.push(a.textContent);
    out.bottoms.push(Math.round(a.getBoundingClientRect().bottom));
  });
  out.noFailuresClaim = !!document.getElementById("no-failures");
  parent.document.body.setAttribute("data-probe", JSON.stringify(out));
})();"""


def _troubled_night(tmp: Path) -> Path:
    """Three runners, each with a night that reads green unless the page says otherwise:
    interrupted (Ctrl-C after 2 of 5), a failing line too large to load, a check that
    crashed after returning its result."""
    out = tmp / "out"
    a2 = tmp / "a2.jsonl"
    nights.write(a2, [
        _header("a2", "2026-11-30", npu=True),
        {"type": "collected", "total": 5, "ids": [HARDWARE.format(i) for i in range(5)]},
        _test(HARDWARE.format(0), "passed"), _test(HARDWARE.format(1), "passed"),
        nights.footer(exitstatus=2, interrupted=True, signal=None, collected=5,
                      duration=12.0)])
    a3 = tmp / "a3.jsonl"
    huge = {"type": "test", "id": LOGPROB.format("on", "float32"), "outcome": "failed",
            "logprob_report": {"rows": ["x" * 1000] * 3000}}
    nights.write(a3, [
        _header("a3", "2026-11-30", npu=True), nights.Unchecked(huge),
        _test(HARDWARE.format(0), "passed"), nights.footer(exitstatus=1, duration=30.0)])
    a5 = tmp / "a5.jsonl"
    crash = ("crashed: returned a result, then was killed by SIGSEGV during exit (pid 77)")
    nights.write(a5, [
        _header("a5", "2026-11-30", npu=True),
        _test(SWITCH.format("mm", "enabled"), "failed",
              longrepr=f"E   harness.ChildCrashed: isolated child {crash[9:]}",
              children=[nights.child(pid=77, outcome="crashed", signal="SIGSEGV",
                                     summary=crash, stderr_tail="Fatal Python error")]),
        nights.footer(exitstatus=1, duration=8.0)])
    assert cli(["report", "render", str(a2), str(a3), str(a5), "--out", str(out)]) == 1
    return out / "report.html"


@pytest.mark.parametrize("width, height", [(1400, 1000), (400, 900)])
def test_an_incomplete_night_and_lost_lines_are_on_the_first_screen(
        tmp_path: Path, width: int, height: int) -> None:
    browser = _chromium()
    page = _troubled_night(tmp_path)
    _screenshot(browser, page, width, height, f"nightly-troubled-{width}px.png")
    facts = _probe(browser, page, width, height, ALERT_PROBE)
    alerts = " | ".join(facts["alerts"])
    assert "a2: interrupted after 2 of 5 tests: exitstatus 2; 3 collected tests never ran" \
        in alerts, facts
    assert "a3: 1 unreadable result lines (1 recovered by id and outcome" in alerts, facts
    assert "1 check(s) crashed after returning a result (failed, not passed)" in alerts, facts
    assert all(bottom <= height for bottom in facts["bottoms"]), facts  # on screen one
    assert facts["noFailuresClaim"] is False
