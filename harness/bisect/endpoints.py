"""The two nights a bisect starts from: the last green and tonight's results of one runner.
What changed between their stack manifests (each change revertible here or not, and why),
and which tests to bisect (by default tonight's new failures: failing tonight, run and not
failing on the good night)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from harness.report.history_folder import latest_night
from harness.report.load import RunResults, load_any
from harness.report.manifest_diff import differences
from harness.report.schema import RUNNERS_OWN
from harness.stack.installed import distribution, entry_version
from harness.stack.sources import SOURCE_PACKAGES

#: manifest entries a bisect cannot put at another version here, and why
NOT_REVERTIBLE = {
    "python": "the interpreter: rerun on the good night's Python by hand",
    "torch": "never replaced: an Ascend image ships torch and torch_npu as a matched pair",
    "torch_npu": "never replaced: an Ascend image ships torch and torch_npu as a matched pair",
    "batch_invariant_ops": "the AscendC ops package: built against CANN, not on the index",
    "npu-regress": "the harness itself: check out the good night's npu-regress and rerun",
    "soc": "the chip", "family": "the chip", "driver": "the NPU driver: installed by hand",
    "cann": "CANN: installed by hand",
}


#: a version naming a commit of a ``--source`` checkout
COMMIT_PREFIX = "git:"


class BisectInputError(ValueError):
    """Inputs a bisect cannot start from (named, with the fix)."""


class NothingToBisect(BisectInputError):
    """Tonight has no new failure against the good night."""


@dataclass(frozen=True)
class Change:
    """One manifest entry that differs between the nights."""

    key: str
    good: str | None
    bad: str | None

    @property
    def distribution(self) -> str:
        return distribution(self.key)

    @property
    def kind(self) -> str:
        """How a candidate is put in place: ``wheel`` or ``sources``."""
        return "sources" if self.distribution in SOURCE_PACKAGES else "wheel"

    @property
    def not_revertible(self) -> str | None:
        """Why this change cannot be reverted here, or None."""
        if str(self.good).startswith(COMMIT_PREFIX):
            return None  # a --source checkout's commits: put in place by git archive
        if self.key in NOT_REVERTIBLE:
            return NOT_REVERTIBLE[self.key]
        if self.key == "packages":
            return "the manifest's child failed that night: no package versions read"
        if self.good is None or self.bad is None:
            return (f"{'installed' if self.good is None else 'removed'} tonight: a bisect "
                    "varies versions, not presence")
        return None

    def __str__(self) -> str:
        return f"{self.distribution} {self.good} -> {self.bad}"


@dataclass
class Endpoints:
    good: RunResults
    bad: RunResults
    changes: list[Change]
    tests: list[str]
    notes: list[str] = field(default_factory=list)
    #: the good night's file (given, or found in the history)
    good_path: Path | None = None

    @property
    def revertible(self) -> list[Change]:
        return [c for c in self.changes if c.not_revertible is None]

    @property
    def fixed(self) -> list[Change]:
        return [c for c in self.changes if c.not_revertible is not None]


def _load(path: Path, which: str) -> RunResults:
    if not path.is_file():
        raise BisectInputError(f"{which} results {path}: no such file (give the results.jsonl "
                               "of the runner's last green night and of tonight)")
    run = load_any(path)
    if run.refused:
        raise BisectInputError(f"{which} results {path}: {run.refused}")
    if not isinstance(run.header.get("manifest"), dict):
        raise BisectInputError(f"{which} results {path}: no stack manifest in its header "
                               "(a JUnit file or an old results file): give a results.jsonl "
                               "written by npu-regress")
    return run


def new_failures(good: RunResults, bad: RunResults) -> list[str]:
    """Failing tonight, run and not failing (nor skipped) on the good night."""
    return sorted(test_id for test_id, result in bad.tests.items()
                  if result.failing and test_id in good.tests
                  and not good.tests[test_id].failing
                  and good.tests[test_id].outcome != "skipped")


def read(good_path: Path | None, bad_path: Path, tests: list[str] | None = None, *,
         any_runner: bool = False, history: Path | None = None) -> Endpoints:
    """The two nights; with ``history`` (and no ``good_path``) the good night is tonight's
    runner's latest night filed there."""
    bad = _load(bad_path, "tonight's")
    if good_path is None:
        good_path = latest_night(history, bad.runner, bad.date or None) \
            if history is not None else None
        if good_path is None:
            raise BisectInputError(f"--history {history}: no earlier night of runner "
                                   f"{bad.runner!r} filed there (npu-regress report history "
                                   "add files them)")
    good = _load(good_path, "the good night's")
    notes = []
    if good.runner != bad.runner:
        if not any_runner:
            raise BisectInputError(
                f"the two results are from different runners ({good.runner!r}, "
                f"{bad.runner!r}): a bisect compares one runner's nights; pass "
                "--any-runner if they are the same machine under two names")
        notes.append(f"runners differ: {good.runner} (good), {bad.runner} (tonight)")
    then, now = good.header["manifest"], bad.header["manifest"]
    changes = [Change(d["name"], entry_version(then.get(d["name"])),
                      entry_version(now.get(d["name"])))
               for d in differences(then, now)]
    # a revision-only change (same version, another commit) reads the same here
    changes = [c for c in changes if c.good != c.bad or c.key in NOT_REVERTIBLE]
    chosen = list(tests) if tests else new_failures(good, bad)
    for test in tests or []:
        then_end, now_end = good.tests.get(test), bad.tests.get(test)
        if then_end is not None and now_end is not None and not then_end.failing \
                and then_end.outcome == now_end.outcome:
            raise BisectInputError(
                f"nothing to bisect: --test {test} {then_end.outcome} on the good night "
                f"({good_path}) and {now_end.outcome} tonight ({bad_path}); a bisect looks "
                "for the release where a test's end changed: name a test that ends "
                "otherwise tonight")
    runners_own = [t for t in chosen if (end := bad.tests.get(t)) is not None
                   and end.failing and end.category in RUNNERS_OWN]
    if runners_own:
        said = ", ".join(f"{t} ({bad.tests[t].category})" for t in runners_own)
        if len(runners_own) == len(chosen):
            raise BisectInputError(
                f"nothing to bisect: tonight's failure of {said} is the runner's (a capability "
                "it declares required is missing), not a release's: give the runner what it "
                "requires, or name another test with --test ID")
        notes.append(f"left out, the runner's failures, not a release's: {said}")
        chosen = [t for t in chosen if t not in runners_own]
    if not chosen:
        raise NothingToBisect(
            f"no test to bisect: {bad_path} has no new failure against {good_path} (failing "
            "tonight, passing on the good night); name the tests with --test ID")
    return Endpoints(good, bad, changes, chosen, notes, good_path=good_path)
