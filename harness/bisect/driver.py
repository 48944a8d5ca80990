"""The search driver of one failure group: its references (both nights rerun, each
reproducing its night test for test), the culprit package (delta debugging), then its first
bad release. Every probe runs ``runs`` times and counts only when its runs agree."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.bisect import endpoints as ends
from harness.bisect import index
from harness.bisect.endpoints import COMMIT_PREFIX
from harness.bisect.git import commits
from harness.bisect.search import BAD, FLAKY, GOOD, OTHER, SKIP, ddmin, first_bad, runs_for
from harness.bisect.signature import SAME
from harness.bisect.state import State, key
from harness.bisect.trial import Attempt, Ending, Reference, Runner, Trial, judge
from harness.stack.pairing import table as pairing_table

#: vllm-ascend release -> the vLLM its compatibility matrix pairs it with
PAIRS = {release: str(row.get("vllm", "")) for release, row in
         pairing_table().get("vllm_ascend", {}).items()}
#: a probe's runs by default: one observation never decides
RUNS = 2
#: the chance a boundary must reach before it is named (``--confidence``): that a candidate
#: ending the other way in at least half of its runs agreed in every confirmation run is
#: under 1 - CONFIDENCE
CONFIDENCE = 0.95
#: what a verdict is called where a confirmation says it
_SAID = {GOOD: "good", BAD: "ends as tonight", OTHER: "fails another way"}


class BudgetSpent(Exception):
    """The time budget ran out before the next trial (the state is kept: rerun resumes)."""


@dataclass
class Bisect:
    endpoints: ends.Endpoints
    runner: Runner
    state: State
    budget: float | None = None
    started: float = field(default_factory=time.monotonic)
    runs: int = RUNS
    reference: Reference | None = None
    confidence: float = CONFIDENCE
    #: every trial of this bisect, in order (resumed ones included), with its role
    log: list[dict[str, Any]] = field(default_factory=list)

    # -- trials -------------------------------------------------------------------------
    def _spent(self) -> None:
        if self.budget is not None and time.monotonic() - self.started > self.budget:
            raise BudgetSpent(f"the budget of {self.budget:.0f} s is spent")

    def _attempt(self, assignment: dict[str, str]) -> Attempt:
        """One run of ``assignment``, judged against the two nights' reruns (while there are
        none yet, it is a night's own rerun)."""
        self._spent()
        attempt = self.runner.run(assignment)
        if attempt.verdict != SKIP:
            attempt.verdict, attempt.why = (
                ("reference", "a night's own rerun") if self.reference is None
                else judge(attempt.tests, self.reference))
        return attempt

    def _log(self, role: str, trial: Trial, seconds: float) -> None:
        self.log.append({"role": role, "assignment": trial.assignment,
                         "verdict": trial.verdict, "why": trial.why,
                         "runs": [r.verdict for r in trial.runs],
                         "seconds": round(seconds, 1)})

    def _trial(self, assignment: dict[str, str], role: str) -> Trial:
        k = key(assignment)
        if k not in self.state.trials:
            attempts: list[Attempt] = []
            for _ in range(self.runs):
                attempts.append(self._attempt(assignment))
                if attempts[-1].verdict == SKIP:
                    break  # it could not be judged: another run would not judge it
            trial = Trial.of(assignment, attempts)
            self.state.trials[k] = trial
            self.state.save()
            shown = ", ".join(f"{d} {v}" for d, v in sorted(assignment.items()))
            print(f"npu-regress bisect: {role}: {shown or 'as installed'}: {trial.verdict} "
                  f"({trial.seconds:.0f} s, {len(trial.runs)} run"
                  f"{'s' * (len(trial.runs) != 1)})"
                  f"{': ' + trial.why if trial.verdict != GOOD else ''}", flush=True)
        trial = self.state.trials[k]
        self._log(role, trial, trial.seconds)
        return trial

    def _skip(self, assignment: dict[str, str], role: str, why: str) -> str:
        """A candidate that is not tried at all (said, kept like a trial)."""
        k = key(assignment)
        if k not in self.state.trials:
            self.state.trials[k] = Trial(assignment, SKIP, why)
            self.state.save()
            print(f"npu-regress bisect: {role}: skip: {why}", flush=True)
        self._log(role, Trial(assignment, SKIP, why), 0.0)
        return SKIP

    def verdict(self, assignment: dict[str, str], role: str) -> str:
        return self._trial(assignment, role).verdict

    def confirm(self, assignment: dict[str, str], role: str) -> str:
        """Rerun a boundary candidate until a run disagrees (FLAKY, with its rate) or
        ``runs_for(confidence)`` runs agree; a night's own rerun (a reference) is judged
        like any candidate first. Returns what its runs say ("good in 5 of 5 runs", or the
        flaky rate)."""
        need = runs_for(self.confidence)
        k = key(assignment)
        trial = self.state.trials.get(k) or self._trial(assignment, role + " (confirm)")
        runs = list(trial.runs)
        for run in runs:
            if run.verdict == "reference" and self.reference is not None:
                run.verdict, run.why = judge(run.tests, self.reference)
        if not runs or trial.verdict == SKIP:
            return confirmed_text(trial)
        more: list[Attempt] = []
        while len(runs) < need and len({r.verdict for r in runs}) == 1 \
                and runs[0].verdict != SKIP:
            more.append(self._attempt(assignment))
            runs.append(more[-1])
        confirmed = Trial.of(assignment, runs)
        self.state.trials[k] = confirmed
        self.state.save()
        if more:
            print(f"npu-regress bisect: {role} (confirm): "
                  f"{', '.join(f'{d} {v}' for d, v in sorted(assignment.items()))}: "
                  f"{confirmed_text(confirmed)} ({len(more)} more run"
                  f"{'s' * (len(more) != 1)})", flush=True)
        self._log(role + " (confirm)", confirmed, sum(r.seconds for r in more))
        return confirmed_text(confirmed)

    # -- the steps ----------------------------------------------------------------------
    def references(self) -> str | None:
        """Rerun both nights ``runs`` times; None when every run ends, test for test, as
        its night did (a failure with the same signature), else why not."""
        changes = self.endpoints.revertible
        nights = (("tonight's", {c.distribution: str(c.bad) for c in changes},
                   self.endpoints.bad),
                  ("the good night's", {c.distribution: str(c.good) for c in changes},
                   self.endpoints.good))
        reruns = {}
        for which, assignment, night in nights:
            trial = self._trial(assignment, f"{which} versions")
            if trial.verdict == SKIP:
                return f"{which} versions could not be run here: {trial.why}"
            why = _reproduces(which, night, trial, self.endpoints.tests)
            if why:
                return why
            reruns[which] = trial.tests
        self.reference = Reference(good=reruns["the good night's"], bad=reruns["tonight's"])
        if judge(self.reference.good, self.reference)[0] == BAD:
            fixed = ", ".join(f"{c} ({c.not_revertible})" for c in self.endpoints.fixed)
            return ("with the good night's versions of "
                    + ", ".join(c.distribution for c in changes)
                    + " the tests still end as tonight: the cause is not among the packages "
                    "a bisect can revert" + (f"; also changed: {fixed}" if fixed else ""))
        return None

    def units(self) -> list[list[ends.Change]]:
        """The changes, those that only move together as one unit: vllm-ascend and the vLLM
        its compatibility matrix pairs it with, when both nights follow the matrix ("do not
        mix components from different releases")."""
        changes = self.endpoints.revertible
        by_dist = {c.distribution: c for c in changes}
        ascend, vllm = by_dist.get("vllm-ascend"), by_dist.get("vllm")
        if ascend is None or vllm is None or not (
                PAIRS.get(str(ascend.good)) == vllm.good
                and PAIRS.get(str(ascend.bad)) == vllm.bad):
            return [[c] for c in changes]
        return [[ascend, vllm], *([c] for c in changes if c not in (ascend, vllm))]

    def culprits(self) -> tuple[list[list[ends.Change]], list[list[list[ends.Change]]]]:
        """The smallest set of units that still fails at tonight's versions, and the smaller
        sets that could not be judged."""
        units = self.units()
        if len(units) == 1:
            return units, []
        changes = self.endpoints.revertible

        def probe(subset: list[list[ends.Change]]) -> str:
            moved = [c for unit in subset for c in unit]
            assignment = {c.distribution: str(c.bad if c in moved else c.good)
                          for c in changes}
            return self.verdict(assignment, "which package: " + ", ".join(
                f"{c.distribution} {c.bad}" for c in moved) + " at tonight's")

        found = ddmin(units, probe)
        return found.culprits, found.untried

    def versions(self, change: ends.Change, sources: dict[str, tuple[Path, str, str]],
                 pip_options: tuple[str, ...]) -> list[str]:
        if change.distribution in sources:
            checkout, good, bad = sources[change.distribution]
            return [COMMIT_PREFIX + c for c in commits(checkout, good, bad)]
        return index.between(change.distribution, str(change.good), str(change.bad),
                             pip_options=pip_options)

    def release(self, unit: list[ends.Change], versions: list[str]) -> dict[str, Any]:
        """The first bad of ``versions`` of the unit's lead (a paired vLLM following it),
        the other changed packages at the good night's versions."""
        change = unit[0]
        held = {c.distribution: str(c.good) for c in self.endpoints.revertible}

        def at(i: int) -> dict[str, str]:
            assignment = {**held, change.distribution: versions[i]}
            for follower in unit[1:]:  # vLLM, as vllm-ascend's matrix pairs it
                assignment[follower.distribution] = PAIRS.get(versions[i], "")
            return assignment

        def probe(i: int) -> str:
            role = f"which release of {change.distribution}"
            if "" in at(i).values():
                return self._skip(at(i), role, f"{change.distribution} {versions[i]}: no vLLM "
                                  "pairing in its matrix (harness/stack/pairings.toml)")
            return self.verdict(at(i), role)

        def verdict_at(i: int) -> str:
            trial = self.state.trials.get(key(at(i)))
            return {"reference": (GOOD, BAD)[i > 0]}.get(trial.verdict, trial.verdict) \
                if trial is not None else (GOOD, BAD)[i > 0]

        confirmed: dict[str, str] = {}
        last = len(versions) - 1
        while True:  # each pass confirms the boundary, or finds a side of it flaky
            found = first_bad(len(versions), probe, (verdict_at(0), verdict_at(last)))
            if not found.found:
                break
            todo = [i for i in (found.before, found.first_bad)
                    if versions[i] not in confirmed]
            if not todo:
                break
            for i in todo:
                said = self.confirm(at(i), f"which release of {change.distribution}")
                confirmed[versions[i]] = f"{versions[i]} {said}"
            if all(verdict_at(i) == found.verdicts[i] for i in todo):
                break
            # a side turned out flaky (or another verdict): search again

        def why(i: int | None) -> str | None:
            trial = self.state.trials.get(key(at(i))) if i is not None else None
            return trial.why if trial is not None else None

        before = found.before
        other = found.other_since
        return {"versions": versions, "last_good": versions[found.last_good]
                if found.last_good >= 0 else None,
                "first_bad": versions[found.first_bad] if found.first_bad < len(versions)
                else None,
                "before": versions[before] if before >= 0 else None,
                # the releases before it that failed another way: said, never "good"
                "other_since": versions[other] if other is not None else None,
                "other_until": versions[before] if other is not None else None,
                "other_why": why(before) if other is not None else None,
                "other_unresolved": [versions[i] for i in found.other_unresolved],
                "unresolved": [versions[i] for i in found.unresolved],
                "tried": {versions[i]: v for i, v in found.verdicts.items()
                          if 0 < i < len(versions) - 1},
                "confirmed": [confirmed[v] for v in versions if v in confirmed],
                "why": {versions[i]: w for i in found.verdicts if (w := why(i))},
                "found": found.found}

    def flaky(self) -> list[str]:
        """Every probe whose runs disagreed, with its rate."""
        return [f"{', '.join(f'{d} {v}' for d, v in sorted(t.assignment.items()))}: {t.why}"
                for t in self.state.trials.values() if t.verdict == FLAKY]


