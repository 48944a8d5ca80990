"""Earlier nights, folded test by test as each is read.

A report compares tonight with up to 14 earlier nights; held whole, a night of 10^6 tests
costs about 270 MB, so the history would grow with nights x tests. Folded, each runner keeps
per distinct test one letter per night it ran (``p`` passed, ``f`` failed, ``-`` not
collected...) and the dispatch-event counts of the last night that ran it, and per night only
its header (the stack manifest) and its totals: memory follows the distinct tests.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Any

from harness.report.load import FAILING, Keep, RunResults, TestResult, worse

#: the figures drawn night to night for every test that has them (the report's drift
#: trends): a distance in ULP, and verl's k3 KL where rollout vs training reports it
TREND_FIGURES = ("max_ulp", "k3_kl")
#: one letter per outcome; "-": the test was not collected that night
LETTER = {"passed": "p", "failed": "f", "error": "e", "skipped": "s", "xfailed": "x",
          "xpassed": "X"}
OUTCOME_OF = {letter: outcome for outcome, letter in LETTER.items()} | {"-": "absent"}
FAILING_LETTERS = frozenset(LETTER[o] for o in FAILING)
PASSING_LETTERS = frozenset("px")


@dataclass(slots=True)
class PastNight:
    """One earlier night of one runner, without its tests."""

    date: str
    header: dict[str, Any]
    #: None: not a finite number (shown as n/a, not drawn)
    duration: float | None
    tests: int
    #: passed / ran (skips left out); None when nothing ran
    pass_rate: float | None


@dataclass
class Past:
    """One runner's earlier nights, oldest first, those without this runner left out."""

    nights: list[PastNight] = field(default_factory=list)
    #: test id -> one letter per night in ``nights``
    letters: dict[str, str] = field(default_factory=dict)
    #: test id -> dispatch-event counts of its last run (only tests that had some)
    events: dict[str, dict[str, int]] = field(default_factory=dict)
    #: test id -> the figures of its last run (only tests that had some)
    figures: dict[str, dict[str, float]] = field(default_factory=dict)
    #: test id -> trend figure -> night -> value (``TREND_FIGURES``; only tests with figures)
    trend: dict[str, dict[str, dict[str, float]]] = field(default_factory=dict)
    #: the night being folded: (date, summed durations)
    _open: tuple[str, float] | None = field(default=None, repr=False)

    def _column(self, date: str) -> int:
        """Where the night ``date`` goes: a second file of the same runner and night (two
        results files naming one runner) is merged into the night already closed."""
        merged = bool(self.nights) and self.nights[-1].date == date
        return len(self.nights) - 1 if merged else len(self.nights)

    def fold(self, date: str, result: TestResult) -> None:
        """One test line of the night ``date`` (then ``close`` that night)."""
        duration = self._open[1] if self._open is not None else 0.0
        self._open = (date, duration + result.duration)
        width, letter = self._column(date), LETTER[result.outcome]
        have = self.letters.get(result.id)
        # interned: 10^6 tests share a few dozen letter strings ("ppp", "pfp"...)
        if have is None:
            self.letters[result.id] = sys.intern("-" * width + letter)
        elif len(have) == width:
            self.letters[result.id] = sys.intern(have + letter)
        elif have[-1] != "-" and worse(OUTCOME_OF[have[-1]], result.outcome):
            return  # seen this night already, as bad or worse: the worst is kept
        else:
            self.letters[result.id] = sys.intern(have[:-1] + letter)
        if result.dispatch_events is not None:
            self.events[result.id] = result.dispatch_events
        else:
            self.events.pop(result.id, None)
        if result.figures is not None:
            self.figures[result.id] = result.figures
            for name in TREND_FIGURES:
                if name in result.figures:
                    nights = self.trend.setdefault(result.id, {}).setdefault(name, {})
                    nights[date] = max(result.figures[name], nights.get(date, float("-inf")))
        else:
            self.figures.pop(result.id, None)

    def close(self, date: str, run: RunResults) -> None:
        """End the night ``date`` of this runner: tests it did not collect get "-"."""
        width = self._column(date)
        tests = ran = passed = 0
        for test_id, letters in self.letters.items():
            if len(letters) == width:
                self.letters[test_id] = letters = sys.intern(letters + "-")
            if letters[-1] == "-":
                continue
            tests += 1
            if letters[-1] != "s":
                ran += 1
                passed += letters[-1] not in FAILING_LETTERS
        summed = self._open[1] if self._open is not None else 0.0
        duration = run.duration if run.footer else summed
        if width < len(self.nights):  # merged into the night already closed
            earlier = self.nights[-1].duration
            duration = None if duration is None or earlier is None else duration + earlier
            del self.nights[-1]
        self.nights.append(PastNight(date, run.header, duration, tests,
                                     passed / ran if ran else None))
        self._open = None

    def last_letters(self, test_id: str) -> str:
        """The test's letters, one per night ("-" for each night if it never ran)."""
        return self.letters.get(test_id) or "-" * len(self.nights)


@dataclass
class History:
    """Every runner's earlier nights (``dates``: the nights read, oldest first)."""

    dates: list[str] = field(default_factory=list)
    runners: dict[str, Past] = field(default_factory=dict)

    def past(self, runner: str) -> Past:
        past = self.runners.get(runner)
        if past is None:
            past = self.runners[runner] = Past()
        return past

    def keeper(self, date: str, tonight: dict[str, RunResults] | None = None) -> Keep:
        """For ``load_results(keep=...)``: each test line folded straight in. A test id that
        ``tonight`` (runner -> run) also has is kept as tonight's string, not a second copy
        of it (a tenth of the memory of a 10^6-test night)."""
        tonight = tonight or {}

        def keep(run: RunResults, _where: str, _record: dict[str, Any],
                 result: TestResult) -> None:
            same = tonight.get(run.runner)
            twin = same.tests.get(result.id) if same is not None else None
            if twin is not None:
                result.id = twin.id
            self.past(run.runner).fold(date, result)

        return keep

    def add(self, date: str, runs: dict[str, RunResults]) -> None:
        """Fold in one night of runs already loaded; nights must come oldest first."""
        self.dates.append(date)
        for run in runs.values():
            past = self.past(run.runner)
            for result in run.tests.values():
                past.fold(date, result)
            past.close(date, run)

    @classmethod
    def of(cls, nights: list[tuple[str, dict[str, RunResults]]]) -> History:
        history = cls()
        for date, runs in sorted(nights, key=lambda night: night[0]):
            history.add(date, runs)
        return history
