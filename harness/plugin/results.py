"""The results file: one JSON line per test as it finishes, so a killed run leaves every
finished test readable.

The lines and their fields are ``harness.report.schema``'s, the contract this writer and
the report's loader share. Written by the xdist controller only, flushed after every line.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import json
import os
import platform
import socket
import subprocess
import time
import warnings
from collections import Counter
from pathlib import Path
from typing import IO, Any

import pytest

from harness.isolation.result import tail_text
from harness.report import schema
from harness.stack import devices
from harness.stack.upstream import version

RUNNER_ENV = "HARNESS_RUNNER"
#: characters of failure text / child output kept per test
TEXT_TAIL = 4000
#: test ids per "collected" line
COLLECTED_CHUNK = 1000
#: the packages whose versions the header names (the full list, with where each was read, is
#: the stack manifest's)
HEADER_PACKAGES = ("npu-regress", "torch", "torch_npu", "vllm", "vllm_ascend", "verl", "pytest")


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def git_commit(cwd: Path) -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True,
                             text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None


def outcome_of(report: pytest.TestReport) -> str:
    """passed / failed / skipped / xfailed / xpassed / error."""
    if hasattr(report, "wasxfail"):
        return "xpassed" if report.passed else "xfailed"
    if report.when != "call" and report.failed:
        return "error"
    return report.outcome


def skip_reason(report: pytest.TestReport) -> str:
    """Why a skipped report skipped (an xfailed one: its xfail reason), without pytest's
    "Skipped: " prefix."""
    longrepr = report.longrepr
    reason = (longrepr[2] if isinstance(longrepr, tuple) else
              str(getattr(report, "wasxfail", "") or longrepr or ""))
    return reason.removeprefix("Skipped: ")


class ResultsInUse(OSError):
    """Another live pytest session writes the same results file."""


class ResultsLost(pytest.PytestWarning):
    """The results file could not be written (a full disk): the rest of the run is lost."""


class ResultsWriter:
    """A pytest plugin object writing the results file; one per (controller) session.

    A second session on the same path is refused at start (a lock beside the file names
    the session holding it); a write that fails (a full disk) stops the writing with one
    warning, the tests go on, and the exit status says results were lost."""

    def __init__(self, path: Path, config: pytest.Config, session: Any) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.session = session
        self._lock = self._take_lock(path)
        self._fh: IO[str] = open(path, "w", encoding="utf-8")  # noqa: SIM115 - lives all session
        self.counts: Counter[str] = Counter()
        #: how many tests the session collected (None until collection finished)
        self.collected_count: int | None = None
        self._started = time.monotonic()
        #: why writing stopped (an OSError's text), or None
        self.lost: str | None = None
        self.header(config, session)

    @staticmethod
    def _take_lock(path: Path) -> IO[str]:
        import fcntl

        lock_path = path.with_name(path.name + ".lock")
        lock = open(lock_path, "a+", encoding="utf-8")  # noqa: SIM115 - held all session
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            lock.seek(0)
            holder = lock.read().strip() or "unknown"
            lock.close()
            raise ResultsInUse(
                f"another pytest session ({holder}) is writing this results file; give "
                "each session its own --harness-results path") from None
        lock.seek(0)
        lock.truncate()
        lock.write(f"pid {os.getpid()} on {socket.gethostname()}, since {_now()}\n")
        lock.flush()
        return lock

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.test(report, self.session)

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        if session.items:  # an xdist controller collects nothing: its workers say
            self.collected([item.nodeid for item in session.items])

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_node_collection_finished(self, node: Any, ids: list[str]) -> None:
        if self.collected_count is None:  # every worker collects the same ids
            self.collected(list(ids))

    def collected(self, ids: list[str]) -> None:
        """What this session means to run, in lines of ``COLLECTED_CHUNK`` ids: a night cut
        short can then tell the tests that never ran from tests that vanished."""
        self.collected_count = len(ids)
        for start in range(0, len(ids), COLLECTED_CHUNK):
            self.write(schema.Collected(type=schema.COLLECTED, total=len(ids),
                                        ids=ids[start:start + COLLECTED_CHUNK]))

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        self.footer(exitstatus)
        if self.lost is not None and session.exitstatus in (pytest.ExitCode.OK,
                                                            pytest.ExitCode.TESTS_FAILED):
            session.exitstatus = pytest.ExitCode.INTERNAL_ERROR

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if self.lost is not None:
            terminalreporter.write_line(
                f"npu-regress: results LOST after {sum(self.counts.values())} tests: "
                f"{self.path}: {self.lost} (exit status 3)", red=True, bold=True)

    def write(self, record: schema.Header | schema.Collected | schema.Test | schema.Footer
              ) -> None:
        if self.lost is not None:
            return
        try:
            self._fh.write(schema.line(record))
            self._fh.flush()
        except OSError as exc:
            self.lost = str(exc)
            warnings.warn(ResultsLost(
                f"{self.path}: writing results failed ({exc}); the tests go on, their "
                "results are not recorded, and the exit status will say so"), stacklevel=1)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._fh.close()
        with contextlib.suppress(OSError):
            Path(self._lock.name).unlink()
            self._lock.close()

    def header(self, config: pytest.Config, session: Any) -> None:
        runner = (config.getoption("harness_runner") or os.environ.get(RUNNER_ENV)
                  or socket.gethostname())
        self.write(schema.Header(
            type=schema.HEADER, schema=schema.SCHEMA, runner=runner, host=socket.gethostname(),
            platform=platform.platform(), python=platform.python_version(),
            cpu=devices.cpu_model(),
            packages={name: version(name) for name in HEADER_PACKAGES},
            git_commit=git_commit(Path(str(config.rootpath))), start=_now(),
            device=session.device.to_dict(),
            hardware=session.npu.to_dict() if session.npu else None,
            isolation=session.method, args=list(config.invocation_params.args),
            manifest=session.manifest,
            # the stack profile and the pairing verdict: a report marks this runner's
            # failures "on an unsupported stack" when the pairing failed
            stack=getattr(session, "stack", None) or None,
        ))

    def test(self, report: pytest.TestReport, session: Any) -> None:
        """Record a finished test: its call report, or the setup/teardown report that ended it."""
        # an error in teardown is written as a second line for the same id
        ends_test = report.when == "call" or (report.when == "setup" and not report.passed) \
            or (report.when == "teardown" and report.failed)
        if not ends_test:
            return
        outcome = outcome_of(report)
        self.counts[outcome] += 1
        props = dict(report.user_properties)
        record = schema.Test(
            type=schema.TEST, id=report.nodeid, outcome=outcome, when=report.when,
            duration=round(report.duration, 4), device=session.device.kind,
            hardware=session.npu.hardware.name if session.npu else None,
            isolation=session.method,
            dispatch_events=_json_or_none(props.get("dispatch_events")),
            logprob_report=props.get("logprob_report"),
            dispatcher_footprint=props.get("dispatcher_footprint"),
            patch_guard=props.get("patch_guard"),
            # the size of a difference against its envelope (harness.drift), per judged row
            drift=props.get("drift"),
            # the cause before the verdict (harness.plugin.verdicts); else a missing or
            # renamed upstream symbol, or a finding about the release
            category=_category(report, props),
            verdict=props.get("verdict"),
            release_finding=props.get("release_finding"),
            upstream_drift=props.get("upstream_drift"),
            children=getattr(report, "harness_children", []),
            properties=_other_properties(props),
        )
        if report.skipped:
            record["reason"] = skip_reason(report)
        elif hasattr(report, "wasxfail"):
            record["reason"] = report.wasxfail
        if report.failed:
            record["longrepr"] = tail_text(str(report.longrepr), TEXT_TAIL)
            problems = getattr(report, "harness_problems", None)
            if problems:
                record["problems"] = [tail_text(p, TEXT_TAIL)
                                      for p in problems[:schema.MAX_PROBLEM_LINES]]
        self.write(record)

    def footer(self, exitstatus: int) -> None:
        terminated = getattr(self.session, "terminated", None)
        self.write(schema.Footer(
            type=schema.FOOTER, end=_now(), exitstatus=int(exitstatus),
            interrupted=terminated is not None
            or int(exitstatus) == pytest.ExitCode.INTERRUPTED,
            signal=terminated, collected=self.collected_count, counts=dict(self.counts),
            duration=round(time.monotonic() - self._started, 3)))
        self.close()


def _category(report: pytest.TestReport, props: dict[str, Any]) -> str | None:
    verdict = props.get("verdict")
    if isinstance(verdict, dict) and verdict.get("category"):
        return str(verdict["category"])
    if not report.failed:
        return None
    if props.get("upstream_drift"):
        return "upstream-drift"
    return "release-finding" if props.get("release_finding") else None


#: recorded properties that have a field of their own in a test line, or that the children's
#: records already hold (``isolation``: each child's summary)
OWN_FIELDS = frozenset(("dispatch_events", "logprob_report", "dispatcher_footprint",
                        "patch_guard", "drift", "verdict", "release_finding", "upstream_drift",
                        "isolation", "isolation_note"))


def _other_properties(props: dict[str, Any]) -> dict[str, Any] | None:
    """What a check recorded beyond the schema's own fields (issue 69: the nodes a
    collectives case ran on reached the JUnit XML only), each a JSON value, or its text cut
    to ``schema.MAX_PROPERTY_CHARS`` when larger; None when there is none."""
    out: dict[str, Any] = {}
    for name, value in props.items():
        if name in OWN_FIELDS or len(out) >= schema.MAX_PROPERTIES:
            continue
        value = _json_or_none(value)
        text = json.dumps(value, default=str)
        out[str(name)] = value if len(text) <= schema.MAX_PROPERTY_CHARS else \
            tail_text(text, schema.MAX_PROPERTY_CHARS)
    return out or None


def _json_or_none(value: Any) -> Any:
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


def child_record(res: Any) -> dict[str, Any]:
    """What the results file keeps of one isolated child."""
    return {"pid": res.pid, "method": res.method, "outcome": res.outcome,
            "recorder": getattr(res, "recorder", "") or None,
            "exitcode": res.exitcode, "signal": res.signame, "summary": res.summary(),
            "duration": round(res.duration, 4), "stdout_tail": tail_text(res.stdout, 2000),
            "stderr_tail": tail_text(res.stderr, 2000), "notes": list(res.notes)}
