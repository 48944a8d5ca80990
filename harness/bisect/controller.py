"""``npu-regress bisect GOOD BAD``: the controller. It checks that tonight's failure
reproduces here and that the good night's versions of the changed packages make it go away,
finds the culprit package (delta debugging), then its first bad release (or commit, with
``--source``), and writes ``bisect.json`` and a one-line card. Exit status: 0 when it names
the first bad release, 2 when it cannot (and says why), 3 when its inputs are unusable (1
stays Python's own: a crash of the bisect, the harness's bug)."""

from __future__ import annotations

import argparse
import hashlib
import json
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

from harness.bisect import endpoints as ends
from harness.bisect import index
from harness.bisect.endpoints import COMMIT_PREFIX
from harness.bisect.overlay import Overlays
from harness.bisect.search import BAD, FLAKY, GOOD, SKIP, ddmin, first_bad
from harness.bisect.state import State, key, write_outcome
from harness.bisect.trial import FAILING, Reference, Runner, Trial, judge
from harness.stack.pairing import table as pairing_table

#: vllm-ascend release -> the vLLM its compatibility matrix pairs it with
PAIRS = {release: str(row.get("vllm", "")) for release, row in
         pairing_table().get("vllm_ascend", {}).items()}

FOUND, NOT_FOUND, UNUSABLE = 0, 2, 3


class BudgetSpent(Exception):
    """The time budget ran out before the next trial (the state is kept: rerun resumes)."""


@dataclass
class Bisect:
    endpoints: ends.Endpoints
    runner: Runner
    state: State
    budget: float | None = None
    started: float = field(default_factory=time.monotonic)
    reference: Reference | None = None
    #: every trial of this bisect, in order (resumed ones included), with its role
    log: list[dict[str, Any]] = field(default_factory=list)

    # -- trials -------------------------------------------------------------------------
    def _trial(self, assignment: dict[str, str], role: str, *, rerun: bool = False) -> Trial:
        k = key(assignment)
        store = self.state.reruns if rerun else self.state.trials
        if k not in store:
            if self.budget is not None and time.monotonic() - self.started > self.budget:
                raise BudgetSpent(f"the budget of {self.budget:.0f} s is spent")
            tests, why, seconds, status = self.runner.run(assignment)
            if why is not None:
                verdict = SKIP
            elif self.reference is None:
                verdict, why = "reference", "a night's own rerun"
            else:
                verdict, why = judge(tests, self.reference)
            store[k] = Trial(assignment, verdict, why, tests, seconds, status)
            self.state.save()
            shown = ", ".join(f"{d} {v}" for d, v in sorted(assignment.items()))
            print(f"npu-regress bisect: {role}: {shown or 'as installed'}: {verdict} "
                  f"({seconds:.0f} s){': ' + why if verdict != GOOD else ''}", flush=True)
        trial = store[k]
        self.log.append({"role": role, "rerun": rerun, **{
            "assignment": trial.assignment, "verdict": trial.verdict, "why": trial.why,
            "seconds": round(trial.seconds, 1)}})
        return trial

    def _skip(self, assignment: dict[str, str], role: str, why: str) -> str:
        """A candidate that is not tried at all (said, kept like a trial)."""
        k = key(assignment)
        if k not in self.state.trials:
            self.state.trials[k] = Trial(assignment, SKIP, why)
            self.state.save()
            print(f"npu-regress bisect: {role}: skip: {why}", flush=True)
        self.log.append({"role": role, "rerun": False, "assignment": assignment,
                         "verdict": SKIP, "why": why, "seconds": 0.0})
        return SKIP

    def verdict(self, assignment: dict[str, str], role: str) -> str:
        return self._trial(assignment, role).verdict

    # -- the steps ----------------------------------------------------------------------
    def references(self) -> str | None:
        """Rerun both nights; None when they differ as the results say, else why not."""
        changes = self.endpoints.revertible
        bad = self._trial({c.distribution: str(c.bad) for c in changes}, "tonight's versions")
        good = self._trial({c.distribution: str(c.good) for c in changes},
                           "the good night's versions")
        for which, trial in (("tonight's", bad), ("the good night's", good)):
            if trial.verdict == SKIP:
                return f"{which} versions could not be run here: {trial.why}"
        for which, trial, night in (("tonight's", bad, self.endpoints.bad),
                                    ("the good night's", good, self.endpoints.good)):
            # the reruns run without the ledger: a known finding's xfail is its failure
            differ = [f"{t} {night.tests[t].outcome} that night, {trial.tests[t].outcome} "
                      "on rerun" for t in self.endpoints.tests if t in night.tests
                      and (night.tests[t].outcome in (*FAILING, "xfailed"))
                      != (trial.tests[t].outcome in FAILING)]
            if differ:
                return (f"{which} results do not reproduce here with its versions: "
                        + "; ".join(differ) + " (a flaky test, or what this machine does "
                        "not share with the runner)")
        self.reference = Reference(good=good.tests, bad=bad.tests)
        if judge(good.tests, self.reference)[0] == BAD:
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

    def culprits(self) -> list[list[ends.Change]]:
        units = self.units()
        if len(units) == 1:
            return units
        changes = self.endpoints.revertible

        def probe(subset: list[list[ends.Change]]) -> str:
            moved = [c for unit in subset for c in unit]
            assignment = {c.distribution: str(c.bad if c in moved else c.good)
                          for c in changes}
            return self.verdict(assignment, "which package: " + ", ".join(
                f"{c.distribution} {c.bad}" for c in moved) + " at tonight's")

        return ddmin(units, probe)

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

        def rerun(i: int) -> str:
            return self._trial(at(i), f"rerun of {change.distribution} {versions[i]}",
                               rerun=True).verdict

        found = first_bad(len(versions), probe, rerun)
        return {"versions": versions, "last_good": versions[found.last_good],
                "first_bad": versions[found.first_bad],
                "unresolved": [versions[i] for i in found.unresolved],
                "tried": {versions[i]: v for i, v in found.verdicts.items()
                          if 0 < i < len(versions) - 1},
                "found": found.found}


