"""The results file: one JSON line per test as it finishes, so a killed run leaves every
finished test readable.

Line types: ``header`` (runner, host, package versions, git commit, start time, device,
hardware versions, isolation), ``test`` (id, outcome, duration, device, hardware, isolation
method, dispatch events, the switch's dispatcher footprint, logprob report summary, each
child's exit status or signal and the tail of its output, the failure text or skip reason),
and ``footer`` (end time, exit status, counts). Written by the xdist controller only,
flushed after every line.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import socket
import subprocess
import time
from collections import Counter
from pathlib import Path
from typing import IO, Any

import pytest

from harness.result import tail_text
from harness.upstream import version

SCHEMA = 1
RUNNER_ENV = "HARNESS_RUNNER"
#: characters of failure text / child output kept per test
TEXT_TAIL = 4000
PACKAGES = ("npu-regress", "torch", "torch_npu", "vllm", "vllm_ascend", "verl", "pytest")


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


class ResultsWriter:
    """A pytest plugin object writing the results file; one per (controller) session."""

    def __init__(self, path: Path, config: pytest.Config, session: Any) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.session = session
        self._fh: IO[str] = open(path, "w", encoding="utf-8")  # noqa: SIM115 - lives all session
        self.counts: Counter[str] = Counter()
        self._started = time.monotonic()
        self.header(config, session)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.test(report, self.session)

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, exitstatus: int) -> None:
        self.footer(exitstatus)

    def write(self, record: dict[str, Any]) -> None:
        self._fh.write(json.dumps(record, default=str, sort_keys=True) + "\n")
        self._fh.flush()

    def header(self, config: pytest.Config, session: Any) -> None:
        runner = (config.getoption("harness_runner") or os.environ.get(RUNNER_ENV)
                  or socket.gethostname())
        self.write({
            "type": "header", "schema": SCHEMA, "runner": runner, "host": socket.gethostname(),
            "platform": platform.platform(), "python": platform.python_version(),
            "packages": {name: version(name) for name in PACKAGES},
            "git_commit": git_commit(Path(str(config.rootpath))), "start": _now(),
            "device": session.device.to_dict(),
            "hardware": session.npu.to_dict() if session.npu else None,
            "isolation": session.method, "args": list(config.invocation_params.args),
            "manifest": session.manifest,
        })

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
        record: dict[str, Any] = {
            "type": "test", "id": report.nodeid, "outcome": outcome, "when": report.when,
            "duration": round(report.duration, 4), "device": session.device.kind,
            "hardware": session.npu.hardware.name if session.npu else None,
            "isolation": session.method,
            "dispatch_events": _json_or_none(props.get("dispatch_events")),
            "logprob_report": props.get("logprob_report"),
            "dispatcher_footprint": props.get("dispatcher_footprint"),
            "patch_guard": props.get("patch_guard"),
            # a missing or renamed upstream symbol: its own category, not a plain failure
            "category": "upstream-drift" if props.get("upstream_drift") else
            "release-finding" if props.get("release_finding") else None,
            "release_finding": props.get("release_finding"),
            "upstream_drift": props.get("upstream_drift"),
            "children": getattr(report, "harness_children", []),
        }
        if report.skipped:
            longrepr = report.longrepr
            reason = (longrepr[2] if isinstance(longrepr, tuple) else
                      str(getattr(report, "wasxfail", "") or longrepr or ""))
            record["reason"] = reason.removeprefix("Skipped: ")
        elif hasattr(report, "wasxfail"):
            record["reason"] = report.wasxfail
        if report.failed:
            record["longrepr"] = tail_text(str(report.longrepr), TEXT_TAIL)
        self.write(record)

    def footer(self, exitstatus: int) -> None:
        self.write({"type": "footer", "end": _now(), "exitstatus": int(exitstatus),
                    "counts": dict(self.counts),
                    "duration": round(time.monotonic() - self._started, 3)})
        self._fh.close()


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
            "exitcode": res.exitcode, "signal": res.signame, "summary": res.summary(),
            "duration": round(res.duration, 4), "stdout_tail": tail_text(res.stdout, 2000),
            "stderr_tail": tail_text(res.stderr, 2000)}
