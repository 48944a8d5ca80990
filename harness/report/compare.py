"""Tonight against earlier nights: new failures, fixes, still failing (since when), flaky
tests, newly skipped tests, skip reasons, and dispatch-event counts that changed while the
test still passes."""

from __future__ import annotations

import datetime as _dt
from collections import Counter
from dataclasses import dataclass, field, fields
from typing import Any

from harness.report.load import RunResults, TestResult

#: outcome flips (pass <-> fail) within the window that make a test flaky
FLAKY_FLIPS = 2
#: shared by every cell without earlier nights / stack changes (a night may hold 10^6
#: cells); never mutated: ``_bisect_hint`` assigns a new list
_NO_HISTORY: list[str] = []
_NO_CHANGES: list[dict[str, Any]] = []


@dataclass(slots=True)
class Cell:
    test: str
    runner: str
    outcome: str
    #: new-failure, fixed, still-failing, flaky, passing, skipped, newly-skipped, xfailed,
    #: vanished (in an earlier night, not collected tonight: outcome "absent")
    status: str
    #: still failing / skipped: the first night of the streak; vanished: the last night seen
    since: str | None = None
    #: skipped: the reason
    reason: str | None = None
    #: new failure: the last night it passed on this runner, and the stack manifest entries
    #: that differ between that night and tonight (the bisect hint)
    last_passed: str | None = None
    changes: list[dict[str, Any]] = field(default_factory=lambda: _NO_CHANGES)
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
    _summary: dict[str, Any] | None = field(default=None, repr=False, compare=False)

    def by_status(self, status: str) -> list[Cell]:
        return [c for c in self.cells.values() if c.status == status]

    @staticmethod
    def _rows(cells: list[Cell]) -> list[dict[str, Any]]:
        names = [f.name for f in fields(Cell) if f.name != "history"]
        return [{name: getattr(c, name) for name in names} for c in
                sorted(cells, key=lambda c: (c.test, c.runner))]

    def _category_rows(self, category: str) -> list[dict[str, Any]]:
        return self._rows([c for c in self.cells.values()
                           if (r := self.results.get((c.test, c.runner))) is not None
                           and r.category == category])

    def event_changes(self) -> list[Cell]:
        return [c for c in self.cells.values() if c.events_changed]

    def summary(self) -> dict[str, Any]:
        """The night in plain data (summary.json); made once (a large night has 10^6 cells)."""
        if self._summary is None:
            self._summary = self._make_summary()
        return self._summary

    def _make_summary(self) -> dict[str, Any]:
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
            "vanished": rows(self.by_status("vanished")),
            "skipped": rows(self.by_status("skipped") + self.by_status("newly-skipped")),
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


def tonight_date(runs: list[RunResults]) -> tuple[str, str | None]:
    """Tonight's date: the latest date among the inputs; inputs without one (a JUnit file
    without timestamp) take it. With no date anywhere: today (UTC), said in the problems.
    Never "unknown": history would then include tonight itself."""
    dates = [r.date for r in runs if r.date != "unknown-date"]
    undated = [r.path for r in runs if r.date == "unknown-date"]
    if dates:
        why = (f"no start date in {', '.join(undated)}: taken as {max(dates)}, the other "
               "inputs' date") if undated else None
        return max(dates), why
    today = _dt.datetime.now(_dt.timezone.utc).date().isoformat()
    return today, (f"no start date in any input ({', '.join(undated) or 'none given'}): "
                   f"tonight taken as {today} (today, UTC)")


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
    date, why = tonight_date(list(runs.values()))
    if why:
        problems.append(why)
    cells: dict[tuple[str, str], Cell] = {}
    results: dict[tuple[str, str], TestResult] = {}
    skip_reasons: Counter[str] = Counter()
    for runner, run in runs.items():
        for test_id, res in run.tests.items():
            key = (test_id, runner)  # one tuple for both maps: a night may hold 10^6 tests
            results[key] = res
            past = [(d, n[runner].tests.get(test_id)) for d, n in nights if runner in n]
            history = [p.outcome if p else "absent" for _, p in past] if past else _NO_HISTORY
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
                    cell.since = _streak_start(past, date, lambda p: p.failing)
                else:
                    cell.status = "new-failure"
                    _bisect_hint(cell, nights, run)
            elif res.outcome == "skipped":
                # ran on the last night this runner saw it, skips tonight: news, not noise
                cell.status = "newly-skipped" if prev is not None and \
                    prev.outcome != "skipped" else "skipped"
                cell.reason = res.reason or "(no reason given)"
                cell.since = _streak_start(past, date, lambda p: p.outcome == "skipped")
                skip_reasons[cell.reason] += 1
            elif prev is not None and prev.failing:
                cell.status = "fixed"
            elif res.outcome == "xfailed":
                cell.status = "xfailed"
            cells[key] = cell
        _vanished(runner, run, nights, cells)
    tests = sorted({test for test, _ in cells})
    trend = _trend(nights, runs, date)
    return Comparison(date, sorted(runs), tests, cells, results, [d for d, _ in nights], trend,
                      problems, skip_reasons, runs)


def changes_text(changes: list[dict[str, Any]]) -> str:
    """The bisect hint in one line: ``torch: 2.8.0 -> 2.9.0; cann: 8.2 -> 8.3``."""
    return "; ".join(f"{c['name']}: {c['then']} -> {c['now']}" for c in changes)


def _streak_start(past: list[tuple[str, TestResult | None]], date: str,
                  same: Any) -> str:
    """The first night of the run of nights, ending tonight, on which ``same`` held."""
    since = date
    for night, result in reversed(past):
        if result is None or not same(result):
            break
        since = night
    return since


def _bisect_hint(cell: Cell, nights: list[tuple[str, dict[str, RunResults]]],
                 run: RunResults) -> None:
    """What changed in the runner's stack between the last night the test passed and
    tonight: the first question at 3 a.m."""
    from harness.manifest import differences

    for night, runs in reversed(nights):
        then = runs.get(cell.runner)
        result = then.tests.get(cell.test) if then else None
        if then is not None and result is not None and result.outcome in ("passed", "xfailed"):
            cell.last_passed = night
            cell.changes = differences(then.header.get("manifest"), run.header.get("manifest"))
            return


def _vanished(runner: str, run: RunResults, nights: list[tuple[str, dict[str, RunResults]]],
              cells: dict[tuple[str, str], Cell]) -> None:
    """Tests an earlier night of this runner had that tonight did not collect at all."""
    last_seen: dict[str, str] = {}
    for night, runs in nights:
        if runner in runs:
            for test_id in runs[runner].tests:
                last_seen[test_id] = night
    for test_id, night in last_seen.items():
        if test_id not in run.tests:
            cells[(test_id, runner)] = Cell(test_id, runner, "absent", "vanished", since=night)


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
