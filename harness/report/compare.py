"""Tonight against earlier nights: new failures, fixes, still failing (since when), flaky
tests, newly skipped tests, skip reasons, and dispatch-event counts that changed while the
test still passes."""

from __future__ import annotations

import datetime as _dt
import shlex
from collections import Counter
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from harness.report.folded_nights import (
    FAILING_LETTERS,
    OUTCOME_OF,
    PASSING_LETTERS,
    TREND_FIGURES,
    History,
    Past,
)
from harness.report.history_folder import night_file
from harness.report.load import Problems, RunResults, TestResult
from harness.report.schema import RUNNERS_OWN

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
    #: vanished (in an earlier night, not collected tonight: outcome "absent"), not-run
    #: (collected tonight, or seen before, on a night that ended before it ran: outcome
    #: "not-run")
    status: str
    #: still failing / skipped: the first night of the streak; vanished: the last night seen
    since: str | None = None
    #: skipped: the reason
    reason: str | None = None
    #: new failure: the last night it passed on this runner, and the stack manifest entries
    #: that differ between that night and tonight (the bisect hint)
    last_passed: str | None = None
    changes: list[dict[str, Any]] = field(default_factory=lambda: _NO_CHANGES)
    #: new failure: the bisect's card line where ``npu-regress bisect`` ran for it
    #: (``report render --bisect``), else the command that runs it
    bisect: str | None = None
    bisect_command: str | None = None
    #: where a release finding's standalone reproducer is (``report render --repro``)
    repro: str | None = None
    #: the reproducer's files beside the report: (file name, relative link)
    repro_links: tuple[tuple[str, str], ...] = ()
    history: list[str] = field(default_factory=list)
    events_before: dict[str, int] | None = None
    events_now: dict[str, int] | None = None
    #: the size of a difference (rollout vs training, every drift record): last night's
    #: figures and tonight's
    figures_before: dict[str, float] | None = None
    figures_now: dict[str, float] | None = None

    @property
    def events_changed(self) -> bool:
        return (self.events_before is not None and self.events_now is not None
                and self.events_before != self.events_now)

    @property
    def figures_changed(self) -> bool:
        return (self.figures_before is not None and self.figures_now is not None
                and self.figures_before != self.figures_now)

    @property
    def zero_diff_lost(self) -> bool:
        """Rollout and training were bit-equal last night and are not tonight."""
        before, now = self.figures_before, self.figures_now
        return bool(before and now and "tokens" in before and "tokens" in now
                    and before["bit_equal"] == before["tokens"]
                    and now["bit_equal"] != now["tokens"])


#: the nights a runner's row is learned from (``npu-regress expectations learn --nights``'s
#: default; the report imports nothing of the harness, so the figure is said here too)
LEARNING_NIGHTS = 5


