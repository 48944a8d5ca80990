"""Tonight against earlier nights: new failures, fixes, still failing (since when), flaky
tests, newly skipped tests, skip reasons, and dispatch-event counts that changed while the
test still passes."""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

from harness.report.load import RunResults, TestResult

#: outcome flips (pass <-> fail) within the window that make a test flaky
FLAKY_FLIPS = 2


@dataclass
class Cell:
    test: str
    runner: str
    outcome: str
    #: new-failure, fixed, still-failing, flaky, passing, skipped, newly-skipped, xfailed
    status: str
    since: str | None = None
    history: list[str] = field(default_factory=list)
    events_before: dict[str, int] | None = None
    events_now: dict[str, int] | None = None

    @property
    def events_changed(self) -> bool:
        return (self.events_before is not None and self.events_now is not None
                and self.events_before != self.events_now)


@dataclass
class Comparison:
    date: str
    runners: list[str]
    tests: list[str]
    cells: dict[tuple[str, str], Cell]
    results: dict[tuple[str, str], TestResult]
    nights: list[str]
    trend: dict[str, list[dict[str, Any]]]
    problems: list[str]
    skip_reasons: Counter[str] = field(default_factory=Counter)
    #: tonight's run of each runner (its header: device, hardware, package versions)
    runs: dict[str, RunResults] = field(default_factory=dict)

    def by_status(self, status: str) -> list[Cell]:
        return [c for c in self.cells.values() if c.status == status]

    @staticmethod
    def _rows(cells: list[Cell]) -> list[dict[str, Any]]:
        return [{k: v for k, v in asdict(c).items() if k != "history"} for c in
                sorted(cells, key=lambda c: (c.test, c.runner))]

    def _category_rows(self, category: str) -> list[dict[str, Any]]:
        return self._rows([c for c in self.cells.values()
                           if self.results[(c.test, c.runner)].category == category])

    def event_changes(self) -> list[Cell]:
        return [c for c in self.cells.values() if c.events_changed]

    def summary(self) -> dict[str, Any]:
        rows = self._rows
        counts = Counter(c.outcome for c in self.cells.values())
        return {
            "date": self.date, "runners": self.runners, "nights_compared": self.nights,
            "tests": len(self.tests), "outcomes": dict(counts),
            "new_failures": rows(self.by_status("new-failure")),
            "fixed": rows(self.by_status("fixed")),
            "still_failing": rows(self.by_status("still-failing")),
            "flaky": rows(self.by_status("flaky")),
            "newly_skipped": rows(self.by_status("newly-skipped")),
            "upstream_drift": self._category_rows("upstream-drift"),
            "release_findings": self._category_rows("release-finding"),
            "event_changes": rows(self.event_changes()),
            "skipped_by_reason": dict(self.skip_reasons.most_common()),
            "problems": self.problems,
        }


def _category(outcome: str | None) -> str | None:
    if outcome in ("failed", "error", "xpassed"):
        return "fail"
    if outcome in ("passed", "xfailed"):
        return "pass"
    return None  # skipped or absent: says nothing about flakiness


def compare(tonight: list[RunResults], nights: list[tuple[str, dict[str, RunResults]]]
            ) -> Comparison:
    runs: dict[str, RunResults] = {}
    problems: list[str] = []
    for run in tonight:
        name = run.runner
        n = 2
        while name in runs:
            name = f"{run.runner}#{n}"
            n += 1
        if name != run.runner:
            problems.append(f"{run.path}: runner {run.runner!r} appears twice; shown as {name!r}")
            run.runner = name
        runs[name] = run
        problems.extend(run.problems)
    date = max((r.date for r in runs.values()), default="unknown-date")
    tests = sorted({t for r in runs.values() for t in r.tests})
    cells: dict[tuple[str, str], Cell] = {}
    results: dict[tuple[str, str], TestResult] = {}
    skip_reasons: Counter[str] = Counter()
    for runner, run in runs.items():
        for test_id, res in run.tests.items():
            results[(test_id, runner)] = res
            past = [(d, n[runner].tests.get(test_id)) for d, n in nights if runner in n]
            history = [p.outcome if p else "absent" for _, p in past]
            prev = next((p for _, p in reversed(past) if p is not None), None)
            cell = Cell(test_id, runner, res.outcome, "passing", history=history,
                        events_before=prev.dispatch_events if prev else None,
                        events_now=res.dispatch_events)
            cats = [c for c in (*(_category(h) for h in history), _category(res.outcome)) if c]
            flips = sum(1 for a, b in zip(cats, cats[1:], strict=False) if a != b)
            if flips >= FLAKY_FLIPS:
                cell.status = "flaky"
            elif res.failing:
                if prev is not None and prev.failing:
                    cell.status = "still-failing"
                    streak = [d for d, p in past if p is not None]
                    since = date
                    for d, p in reversed(past):
                        if p is None or not p.failing:
                            break
                        since = d
                    cell.since = since if streak else None
                else:
                    cell.status = "new-failure"
            elif res.outcome == "skipped":
                # ran on the last night this runner saw it, skips tonight: news, not noise
                cell.status = "newly-skipped" if prev is not None and \
                    prev.outcome != "skipped" else "skipped"
                skip_reasons[res.reason or "(no reason given)"] += 1
            elif prev is not None and prev.failing:
                cell.status = "fixed"
            elif res.outcome == "xfailed":
                cell.status = "xfailed"
            cells[(test_id, runner)] = cell
    trend = _trend(nights, runs, date)
    return Comparison(date, sorted(runs), tests, cells, results, [d for d, _ in nights], trend,
                      problems, skip_reasons, runs)


def _trend(nights: list[tuple[str, dict[str, RunResults]]], tonight: dict[str, RunResults],
           date: str) -> dict[str, list[dict[str, Any]]]:
    """Per runner: [{date, pass_rate, duration}] over the window, tonight last."""
    trend: dict[str, list[dict[str, Any]]] = {}
    for night, runs in [*nights, (date, tonight)]:
        for runner, run in runs.items():
            ran = [t for t in run.tests.values() if t.outcome != "skipped"]
            passed = sum(1 for t in ran if not t.failing)
            trend.setdefault(runner, []).append({
                "date": night, "pass_rate": passed / len(ran) if ran else None,
                "duration": run.duration, "tests": len(run.tests)})
    return trend