def commits(checkout: Path, good: str, bad: str) -> list[str]:
    """``[good, ..., bad]``: the first-parent commits from good to bad, oldest first
    (``good`` and ``bad`` as ``_sources`` resolved them)."""
    done = subprocess.run(["git", "-C", str(checkout), "rev-list", "--first-parent",
                           "--reverse", f"{good}..{bad}"], capture_output=True, text=True,
                          check=False)
    if done.returncode != 0:
        raise ends.BisectInputError(f"--source {checkout}: git cannot list {good}..{bad}: "
                                    + done.stderr.strip()[-300:])
    return [good, *done.stdout.split()]


def installed_versions(python: str) -> dict[str, str | None]:
    """This environment's versions of the manifest's packages, by distribution (read in a
    fresh interpreter, as the manifest reads them)."""
    code = ("import json; from harness.plugin.stack_manifest import PACKAGES, read_packages;"
            "e = read_packages(); print(json.dumps({PACKAGES.get(k, k): v['version'] "
            "for k, v in e.items()}))")
    done = subprocess.run([python, "-c", code], capture_output=True, text=True, check=False)
    try:
        return json.loads(done.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {}


def card(outcome: dict[str, Any]) -> str:
    """The report card's line."""
    tried = outcome.get("candidates_tried", 0)
    skips = outcome.get("skips", 0)
    tail = f"{tried} candidate{'s' * (tried != 1)} tried, {skips} skip{'s' * (skips != 1)}"
    if outcome.get("flaky"):
        tail += f", {len(outcome['flaky'])} flaky (rerun disagreed: {', '.join(outcome['flaky'])})"
    if outcome["status"] == "found":
        first, last = outcome["first_bad"], outcome["last_good"]
        # "good" only where the good night's tests passed; a test that failed another way
        # that night (a fix bisected, an API that did not exist yet) ended "as that night"
        good = "good" if outcome.get("good_night_passed", True) else "as the good night"
        return (f"first bad: {first['package']} {first['version']} ({last['version']} "
                f"{good}), {tail}")
    if outcome.get("culprits"):
        return f"culprit: {', '.join(outcome['culprits'])}; no single release: " \
            f"{outcome['why']}; {tail}"
    return f"not found: {outcome['why']}; {tail}"


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        """A usage error is an unusable input (3), never "not found" (argparse's 2)."""
        self.print_usage(sys.stderr)
        self.exit(UNUSABLE, f"{self.prog}: error: {message}\n")


def _parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="npu-regress bisect",
        description="From a red night to the first bad release: which changed package, "
                    "then which release of it, makes tonight's failures. Exit 0 found, 2 "
                    "not found (said why), 3 unusable inputs.")
    p.add_argument("nights", type=Path, nargs="+", metavar="RESULTS",
                   help="GOOD BAD: the runner's last green results.jsonl and tonight's; with "
                        "--history, tonight's only")
    p.add_argument("--history", type=Path, metavar="DIR",
                   help="the report's history folder: the good night is the latest night "
                        "filed there for tonight's runner")
    p.add_argument("--test", action="append", default=[], metavar="ID",
                   help="a test id to bisect (repeatable; default: tonight's new failures)")
    p.add_argument("--rootdir", type=Path, default=Path.cwd(),
                   help="where the tests are run from (default: here)")
    p.add_argument("--state", type=Path, help="state folder (default: "
                   ".npu-regress-bisect/<runner>-<inputs digest>); rerun to resume")
    p.add_argument("--out", type=Path, help="bisect.json (default: in the state folder)")
    p.add_argument("--quiet-when-nothing", action="store_true",
                   help="exit 0 when tonight has no new failure (the nightly's step)")
    p.add_argument("--fresh", action="store_true", help="discard the state folder's trials")
    p.add_argument("--budget", type=float, metavar="SECONDS",
                   help="stop before a trial once this much time is spent (exit 2; rerun "
                        "to resume)")
    p.add_argument("--trial-timeout", type=float, default=900.0, metavar="SECONDS",
                   help="one trial's limit (default 900); a trial past it is a skip")
    p.add_argument("--pip-option", action="append", default=[], metavar="OPT",
                   help="passed to pip for lookups and installs (e.g. --index-url=URL)")
    p.add_argument("--pytest-arg", action="append", default=[], metavar="ARG",
                   help="passed to each trial's pytest")
    p.add_argument("--source", action="append", default=[], metavar="DIST=CHECKOUT",
                   help="bisect DIST's commits in this git checkout instead of its "
                        "releases; the nights' revisions come from --revisions")
    p.add_argument("--revisions", metavar="GOOD..BAD",
                   help="with --source: the good and tonight's commits")
    p.add_argument("--any-runner", action="store_true",
                   help="accept results of two runner names")
    return p