@dataclass
class Comparison:
    date: str
    runners: list[str]
    tests: list[str]
    #: the cells worth a look: every cell but a plain pass (passed, not after a failure, not
    #: flaky, same dispatch events). A plain pass is made again on demand by ``cell()``, so
    #: memory grows with tonight's news, not with the 10^6 tests a night may hold.
    cells: dict[tuple[str, str], Cell]
    nights: list[str]
    trend: dict[str, list[dict[str, Any]]]
    problems: list[str]
    skip_reasons: Counter[str] = field(default_factory=Counter)
    #: tonight's run of each runner (its header: device, hardware, package versions)
    runs: dict[str, RunResults] = field(default_factory=dict)
    #: the earlier nights, folded (``nights`` holds their dates), to remake quiet cells
    history: History = field(default_factory=History, repr=False)
    _summary: dict[str, Any] | None = field(default=None, repr=False, compare=False)

    def result(self, test: str, runner: str) -> TestResult | None:
        """Tonight's result of ``test`` on ``runner`` (None: not collected there)."""
        run = self.runs.get(runner)
        return run.tests.get(test) if run is not None else None

    def cell(self, test: str, runner: str) -> Cell | None:
        """The cell of ``test`` on ``runner``, stored or remade (None: not there)."""
        stored = self.cells.get((test, runner))
        if stored is not None:
            return stored
        res = self.result(test, runner)
        return _cell(test, runner, res, self.runs[runner],
                     self.history.runners.get(runner), self.date) if res is not None else None

    def by_status(self, status: str) -> list[Cell]:
        return [c for c in self.cells.values() if c.status == status]

    def outcome_counts(self) -> Counter[str]:
        """Outcomes over every cell, quiet passes included (vanished cells: "absent")."""
        counts = Counter(t.outcome for run in self.runs.values() for t in run.tests.values())
        counts.update(c.outcome for c in self.cells.values()
                      if c.status in ("vanished", "not-run"))
        return counts

    @staticmethod
    def _rows(cells: list[Cell]) -> list[dict[str, Any]]:
        names = [f.name for f in fields(Cell) if f.name != "history"]
        return [{name: getattr(c, name) for name in names} for c in
                sorted(cells, key=lambda c: (c.test, c.runner))]

    def _category_rows(self, category: str) -> list[dict[str, Any]]:
        return self._rows([cell for runner, run in self.runs.items()
                           for test, res in run.tests.items() if res.category == category
                           and (cell := self.cell(test, runner)) is not None])

    def event_changes(self) -> list[Cell]:
        return [c for c in self.cells.values() if c.events_changed]

    def figure_changes(self) -> list[Cell]:
        return [c for c in self.cells.values() if c.figures_changed]

    def drift_trends(self, limit: int = 400) -> list[dict[str, Any]]:
        """Every test with figures tonight, per runner and trend figure: the value on each
        night of the history and tonight, tonight's bound and how it was judged (tests
        whose drift grew first)."""
        rows = []
        for runner, run in sorted(self.runs.items()):
            past = self.history.runners.get(runner)
            for test, res in run.tests.items():
                if not res.figures:
                    continue
                for name in TREND_FIGURES:
                    if name not in res.figures:
                        continue
                    nights = (past.trend.get(test, {}).get(name, {}) if past is not None
                              else {})
                    points = [(d, v) for d, v in sorted(nights.items()) if d < self.date]
                    points.append((self.date, res.figures[name]))
                    judged = res.judged or "none"
                    rows.append({"test": test + (f" [{res.drift_row}]" if res.drift_row
                                                 else ""),
                                 "runner": runner, "figure": name,
                                 "points": points, "now": res.figures[name],
                                 "bound": (res.bounds or {}).get(name),
                                 "judged": judged,
                                 # a row with no envelope for this runner is learning it
                                 # from its nights (npu-regress expectations learn)
                                 "state": (f"learning, {min(len(points), LEARNING_NIGHTS)} "
                                           f"of {LEARNING_NIGHTS} nights"
                                           if judged == "no-envelope" else judged)})
        rows.sort(key=lambda r: (r["judged"] != "grew", r["test"], r["runner"], r["figure"]))
        return rows[:limit]

    def summary(self) -> dict[str, Any]:
        """The night in plain data (summary.json); made once (a large night has 10^6 cells)."""
        if self._summary is None:
            self._summary = self._make_summary()
        return self._summary

    def _make_summary(self) -> dict[str, Any]:
        rows = self._rows
        counts = self.outcome_counts()
        return {
            "date": self.date, "runners": self.runners, "nights_compared": self.nights,
            "tests": len(self.tests), "outcomes": dict(counts),
            "new_failures": rows(self.by_status("new-failure")),
            "fixed": rows(self.by_status("fixed")),
            "still_failing": rows(self.by_status("still-failing")),
            "flaky": rows(self.by_status("flaky")),
            "newly_skipped": rows(self.by_status("newly-skipped")),
            "vanished": rows(self.by_status("vanished")),
            "not_run": rows(self.by_status("not-run")),
            "incomplete": [{"runner": name, "state": run.ended_early,
                            "not_run": run.not_run} for name, run in sorted(self.runs.items())
                           if run.ended_early],
            "unreadable": [{"runner": name, "path": run.path, "unreadable": run.unreadable,
                            "recovered": run.recovered}
                           for name, run in sorted(self.runs.items())
                           if run.unreadable or run.recovered],
            "clock_warnings": [{"runner": name, "warning": run.clock_warning}
                               for name, run in sorted(self.runs.items()) if run.clock_warning],
            "post_result_crashes": self.post_result_crashes(),
            "skipped": rows(self.by_status("skipped") + self.by_status("newly-skipped")),
            "upstream_drift": self._category_rows("upstream-drift"),
            "release_findings": self._category_rows("release-finding"),
            # known findings (the ledger's strict expected failures): listed, never red
            "known_findings": self._category_rows("known-finding"),
            "fixed_upstream": self._category_rows("fixed-upstream"),
            "forward_compat": self._category_rows("forward-compat"),
            "unsupported_stack": self._category_rows("unsupported-stack"),
            # a capability the runner declares required is missing: the runner's
            "required_capability": self._category_rows("required-capability"),
            # a difference allowed to exist grew past its measured envelope: a finding
            "drift_grew": self._category_rows("drift-grew"),
            # the harness's own causes: they fail our CI, never the release
            "harness_causes": self._category_rows("harness")
            + self._category_rows("stand-in-limit"),
            "event_changes": rows(self.event_changes()),
            "figure_changes": [{**row, "zero_diff_lost": self.cells[(row["test"],
                                                                     row["runner"])].zero_diff_lost}
                               for row in rows(self.figure_changes())],
            "skipped_by_reason": dict(self.skip_reasons.most_common()),
            "problems": list(self.problems), "problems_total": self.problems.total,
        }

    def post_result_crashes(self) -> list[dict[str, Any]]:
        """Checks whose child wrote a result and then died (harness.isolation.run): each is a
        failure already; listed apart because a teardown crash reads like a pass elsewhere."""
        return [{"test": test, "runner": runner, "summary": str(child.get("summary"))}
                for runner, run in sorted(self.runs.items())
                for test, res in run.tests.items() if res.failing
                for child in res.children if "during exit" in str(child.get("summary", ""))]


