"""One trial: the tests rerun in a fresh ``pytest`` with a candidate's versions overlaid,
and its verdict. The ledger of known findings is left out of the rerun (a known finding
fails as it is instead of being expected), so that the verdict reads the property itself.

A candidate is BAD when a test fails the way it fails tonight (a failure line in common
with tonight's rerun, versions and addresses aside, and not filed as the harness's own
problem), GOOD when every test ends as it did on the good night's rerun, and a SKIP
otherwise: not installable, not collected, pytest itself failing (exit 2-5), timed out,
the overlay not taking (the results' manifest shows another version than the candidate's),
or a failure of another kind (an import error of an old release is not tonight's bug)."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from harness.bisect.endpoints import COMMIT_PREFIX, manifest_key
from harness.bisect.overlay import OverlayError, Overlays
from harness.bisect.search import BAD, GOOD, SKIP
from harness.plugin.verdicts import failure_lines
from harness.report.load import RunResults, load_any

#: categories that say a failure is ours (the harness, the stand-in), never a release's
OURS = ("harness", "stand-in-limit")
#: outcomes that are a failure
FAILING = ("failed", "error")
#: pytest's exit statuses that say the run itself went wrong (interrupted, internal error,
#: usage error, nothing collected), as vllm-ascend's tools/bisect counts them
PYTEST_TROUBLE = {2: "interrupted", 3: "internal error", 4: "usage error",
                  5: "no tests collected"}
_VOLATILE = [(re.compile(r"0x[0-9a-fA-F]+"), "0x?"),
             (re.compile(r"/tmp/[^\s'\":]+"), "/tmp/?"),
             (re.compile(r"\b\d+(\.\d+)+(\.?(post|dev|rc|a|b)\d*)*\b"), "<version>")]


def signature(lines: list[str]) -> set[str]:
    """A failure's lines with what differs from run to run or release to release (memory
    addresses, temporary paths, version numbers) masked."""
    out = set()
    for line in lines:
        for pattern, mask in _VOLATILE:
            line = pattern.sub(mask, line)
        out.add(line.strip())
    return out


@dataclass
class Ending:
    """How one test ended in a trial."""

    outcome: str  # an outcome of the results schema, or "missing"
    category: str = ""
    lines: list[str] = field(default_factory=list)


@dataclass
class Trial:
    assignment: dict[str, str]
    verdict: str
    why: str
    tests: dict[str, Ending] = field(default_factory=dict)
    seconds: float = 0.0
    exitstatus: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Trial:
        tests = {k: Ending(**v) for k, v in data.get("tests", {}).items()}
        return cls(dict(data["assignment"]), data["verdict"], data["why"], tests,
                   float(data.get("seconds", 0.0)), data.get("exitstatus"))


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

    def run(self, assignment: dict[str, str]) -> tuple[dict[str, Ending], str | None, float,
                                                       int | None]:
        """The tests' ends under ``assignment``, or why there are none (a skip's reason)."""
        start = time.monotonic()
        try:
            path = self.overlays.pythonpath(assignment, self.installed)
        except OverlayError as exc:
            return {}, str(exc), time.monotonic() - start, None
        with tempfile.TemporaryDirectory(prefix="npu-regress-bisect-") as tmp:
            results = Path(tmp) / "results.jsonl"
            ledger = Path(tmp) / "no-ledger.toml"
            ledger.write_text("# a bisect judges the property itself: no known findings\n")
            env = dict(os.environ, HARNESS_LEDGER=str(ledger))
            env["PYTHONPATH"] = os.pathsep.join(
                [str(p) for p in path] + [p for p in [os.environ.get("PYTHONPATH")] if p])
            cmd = [self.python, "-m", "pytest", *self.tests, "-q", "-p", "no:cacheprovider",
                   f"--harness-results={results}", *self.pytest_args]
            proc = subprocess.Popen(cmd, cwd=self.rootdir, env=env, stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, text=True,
                                    start_new_session=True)
            try:
                output, _ = proc.communicate(timeout=self.timeout)
            except subprocess.TimeoutExpired:
                _end(proc)
                return {}, f"timed out after {self.timeout:.0f} s", \
                    time.monotonic() - start, None
            except BaseException:  # Ctrl-C, SIGTERM: the trial's processes go with it
                _end(proc)
                raise
            seconds = time.monotonic() - start
            if proc.returncode in PYTEST_TROUBLE or not results.is_file():
                tail = " / ".join(output.strip().splitlines()[-3:])
                what = PYTEST_TROUBLE.get(proc.returncode, f"exit {proc.returncode}")
                return {}, f"pytest: {what}: {tail}", seconds, proc.returncode
            run = load_any(results)
            wrong = self._overlay_not_taken(run, assignment)
            if wrong:
                return {}, wrong, seconds, proc.returncode
            ends = {}
            for test_id in self.tests:
                got = run.tests.get(test_id)
                ends[test_id] = Ending("missing") if got is None else Ending(
                    got.outcome, got.category or "",
                    failure_lines(got.longrepr) if got.outcome in FAILING else [])
            return ends, None, seconds, proc.returncode

    @staticmethod
    def _overlay_not_taken(run: RunResults, assignment: dict[str, str]) -> str | None:
        manifest = run.header.get("manifest") or {}
        for dist, version in assignment.items():
            entry = manifest.get(manifest_key(dist))
            seen = entry.get("version") if isinstance(entry, dict) else None
            if not version.startswith(COMMIT_PREFIX) and seen is not None \
                    and str(seen) != version:
                return (f"the overlay did not take: the run read {dist} {seen}, the "
                        f"candidate is {version}")
        return None


def _end(proc: subprocess.Popen[str], grace: float = 10.0) -> None:
    """The trial's pytest ended as a CI job ends one: SIGTERM to its process group (the
    harness ends its isolated children and writes its footer), then SIGKILL."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, None)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        try:
            proc.communicate(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def _like(end: Ending, ref: Ending) -> bool:
    """``end`` is the way ``ref`` ended: the same failure (a line in common, volatile parts
    masked, not filed as ours), or the same non-failing outcome."""
    if ref.outcome in FAILING:
        return end.outcome in FAILING and end.category not in OURS \
            and bool(signature(end.lines) & signature(ref.lines))
    return end.outcome == ref.outcome


def judge(ends: dict[str, Ending], reference: Reference) -> tuple[str, str]:
    """A trial's verdict and why, against the two nights' reruns: BAD when a test ends as
    tonight, GOOD when every test ends as on the good night, else a SKIP naming how."""
    bad_like, other = [], []
    for test_id, end in ends.items():
        if _like(end, reference.bad[test_id]):
            bad_like.append(test_id)
        elif not _like(end, reference.good[test_id]):
            first = end.lines[0][:200] if end.lines else ""
            other.append(f"{test_id}: {end.outcome}"
                         + (f" ({end.category})" if end.category else "")
                         + (f": {first}" if first else ""))
    if bad_like:
        return BAD, f"ends as tonight: {', '.join(bad_like)}"
    if not other:
        return GOOD, "every test ends as on the good night"
    return SKIP, "ends neither way: " + "; ".join(other)
