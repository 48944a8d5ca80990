"""``npu-regress bisect GOOD BAD``: the command. Tonight's new failures are grouped by
signature, and each group is bisected on its own (``driver``): both nights must reproduce
here, test for test; then the culprit package, then its first bad release (or commit, with
``--source``). It writes ``bisect.json`` (one outcome per group) and a card line per group.
Exit status: 0 when every group names its first bad release, 2 when one cannot (and says
why), 3 when its inputs are unusable (1 stays Python's own: a crash of the bisect, the
harness's bug)."""

from __future__ import annotations

import argparse
import hashlib
import json
import shlex
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, NoReturn

from harness.bisect import endpoints as ends
from harness.bisect import index
from harness.bisect.card import card, summary
from harness.bisect.driver import CONFIDENCE, RUNS, Bisect, BudgetSpent
from harness.bisect.endpoints import COMMIT_PREFIX
from harness.bisect.git import resolve
from harness.bisect.groups import Group, by_signature
from harness.bisect.overlay import Overlays, installed_versions
from harness.bisect.search import SKIP
from harness.bisect.state import State, key, write_outcome
from harness.bisect.trial import Runner
from harness.stack.installed import manifest_key

FOUND, NOT_FOUND, UNUSABLE = 0, 2, 3


def _runs(text: str) -> int:
    try:
        runs = int(text)
    except ValueError:
        runs = 0
    if runs < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: give a whole number of runs, 1 or more")
    return runs


def _confidence(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 < value < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: give a chance between 0 and 1 (e.g. "
                                         f"{CONFIDENCE})")
    return value


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
    p.add_argument("--runs", type=_runs, default=RUNS, metavar="N",
                   help=f"runs of every probe, the two nights' reruns included (default "
                        f"{RUNS}): a probe whose runs disagree is flaky, never good or bad")
    p.add_argument("--confidence", type=_confidence, default=CONFIDENCE, metavar="P",
                   help=f"before a first bad release is named, the candidates on both sides "
                        f"of it are rerun until a run disagrees (flaky) or a candidate that "
                        f"ends the other way in half of its runs would have shown it with "
                        f"this chance (default {CONFIDENCE}: 5 runs)")
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
        out[dist] = (Path(checkout).resolve(), resolve(checkout, good), resolve(checkout, bad))
    return out


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
            ends.Change(manifest_key(dist), COMMIT_PREFIX + good, COMMIT_PREFIX + bad)]
    inputs = {"good": _digest(args.good), "bad": _digest(args.bad),
              "tests": endpoints.tests, "pytest_args": args.pytest_arg,
              "pip_options": args.pip_option, "sources": sorted(args.source),
              "revisions": args.revisions, "runs": args.runs,
              "confidence": args.confidence,
              # how failures are told apart (4: words decide, figures within FACTOR, a
              # stack's support status is not the failure's)
              "signature_rules": 4}
    folder = args.state or Path(".npu-regress-bisect") / (
        f"{endpoints.bad.runner or 'runner'}-"
        + hashlib.sha256(json.dumps(inputs).encode()).hexdigest()[:10])
    python = sys.executable
    overlays = Overlays(folder / "overlays", tuple(args.pip_option),
                        {d: s[0] for d, s in sources.items()}, python)
    installed = installed_versions(python)
    groups = by_signature(endpoints.bad, endpoints.tests)
    outcomes = []
    for group in groups:
        one = replace(endpoints, tests=list(group.tests))
        state = State.open(folder if len(groups) == 1 else folder / f"group-{group.name}",
                           {**inputs, "tests": one.tests}, fresh=args.fresh)
        runner = Runner(one.tests, args.rootdir.resolve(), overlays, installed,
                        args.trial_timeout, tuple(args.pytest_arg), python)
        bisect = Bisect(one, runner, state, args.budget, started, args.runs,
                        confidence=args.confidence)
        outcomes.append(_group(bisect, group, sources, tuple(args.pip_option)))
    outcome: dict[str, Any] = {
        "runner": endpoints.bad.runner, "good": str(args.good), "bad": str(args.bad),
        "good_date": endpoints.good.date, "bad_date": endpoints.bad.date,
        "tests": endpoints.tests, "notes": endpoints.notes, "runs": args.runs,
        "confidence": args.confidence,
        "changes": [{"package": c.distribution, "good": c.good, "bad": c.bad,
                     "not_revertible": c.not_revertible} for c in endpoints.changes],
        "state": str(folder),
        "resumed_trials": sum(g["resumed_trials"] for g in outcomes),
        "command": "npu-regress bisect " + shlex.join(sys.argv[2:] if sys.argv[1:2] == [
            "bisect"] else sys.argv[1:]),
        "status": "found" if all(g["status"] == "found" for g in outcomes) else "not-found",
        "why": " | ".join(g["why"] for g in outcomes) if len(outcomes) > 1
        else outcomes[0]["why"],
        "card": summary(outcomes), "groups": outcomes,
        "seconds": round(time.monotonic() - started, 1)}
    write_outcome(args.out or folder / "bisect.json", outcome)
    return (FOUND if outcome["status"] == "found" else NOT_FOUND), outcome