def confirmed_text(trial: Trial) -> str:
    """A boundary candidate's runs, said: "good in 5 of 5 runs", or its flaky rate."""
    runs = len(trial.runs)
    if trial.verdict in _SAID:
        return f"{_SAID[trial.verdict]} in {runs} of {runs} runs"
    return trial.why


def _reproduces(which: str, night: Any, trial: Trial, tests: list[str]) -> str | None:
    """Why ``trial`` (a night's rerun) is no reference for that ``night``, or None: every
    run must end as the night, test for test: the same outcome, a failure with the same
    signature (a known finding's xfail that night fails on a rerun without the ledger), and
    never a skip. A test that does so in some runs only is flaky, said with its rate."""
    problems = []
    for test in tests:
        then = night.tests.get(test)
        if then is None:
            continue
        was = Ending.of(then)
        misses = [why for why in (_differs(was, run.tests.get(test, Ending("missing")))
                                  for run in trial.runs) if why]
        if not misses:
            continue
        runs = len(trial.runs)
        if len(misses) < runs:
            problems.append(f"{test} is flaky here: it ends as that night in "
                            f"{runs - len(misses)} of {runs} runs (else {misses[0]})")
        else:
            problems.append(f"{test}: {misses[0]}")
    if not problems:
        return None
    return (f"{which} results do not reproduce here with its versions: "
            + "; ".join(problems) + " (a flaky test, or what this machine does not share "
            "with the runner): no release is blamed")


def _differs(was: Ending, now: Ending) -> str | None:
    """How a rerun's end differs from the night's, or None."""
    if now.outcome in ("skipped", "missing"):
        return f"{now.outcome} on rerun: a test that does not run is no reference"
    if was.outcome == "xfailed":  # a known finding that night: the rerun has no ledger
        return None if now.failing else f"xfailed that night, {now.outcome} on rerun"
    if was.failing != now.failing or (not was.failing and was.outcome != now.outcome):
        return f"{was.outcome} that night, {now.outcome} on rerun"
    if was.failing and was.signature.compare(now.signature) != SAME:
        return "fails another way on rerun: " + was.signature.differences(now.signature)
    return None