def _category(outcome: str | None) -> str | None:
    if outcome in ("failed", "error", "xpassed"):
        return "fail"
    if outcome in ("passed", "xfailed"):
        return "pass"
    return None  # skipped or absent: says nothing about flakiness


#: a runner whose clock is further than this from the others' (or ahead of now) is named,
#: and does not date the report
CLOCK_SKEW = _dt.timedelta(days=1)


def check_clocks(runs: list[RunResults], now: _dt.datetime | None = None) -> None:
    """Set ``clock_warning`` on each run whose start is more than a day ahead of ``now``
    (UTC) or more than a day from the median start of the dated runs."""
    now = now or _dt.datetime.now(_dt.timezone.utc)
    starts = sorted(start for run in runs if (start := run.start) is not None)
    median = starts[len(starts) // 2] if starts else None
    for run in runs:
        start = run.start
        if start is None:
            continue
        if start - now > CLOCK_SKEW:
            run.clock_warning = (f"its clock says the run started {start:%Y-%m-%d %H:%M} UTC, "
                                 f"{(start - now).days} day(s) ahead of now: not used to date "
                                 "the report")
        elif median is not None and abs(start - median) > CLOCK_SKEW:
            run.clock_warning = (f"its clock says the run started {start:%Y-%m-%d %H:%M} UTC, "
                                 f"{abs(start - median).days} day(s) from the other runners': "
                                 "not used to date the report")


def tonight_date(runs: list[RunResults]) -> tuple[str, str | None]:
    """Tonight's date: the latest date among the inputs whose clock is trusted
    (``check_clocks``); inputs without one (a JUnit file without timestamp) take it. With
    no date anywhere: today (UTC), said in the problems. Never "unknown": history would
    then include tonight itself."""
    dates = [r.date for r in runs if r.date != "unknown-date" and not r.clock_warning]
    undated = [r.path for r in runs if r.date == "unknown-date" or r.clock_warning]
    if dates:
        why = (f"no start date in {', '.join(undated)}: taken as {max(dates)}, the other "
               "inputs' date") if undated else None
        return max(dates), why
    today = _dt.datetime.now(_dt.timezone.utc).date().isoformat()
    return today, (f"no start date in any input ({', '.join(undated) or 'none given'}): "
                   f"tonight taken as {today} (today, UTC)")


def compare(tonight: list[RunResults],
            nights: History | list[tuple[str, dict[str, RunResults]]]) -> Comparison:
    """Tonight's runs against the earlier nights (folded, or as (date, {runner: run}))."""
    history = nights if isinstance(nights, History) else History.of(nights)
    runs: dict[str, RunResults] = {}
    problems = Problems()
    check_clocks(tonight)
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
        if run.clock_warning:
            problems.append(f"{run.path}: runner {run.runner!r}: {run.clock_warning}")
    date, why = tonight_date(list(runs.values()))
    if why:
        problems.append(why)
    cells: dict[tuple[str, str], Cell] = {}
    skip_reasons: Counter[str] = Counter()
    tests: set[str] = set()
    for runner, run in runs.items():
        past = history.runners.get(runner)
        tests.update(run.tests)
        for test_id, res in run.tests.items():
            cell = _cell(test_id, runner, res, run, past, date)
            if cell.status != "passing" or cell.events_changed or cell.figures_changed:
                cells[(test_id, runner)] = cell
            if cell.reason is not None:
                skip_reasons[cell.reason] += 1
        for test_id in run.pending:  # collected, never ran: the night ended first
            cells[(test_id, runner)] = Cell(test_id, runner, "not-run", "not-run")
        if past is not None:
            _vanished(runner, run, past, cells)
    tests.update(test for test, _ in cells)
    return Comparison(date, sorted(runs), sorted(tests), cells, list(history.dates),
                      _trend(history, runs, date), problems, skip_reasons, runs, history)


def _cell(test_id: str, runner: str, res: TestResult, run: RunResults, past: Past | None,
          date: str) -> Cell:
    """Tonight's ``res`` of ``test_id`` on ``runner`` against its earlier nights."""
    letters = past.last_letters(test_id) if past is not None else ""
    history = [OUTCOME_OF[letter] for letter in letters] if letters else _NO_HISTORY
    last = letters.rstrip("-")[-1:]  # the last night that ran it ("" if none did)
    cell = Cell(test_id, runner, res.outcome, "passing", history=history,
                events_before=past.events.get(test_id) if past is not None and last else None,
                events_now=res.dispatch_events,
                figures_before=past.figures.get(test_id) if past is not None and last else None,
                figures_now=res.figures)
    cats = [c for c in (*(_category(h) for h in history), _category(res.outcome)) if c]
    flips = sum(1 for a, b in zip(cats, cats[1:], strict=False) if a != b)
    if flips >= FLAKY_FLIPS:
        cell.status = "flaky"
    elif res.failing:
        if last in FAILING_LETTERS:
            cell.status = "still-failing"
            cell.since = _streak_start(past, letters, date, FAILING_LETTERS)
        else:
            cell.status = "new-failure"
            if past is not None:
                _bisect_hint(cell, past, letters, run, res)
    elif res.outcome == "skipped":
        # ran on the last night this runner saw it, skips tonight: news, not noise
        cell.status = "newly-skipped" if last and last != "s" else "skipped"
        cell.reason = res.reason or "(no reason given)"
        cell.since = _streak_start(past, letters, date, frozenset("s"))
    elif last in FAILING_LETTERS:
        cell.status = "fixed"
    elif res.outcome == "xfailed":
        cell.status = "xfailed"
        # what it is expected to fail as: a known finding's card names the finding
        cell.reason = res.reason or None
    return cell


def changes_text(changes: list[dict[str, Any]]) -> str:
    """The bisect hint in one line: ``torch: 2.8.0 -> 2.9.0; cann: 8.2 -> 8.3``."""
    return "; ".join(f"{c['name']}: {c['then']} -> {c['now']}" for c in changes)


def _streak_start(past: Past | None, letters: str, date: str, same: frozenset[str]) -> str:
    """The first night of the run of nights, ending tonight, whose letter is in ``same``."""
    since = date
    if past is None:
        return since
    for night, letter in zip(reversed(past.nights), reversed(letters), strict=True):
        if letter not in same:
            break
        since = night.date
    return since


def _bisect_hint(cell: Cell, past: Past, letters: str, run: RunResults,
                 res: TestResult) -> None:
    """What changed in the runner's stack between the last night the test passed and
    tonight: the first question at 3 a.m. No bisect command for a failure filed as the
    runner's own (a required capability missing): no release could be its first bad one."""
    from harness.report.manifest_diff import differences

    for night, letter in zip(reversed(past.nights), reversed(letters), strict=True):
        if letter in PASSING_LETTERS:
            cell.last_passed = night.date
            cell.changes = differences(night.header.get("manifest"), run.header.get("manifest"))
            if cell.changes and res.category not in RUNNERS_OWN:
                filed = night_file(Path("HISTORY"), night.date, run.runner)
                cell.bisect_command = (f"npu-regress bisect {shlex.quote(str(filed))} "
                                       f"{shlex.quote(run.path)} --test {shlex.quote(cell.test)}")
            return


def _vanished(runner: str, run: RunResults, past: Past,
              cells: dict[tuple[str, str], Cell]) -> None:
    """Tests an earlier night of this runner had that tonight did not collect at all; on a
    night that ended early without saying what it collected, "not-run" (it may have been
    collected): never vanished for want of the night's end."""
    unknown = run.ended_early is not None and run.collected is None
    for test_id, letters in past.letters.items():
        if test_id not in run.tests and test_id not in run.pending:
            seen = len(letters.rstrip("-")) - 1
            cells[(test_id, runner)] = (
                Cell(test_id, runner, "not-run", "not-run", since=past.nights[seen].date)
                if unknown else Cell(test_id, runner, "absent", "vanished",
                                     since=past.nights[seen].date))


def _trend(history: History, tonight: dict[str, RunResults], date: str
           ) -> dict[str, list[dict[str, Any]]]:
    """Per runner: [{date, pass_rate, duration}] over the window, tonight last."""
    trend: dict[str, list[dict[str, Any]]] = {}
    for runner, past in history.runners.items():
        trend[runner] = [{"date": n.date, "pass_rate": n.pass_rate, "duration": n.duration,
                          "tests": n.tests} for n in past.nights]
    for runner, run in tonight.items():
        ran = [t for t in run.tests.values() if t.outcome != "skipped"]
        passed = sum(1 for t in ran if not t.failing)
        trend.setdefault(runner, []).append({
            "date": date, "pass_rate": passed / len(ran) if ran else None,
            "duration": run.duration, "tests": len(run.tests)})
    return trend