def _group(bisect: Bisect, group: Group, sources: dict[str, tuple[Path, str, str]],
           pip_options: tuple[str, ...]) -> dict[str, Any]:
    """One failure group's bisect, and its outcome (its card included)."""
    endpoints = bisect.endpoints
    outcome: dict[str, Any] = {
        "tests": list(group.tests), "signature": group.signature.to_dict(),
        "good_night_passed": all(not endpoints.good.tests[t].failing
                                 for t in group.tests if t in endpoints.good.tests),
        "state": str(bisect.state.folder), "resumed_trials": bisect.state.resumed}
    try:
        _search(bisect, sources, pip_options, outcome)
    except BudgetSpent as exc:
        outcome.update(status="not-found", why=f"{exc}: {len(bisect.state.trials)} trials "
                       f"kept in {bisect.state.folder}; run the same command again to resume")
    except index.IndexLookupError as exc:
        outcome.update(status="not-found", why=f"no release list: {exc}")
    outcome["trials"] = bisect.log
    # the search's candidates (a night's own versions, rerun to confirm the boundary, are not)
    outcome["candidates_tried"] = len({key(t["assignment"]) for t in bisect.log
                                       if t["role"].startswith("which release")
                                       and not t["role"].endswith("(confirm)")})
    outcome["skips"] = sum(1 for t in bisect.log if t["verdict"] == SKIP)
    outcome["flaky"] = bisect.flaky()
    outcome["trial_seconds"] = round(sum(t.seconds for t in bisect.state.trials.values()), 1)
    outcome["card"] = card(outcome)
    return outcome


def _search(bisect: Bisect, sources: dict[str, tuple[Path, str, str]],
            pip_options: tuple[str, ...], outcome: dict[str, Any]) -> None:
    endpoints = bisect.endpoints
    if not endpoints.revertible:
        fixed = "; ".join(f"{c} ({c.not_revertible})" for c in endpoints.fixed) or "nothing"
        outcome.update(status="not-found", why="no package a bisect can revert changed "
                       f"between the nights (changed: {fixed})")
        return
    why = bisect.references()
    if why:
        outcome.update(status="not-found", why=why)
        return
    units, untried = bisect.culprits()
    outcome["culprits"] = [c.distribution for unit in units for c in unit]
    if len(units) > 1:
        outcome["paired"] = [[c.distribution for c in unit] for unit in units if len(unit) > 1]
        if untried:
            alone = sorted({" + ".join(c.distribution for u in s for c in u) for s in untried})
            outcome.update(status="not-found", why=(
                f"tonight's versions of {' and '.join(outcome['culprits'])} fail together; "
                f"{', '.join(alone)} at tonight's could not be judged alone (skip or flaky), "
                "so one of them may be the cause by itself: not blamed, not cleared"))
        else:
            outcome.update(status="not-found", why="the failure needs tonight's versions of "
                           f"{' and '.join(outcome['culprits'])} together (each alone is not "
                           "enough): no single release to name")
            outcome["together"] = True
        return
    [unit] = units
    if len(unit) > 1:
        outcome["paired"] = [[c.distribution for c in unit]]
    culprit = unit[0]
    versions = bisect.versions(culprit, sources, pip_options)
    found = bisect.release(unit, versions)
    outcome["search"] = found
    outcome["confirmed"] = found["confirmed"]
    name = culprit.distribution
    other = (f"; the releases before it fail another way since {found['other_since']}"
             f" ({found['other_why']})" if found["other_since"] else "")
    if not found["found"]:
        unjudged = "; ".join(f"{v} ({found['why'][v]})" for v in found["unresolved"])
        candidates = [v for v in [*found["unresolved"], found["first_bad"]] if v]
        before = found["before"]
        after = (f", after {before} "
                 + ("failing another way" if found["other_since"] else "good")
                 if before and before not in found["unresolved"] else "")
        outcome.update(status="not-found", why=(
            f"{name}: the first bad for tonight's failure is one of {', '.join(candidates)} "
            f"(could not be judged: {unjudged}){after}{other}"))
        return
    last = (f"{found['last_good']} ends as on the good night" if found["last_good"]
            else "no release ended as on the good night")
    outcome.update(status="found",
                   first_bad={"package": name, "version": found["first_bad"]},
                   last_good={"package": name, "version": found["before"]},
                   last_good_other=found["other_why"],
                   other_since=found["other_since"],
                   why=f"{name} {found['first_bad']} is the first release whose tests end as "
                       f"tonight ({last}{other}); confirmed: {', '.join(found['confirmed'])}")


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
    for group in outcome["groups"]:
        print(f"npu-regress bisect: {', '.join(group['tests'])[:200]}: {group['card']}")
        print(f"npu-regress bisect:   {group['why']}")
    print(f"npu-regress bisect: written {args.out or Path(outcome['state']) / 'bisect.json'}")
    return status


if __name__ == "__main__":
    sys.exit(main())