def _sources(args: argparse.Namespace) -> dict[str, tuple[Path, str, str]]:
    out = {}
    for item in args.source:
        dist, _, checkout = item.partition("=")
        if not checkout or not Path(checkout, ".git").exists():
            raise ends.BisectInputError(f"--source {item!r}: give DIST=CHECKOUT, a git "
                                        "checkout of DIST (e.g. vllm-ascend=../vllm-ascend)")
        good, _, bad = (args.revisions or "").partition("..")
        if not good or not bad:
            raise ends.BisectInputError(f"--source {item}: name the two commits with "
                                        "--revisions GOOD..BAD")
        out[dist] = (Path(checkout).resolve(), _commit(checkout, good), _commit(checkout, bad))
    return out


def _commit(checkout: str, rev: str) -> str:
    done = subprocess.run(["git", "-C", checkout, "rev-parse", "--verify", f"{rev}^{{commit}}"],
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise ends.BisectInputError(f"--revisions: {rev!r} is not a commit of {checkout}")
    return done.stdout.strip()


def _nights(args: argparse.Namespace) -> tuple[Path | None, Path]:
    """The good night's path (None: from ``--history``) and tonight's."""
    if args.history is None:
        if len(args.nights) != 2:
            raise ends.BisectInputError("give two results files, the good night's and "
                                        "tonight's (or tonight's with --history DIR)")
        return args.nights[0], args.nights[1]
    if len(args.nights) != 1:
        raise ends.BisectInputError("with --history give tonight's results file only")
    return None, args.nights[0]


def run(args: argparse.Namespace) -> tuple[int, dict[str, Any]]:
    started = time.monotonic()
    endpoints = ends.read(*_nights(args), args.test or None, any_runner=args.any_runner,
                          history=args.history)
    args.good, args.bad = endpoints.good_path, Path(endpoints.bad.path)
    sources = _sources(args)
    for dist, (_, good, bad) in sources.items():  # a checkout's package: its commits decide
        endpoints.changes = [c for c in endpoints.changes if c.distribution != dist] + [
            ends.Change(ends.manifest_key(dist), COMMIT_PREFIX + good, COMMIT_PREFIX + bad)]
    inputs = {"good": _digest(args.good), "bad": _digest(args.bad),
              "tests": endpoints.tests, "pytest_args": args.pytest_arg,
              "pip_options": args.pip_option, "sources": sorted(args.source),
              "revisions": args.revisions}
    folder = args.state or Path(".npu-regress-bisect") / (
        f"{endpoints.bad.runner or 'runner'}-"
        + hashlib.sha256(json.dumps(inputs).encode()).hexdigest()[:10])
    state = State.open(folder, inputs, fresh=args.fresh)
    python = sys.executable
    overlays = Overlays(folder / "overlays", tuple(args.pip_option),
                        {d: s[0] for d, s in sources.items()}, python)
    runner = Runner(endpoints.tests, args.rootdir.resolve(), overlays,
                    installed_versions(python), args.trial_timeout, tuple(args.pytest_arg),
                    python)
    bisect = Bisect(endpoints, runner, state, args.budget)
    outcome: dict[str, Any] = {
        "runner": endpoints.bad.runner, "good": str(args.good), "bad": str(args.bad),
        "good_date": endpoints.good.date, "bad_date": endpoints.bad.date,
        "tests": endpoints.tests, "notes": endpoints.notes,
        "good_night_passed": all(not endpoints.good.tests[t].failing
                                 for t in endpoints.tests if t in endpoints.good.tests),
        "changes": [{"package": c.distribution, "good": c.good, "bad": c.bad,
                     "not_revertible": c.not_revertible} for c in endpoints.changes],
        "state": str(folder), "resumed_trials": state.resumed,
        "command": "npu-regress bisect " + shlex.join(sys.argv[2:] if sys.argv[1:2] == [
            "bisect"] else sys.argv[1:])}
    status = NOT_FOUND
    try:
        status = _search(bisect, endpoints, sources, tuple(args.pip_option), outcome)
    except BudgetSpent as exc:
        outcome.update(status="not-found", why=f"{exc}: {len(state.trials)} trials kept in "
                       f"{folder}; run the same command again to resume")
    except index.IndexLookupError as exc:
        outcome.update(status="not-found", why=f"no release list: {exc}")
    outcome["trials"] = bisect.log
    outcome["candidates_tried"] = len({key(t["assignment"]) for t in bisect.log
                                       if t["role"].startswith("which release")})
    outcome["skips"] = sum(1 for t in bisect.log if t["verdict"] in (SKIP, FLAKY)
                           and not t["rerun"])
    outcome["flaky"] = sorted(k for k, again in state.reruns.items()
                              if k in state.trials and again.verdict != state.trials[k].verdict)
    outcome["seconds"] = round(time.monotonic() - started, 1)
    outcome["trial_seconds"] = round(sum(t.seconds for t in state.trials.values())
                                     + sum(t.seconds for t in state.reruns.values()), 1)
    outcome["card"] = card(outcome)
    write_outcome(args.out or folder / "bisect.json", outcome)
    return status, outcome


def _search(bisect: Bisect, endpoints: ends.Endpoints,
            sources: dict[str, tuple[Path, str, str]], pip_options: tuple[str, ...],
            outcome: dict[str, Any]) -> int:
    if not endpoints.revertible:
        fixed = "; ".join(f"{c} ({c.not_revertible})" for c in endpoints.fixed) or "nothing"
        outcome.update(status="not-found", why="no package a bisect can revert changed "
                       f"between the nights (changed: {fixed})")
        return NOT_FOUND
    why = bisect.references()
    if why:
        outcome.update(status="not-found", why=why)
        return NOT_FOUND
    units = bisect.culprits()
    outcome["culprits"] = [c.distribution for unit in units for c in unit]
    if len(units) > 1:
        outcome["paired"] = [[c.distribution for c in unit] for unit in units if len(unit) > 1]
        outcome.update(status="not-found", why="the failure needs tonight's versions of "
                       f"{' and '.join(outcome['culprits'])} together (each alone is not "
                       "enough): no single release to name")
        return NOT_FOUND
    [unit] = units
    if len(unit) > 1:
        outcome["paired"] = [[c.distribution for c in unit]]
    culprit = unit[0]
    versions = bisect.versions(culprit, sources, pip_options)
    found = bisect.release(unit, versions)
    outcome["search"] = found
    if not found["found"]:
        outcome.update(status="not-found", why=(
            f"{culprit.distribution}: the first bad is one of "
            f"{', '.join(found['unresolved'] + [found['first_bad']])} (the ones before "
            f"{found['first_bad']} could not be judged), after {found['last_good']} good"))
        return NOT_FOUND
    outcome.update(status="found",
                   first_bad={"package": culprit.distribution, "version": found["first_bad"]},
                   last_good={"package": culprit.distribution, "version": found["last_good"]},
                   why=f"{culprit.distribution} {found['first_bad']} is the first release "
                       f"whose tests end as tonight ({found['last_good']} ends as on the "
                       "good night)")
    return FOUND


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()[:16] if path.is_file() else ""


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        status, outcome = run(args)
    except ends.NothingToBisect as exc:
        print(f"npu-regress bisect: {exc}", file=sys.stderr)
        return 0 if args.quiet_when_nothing else UNUSABLE
    except ends.BisectInputError as exc:
        print(f"npu-regress bisect: {exc}", file=sys.stderr)
        return UNUSABLE
    if outcome["resumed_trials"]:
        print(f"npu-regress bisect: resumed: {outcome['resumed_trials']} trials from "
              f"{outcome['state']}")
    print(f"npu-regress bisect: {outcome['card']}")
    print(f"npu-regress bisect: {outcome['why']}")
    print(f"npu-regress bisect: written {args.out or Path(outcome['state']) / 'bisect.json'}")
    return status


if __name__ == "__main__":
    sys.exit(main())
