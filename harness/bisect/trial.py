"""One trial: the tests rerun in a fresh ``pytest`` with a candidate's versions overlaid,
and its verdict. The ledger of known findings is left out of the rerun (a known finding
fails as it is instead of being expected), so that the verdict reads the property itself.

A trial's tests are judged against the two nights' reruns by their failure signatures
(``harness.bisect.signature``: the whole statement of a failure, volatile parts masked):

- BAD: a test ends as tonight (the same signature, not filed as the harness's own problem);
- GOOD: every test ends as on the good night;
- OTHER: a test fails another way that partly agrees with tonight's (the same check saying
  other things: an earlier form of the bug, or another bug of the same check): not tonight's
  failure, and said as such, never taken for good;
- SKIP otherwise: not installable, not collected, pytest itself failing (exit 2-5), timed
  out, the overlay not taking (a package imported from elsewhere than its overlay, or the
  results' manifest showing another version), or a failure of another kind (an import error
  of an old release is not tonight's bug)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from harness.bisect.endpoints import COMMIT_PREFIX
from harness.bisect.overlay import OverlayError, Overlays
from harness.bisect.search import BAD, FLAKY, GOOD, OTHER, SKIP
from harness.bisect.signature import DIFFERENT, PARTLY, SAME, Signature
from harness.isolation.failure_text import failure_lines
from harness.isolation.reaper import descendants, end_session
from harness.report.load import RunResults, TestResult, load_any
from harness.report.schema import RUNNERS_OWN
from harness.stack.installed import entry_version, manifest_key

#: categories that say a failure is ours (the harness, the stand-in), never a release's
OURS = ("harness", "stand-in-limit")
#: outcomes that are a failure
FAILING = ("failed", "error")
#: pytest's exit statuses that say the run itself went wrong (interrupted, internal error,
#: usage error, nothing collected), as vllm-ascend's tools/bisect counts them
PYTEST_TROUBLE = {2: "interrupted", 3: "internal error", 4: "usage error",
                  5: "no tests collected"}
#: grace between SIGTERM and SIGKILL for a trial's processes (the harness ends its isolated
#: children and writes its footer on SIGTERM)
END_GRACE_S = 10.0


@dataclass
class Ending:
    """How one test ended in a trial."""

    outcome: str  # an outcome of the results schema, or "missing"
    category: str = ""
    lines: list[str] = field(default_factory=list)
    #: a drift that grew: the figures that left their envelope, each with how far over its
    #: bound it went (value / bound; the value where the bound is 0)
    grew: dict[str, float] = field(default_factory=dict)

    @property
    def failing(self) -> bool:
        return self.outcome in FAILING

    @property
    def signature(self) -> Signature:
        return Signature.of(self.category, self.lines, self.grew)

    @classmethod
    def of(cls, result: TestResult | None) -> Ending:
        """A results file's test as a trial reads it: its problem lines as the check stated
        them (older files: read back from the failure's text)."""
        if result is None:
            return cls("missing")
        if result.outcome not in FAILING:
            return cls(result.outcome, result.category or "")
        lines = list(result.problems) or failure_lines(result.longrepr)
        bounds = result.bounds or {}
        grew = {name: value / bounds[name] if bounds[name] > 0 else value
                for name, value in (result.figures or {}).items()
                if result.judged == "grew" and name in bounds and value > bounds[name]}
        return cls(result.outcome, result.category or "", lines, grew)


@dataclass
class Attempt:
    """One run of a candidate."""

    verdict: str
    why: str
    tests: dict[str, Ending] = field(default_factory=dict)
    seconds: float = 0.0
    exitstatus: int | None = None

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Attempt:
        tests = {k: Ending(**v) for k, v in data.get("tests", {}).items()}
        return cls(data["verdict"], data["why"], tests, float(data.get("seconds", 0.0)),
                   data.get("exitstatus"))


@dataclass
class Trial:
    """A candidate's runs and the verdict they agree on: one verdict when every run gives
    it, FLAKY with its rate when they disagree, SKIP when a run could not be judged."""

    assignment: dict[str, str]
    verdict: str
    why: str
    runs: list[Attempt] = field(default_factory=list)

    @property
    def tests(self) -> dict[str, Ending]:
        return self.runs[0].tests if self.runs else {}

    @property
    def seconds(self) -> float:
        return sum(run.seconds for run in self.runs)

    @classmethod
    def of(cls, assignment: dict[str, str], runs: list[Attempt]) -> Trial:
        verdicts = [run.verdict for run in runs]
        skipped = next((i for i, v in enumerate(verdicts) if v == SKIP), None)
        if skipped is not None:
            run = runs[skipped]
            where = f" (run {skipped + 1} of {len(runs)})" if len(runs) > 1 else ""
            return cls(assignment, SKIP, run.why + where, runs)
        if len(set(verdicts)) == 1:
            return cls(assignment, verdicts[0], runs[0].why, runs)
        return cls(assignment, FLAKY, flaky_rate(verdicts), runs)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Trial:
        return cls(dict(data["assignment"]), data["verdict"], data["why"],
                   [Attempt.from_dict(r) for r in data.get("runs", [])])


def flaky_rate(verdicts: list[str]) -> str:
    """A probe's runs that disagree, as a rate: 'ended as tonight in 1 of 2 runs'."""
    bad = verdicts.count(BAD)
    rest = ", ".join(f"{v} {verdicts.count(v)}" for v in dict.fromkeys(verdicts) if v != BAD)
    return f"flaky: ended as tonight in {bad} of {len(verdicts)} runs (else: {rest})"


@dataclass
class Reference:
    """The two nights' reruns, which every other trial is judged against."""

    good: dict[str, Ending]
    bad: dict[str, Ending]


@dataclass
class Runner:
    """Runs trials: ``tests`` in ``rootdir``, overlays from ``overlays``."""

    tests: list[str]
    rootdir: Path
    overlays: Overlays
    installed: dict[str, str | None]
    timeout: float = 900.0
    pytest_args: tuple[str, ...] = ()
    python: str = sys.executable

    def run(self, assignment: dict[str, str]) -> Attempt:
        """The tests' ends under ``assignment`` (verdict still to judge: ``""``), or a SKIP
        saying why there are none."""
        start = time.monotonic()
        try:
            path = self.overlays.pythonpath(assignment, self.installed)
        except OverlayError as exc:
            return Attempt(SKIP, str(exc), seconds=time.monotonic() - start)
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            [str(p) for p in path] + [p for p in [os.environ.get("PYTHONPATH")] if p])
        wrong = self._imported_elsewhere(
            {dist: folder for dist, version in assignment.items()
             if (folder := self.overlays.folder(dist, version)) in path}, env)
        if wrong:
            return Attempt(SKIP, wrong, seconds=time.monotonic() - start)
        with tempfile.TemporaryDirectory(prefix="npu-regress-bisect-") as tmp:
            results = Path(tmp) / "results.jsonl"
            ledger = Path(tmp) / "no-ledger.toml"
            ledger.write_text("# a bisect judges the property itself: no known findings\n")
            env["HARNESS_LEDGER"] = str(ledger)
            cmd = [self.python, "-m", "pytest", *self.tests, "-q", "-p", "no:cacheprovider",
                   f"--harness-results={results}", *self.pytest_args]
            # the output goes to a file, never a pipe: a descendant that outlives pytest (a
            # forkserver in its own session) would hold a pipe open and hang the trial
            with open(Path(tmp) / "output.txt", "w+", encoding="utf-8",
                      errors="replace") as out:
                proc = subprocess.Popen(cmd, cwd=self.rootdir, env=env, stdout=out,
                                        stderr=subprocess.STDOUT, text=True,
                                        start_new_session=True)
                try:
                    proc.wait(timeout=self.timeout)
                except subprocess.TimeoutExpired:
                    _end(proc)
                    return Attempt(SKIP, f"timed out after {self.timeout:.0f} s",
                                   seconds=time.monotonic() - start)
                except BaseException:  # Ctrl-C, SIGTERM: the trial's processes go with it
                    _end(proc)
                    raise
                _end(proc)  # whatever it left in its session
                out.seek(0)
                output = out.read()
            seconds = time.monotonic() - start
            if proc.returncode in PYTEST_TROUBLE or not results.is_file():
                said = first_error(output) or " / ".join(output.strip().splitlines()[-3:])
                what = PYTEST_TROUBLE.get(proc.returncode, f"exit {proc.returncode}")
                return Attempt(SKIP, f"pytest: {what}: {said}", seconds=seconds,
                               exitstatus=proc.returncode)
            run = load_any(results)
            wrong = self._overlay_not_taken(run, assignment)
            if wrong:
                return Attempt(SKIP, wrong, seconds=seconds, exitstatus=proc.returncode)
            ends = {test_id: Ending.of(run.tests.get(test_id)) for test_id in self.tests}
            return Attempt("", "", ends, seconds, proc.returncode)

    def _imported_elsewhere(self, folders: dict[str, Path], env: dict[str, str]
                            ) -> str | None:
        """Why the overlay would not take: a distribution's package in its overlay folder
        that this Python would import from somewhere else (found by ``find_spec``, nothing
        imported), for every candidate, ``--source`` commits included."""
        names = {name: folder for dist, folder in folders.items()
                 for name in _top_level(folder, dist)}
        if not names:
            return None
        code = ("import importlib.util, json, sys\n"
                "def origin(n):\n"
                "    try:\n"
                "        s = importlib.util.find_spec(n)\n"
                "    except Exception as e:\n"
                "        return 'error: %s' % e\n"
                "    if s is None: return None\n"
                "    return s.origin or (list(s.submodule_search_locations or []) or [None])[0]\n"
                "print(json.dumps({n: origin(n) for n in sys.argv[1:]}))")
        done = subprocess.run([self.python, "-c", code, *sorted(names)], env=env,
                              cwd=self.rootdir, capture_output=True, text=True, check=False,
                              timeout=120)
        try:
            found = json.loads(done.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            return f"the overlay could not be checked: {done.stderr.strip()[-300:]}"
        for name, folder in sorted(names.items()):
            origin = found.get(name)
            if not isinstance(origin, str) or not Path(origin).resolve().is_relative_to(
                    folder.resolve()):
                return (f"the overlay did not take: {name} is imported from {origin}, not "
                        f"from the candidate's {folder}")
        return None

    @staticmethod
    def _overlay_not_taken(run: RunResults, assignment: dict[str, str]) -> str | None:
        manifest = run.header.get("manifest") or {}
        for dist, version in assignment.items():
            entry = manifest.get(manifest_key(dist))
            seen = entry_version(entry)
            if not version.startswith(COMMIT_PREFIX) and seen is not None \
                    and seen != version:
                return (f"the overlay did not take: the run read {dist} {seen}, the "
                        f"candidate is {version}")
        return None


#: an exception's own line in pytest's output ("E   SyntaxError: invalid syntax", a
#: traceback's last line), and a traceback's "File ..., line N"
_ERROR_LINE = re.compile(r"^(?:E\s+)?((?:\w+\.)*\w+(?:Error|Exception|Exit|Warning)\b:?.*)$")
_FILE_LINE = re.compile(r'File "([^"]+)", line (\d+)')


def first_error(output: str) -> str | None:
    """The first exception pytest's output reports, with the file and line it names
    (``SyntaxError: invalid syntax (toypkg/__init__.py:7)``), or None."""
    lines = output.splitlines()
    for n, line in enumerate(lines):
        match = _ERROR_LINE.match(line.strip())
        if not match or line.lstrip().startswith(("ERROR ", "FAILED ")):
            continue
        where = next((f"{m.group(1)}:{m.group(2)}" for prev in reversed(lines[max(0, n - 15):n])
                      if (m := _FILE_LINE.search(prev))), None)
        return match.group(1).strip()[:300] + (f" ({where})" if where else "")
    return None


def _top_level(folder: Path, distribution: str) -> list[str]:
    """The importable top-level names of ``distribution`` in its overlay folder: its own
    package where it has one named after it (a wheel's stray ``tests`` package aside, which
    a suite's own ``tests`` rightly shadows), else every package and module there."""
    own = distribution.replace("-", "_").replace(".", "_").lower()
    if (folder / own / "__init__.py").is_file() or (folder / f"{own}.py").is_file():
        return [own]
    names = []
    for entry in folder.iterdir():  # dist-info, bin and __pycache__ are no identifiers
        if entry.is_dir() and entry.name.isidentifier() and (entry / "__init__.py").is_file():
            names.append(entry.name)
        elif entry.suffix == ".py" and entry.stem.isidentifier() and entry.stem != "setup":
            names.append(entry.stem)
    return names


def _end(proc: subprocess.Popen[str], grace: float = END_GRACE_S) -> None:
    """The trial's pytest and what it started ended as a CI job ends them: SIGTERM to its
    session (the harness ends its isolated children and writes its footer) and to its
    descendants that left the session, then SIGKILL (the isolation core's reaper). Waits on
    the processes, never on a pipe."""
    end_session(proc.pid, descendants(proc.pid), grace=grace)
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _as(end: Ending, ref: Ending) -> str:
    """How ``end`` compares with ``ref``: SAME (the same failure, not filed as ours; or the
    same non-failing outcome), PARTLY (a failure that shares some of ``ref``'s statement)
    or DIFFERENT."""
    if not ref.failing:
        return SAME if end.outcome == ref.outcome else DIFFERENT
    if not end.failing or end.category in OURS or end.category in RUNNERS_OWN:
        return DIFFERENT
    return end.signature.compare(ref.signature)


def judge(ends: dict[str, Ending], reference: Reference) -> tuple[str, str]:
    """A trial's verdict and why, against the two nights' reruns: BAD when a test ends as
    tonight (the same failure, whatever its size: another size is said), GOOD when every
    test ends as on the good night, OTHER when the rest fail in a way that partly agrees
    with tonight's, else a SKIP naming how (a failure with nothing in common with tonight's,
    a test that did not run)."""
    bad_like, partly, other = [], [], []
    for test_id, end in ends.items():
        tonight = reference.bad[test_id]
        as_tonight = _as(end, tonight)
        if as_tonight == SAME:
            size = tonight.signature.other_size(end.signature) if tonight.failing else ""
            bad_like.append(test_id + (f" (the same failure, another size: {size})"
                                       if size else ""))
        elif _as(end, reference.good[test_id]) == SAME:
            continue
        elif as_tonight == PARTLY:
            partly.append(f"{test_id}: {tonight.signature.differences(end.signature)}")
        else:
            first = end.lines[0][:200] if end.lines else ""
            other.append(f"{test_id}: {end.outcome}"
                         + (f" ({end.category})" if end.category else "")
                         + (f": {first}" if first else ""))
    if bad_like:
        return BAD, f"ends as tonight: {', '.join(bad_like)}"
    if other:
        ran = all(e.failing for e in ends.values() if e.outcome not in ("passed",))
        return SKIP, ("fails another way, nothing in common with tonight's: " if ran
                      else "ends neither way: ") + "; ".join(other)
    if partly:
        return OTHER, "fails another way, which partly agrees with tonight's: " \
            + "; ".join(partly)
    return GOOD, "every test ends as on the good night"
