"""Envelopes that belong to the runner (issue 66): a runner whose kind no shipped row holds
starts with no envelope ("learning"); five of its own nights, real suite runs filed in the
report's history, are learned into the baselines folder of its repository, and the sixth
night is judged by them, naming the file. A baselines row made tighter than what the runner
does fails that night as a drift that grew: the judge reads the user's file first."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CASE = ("suites/test_logprob_batch_invariance.py::test_logprob_batch_invariance"
        "[batch-size-tiny-off-float32]")
#: a machine kind no shipped row holds: this runner's rows must be learned
MACHINE = "riscv64"
KEY = ("batch-size", "tiny", "cpu", MACHINE, "float32", "off")


def _night(out: Path, *args: str) -> dict:
    """One night of the runner: the suite's case as a CI job runs it; its test line."""
    # the plugins (tests/conftest.py: LEAN_ADDOPTS) and preloaded modules this case never
    # uses left out: 7 s a night, not 12
    env = {**os.environ, "NPU_REGRESS_MACHINE": MACHINE, "HARNESS_RUNNER": "rv-runner"}
    env.pop("NPU_REGRESS_BASELINES", None)
    subprocess.run([sys.executable, "-m", "pytest", CASE, "-q", "-p", "no:cacheprovider",
                    "--isolation-preload=torch,harness", f"--harness-results={out}", *args],
                   cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    return next(x for x in lines if x["type"] == "test")


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "harness", *args], cwd=ROOT,
                          capture_output=True, text=True, check=False)


def test_a_new_runner_learns_its_envelopes_and_its_sixth_night_is_judged_by_them(
        tmp_path: Path) -> None:
    history, baselines = tmp_path / "history", tmp_path / "repo" / "baselines"
    for n in range(1, 6):
        night = tmp_path / f"night{n}.jsonl"
        line = _night(night)
        [record] = line["drift"]
        # no row for this runner's kind: recorded, not judged; never a pass
        assert line["outcome"] == "xfailed" and record["judged"] == "no-envelope", line
        assert record["key"]["machine"] == MACHINE
        if n == 3:  # the page: the row is learning, with the nights it has
            page = tmp_path / "report3"
            rendered = _cli("report", "render", str(night), "--history", str(history),
                            "--out", str(page))
            assert rendered.returncode == 0, rendered.stderr
            assert "learning, 3 of 5 nights" in (page / "report.html").read_text()
        filed = _cli("report", "history", "add", str(night), "--history", str(history),
                     "--date", f"2026-12-0{n}")
        assert filed.returncode == 0, filed.stderr
        if n == 4:  # four nights: too few to learn from, said
            early = _cli("expectations", "learn", "--history", str(history), "--runner",
                         "rv-runner", "--baselines", str(baselines))
            assert early.returncode == 2 and "has 4 night(s)" in early.stderr, early.stderr
            assert not baselines.exists()
    learned = _cli("expectations", "learn", "--history", str(history), "--runner",
                   "rv-runner", "--baselines", str(baselines))
    assert learned.returncode == 0, learned.stderr
    assert "+machine = \"riscv64\"" in learned.stdout, learned.stdout  # the diff to review
    assert f"written into {baselines / 'logprobs.toml'}" in learned.stderr, learned.stderr
    assert "figure: " in learned.stderr and ": new " in learned.stderr
    text = (baselines / "logprobs.toml").read_text()
    assert "runs = 5" in text and "learned from this runner's own runs: 5 runs" in text, text
    shipped = (ROOT / "harness/logprobs/expectations.toml").read_text()
    assert MACHINE not in shipped  # never into the package

    # the sixth night, in the repository that holds baselines/: judged, naming the file
    line = _night(tmp_path / "night6.jsonl", f"--harness-baselines={baselines}")
    [record] = line["drift"]
    assert line["outcome"] == "passed" and record["judged"] == "within", line
    assert record["envelope"]["judged_by"] == \
        f"{baselines / 'logprobs.toml'} row {'/'.join(KEY)}", record["envelope"]

    # the control: the runner's own row tightened to a tenth of what it does (max_ulp):
    # the next night fails as a drift that grew, judged by that file
    ulp = record["figures"]["max_ulp"]
    assert ulp >= 10
    _tightened(baselines / "logprobs.toml", "max_ulp", ulp // 10)
    line = _night(tmp_path / "night7.jsonl", f"--harness-baselines={baselines}")
    assert line["outcome"] == "failed" and line["category"] == "drift-grew", line
    assert f"judged by {baselines / 'logprobs.toml'} row" in line["longrepr"], line["longrepr"]


def _tightened(path: Path, figure: str, value: int) -> None:
    """The baselines file with ``figure``'s measured range set to [value, value], read and
    written by the table's own code."""
    from dataclasses import replace

    from harness.drift.table import load, with_envelope
    from harness.logprobs.expectations import KEY_FIELDS

    table = load(path, KEY_FIELDS, label=str(path))
    row = table.get(KEY)
    assert row is not None and len(row.envelopes) == 1  # the one runner's, learned
    [envelope] = row.envelopes
    table.put(with_envelope(row, replace(envelope, figures={**envelope.figures,
                                                            figure: (value, value)})))
    table.write()
