"""What comes back from an isolated child, and the exceptions that carry it.

Every way a child can end maps to exactly one ``IsolatedResult.outcome``; ``raise_for_outcome``
turns that into what the caller (a test) sees. Keeping the mapping here, in one place, means
``run_isolated``, the ``run_on_npu`` fixture and the reports all agree on it.
"""

from __future__ import annotations

import signal as _signal
from dataclasses import dataclass, field
from typing import Any

from harness.isolation.failure_text import child_traceback_note

#: Outcomes a child run can have. ``returned`` is the only one that yields a value.
OUTCOMES = ("returned", "raised", "skip", "xfail", "fail", "crashed", "timeout", "error")


def signal_name(signum: int | None) -> str | None:
    """``SIGSEGV`` for 11; ``None`` for ``None``; ``SIG<n>`` for numbers Python does not know."""
    if signum is None:
        return None
    try:
        return _signal.Signals(signum).name
    except ValueError:
        return f"SIG{signum}"


@dataclass
class IsolatedResult:
    """Everything one isolated run produced, whatever its outcome."""

    value: Any = None
    stdout: str = ""
    stderr: str = ""
    exitcode: int | None = None
    pid: int | None = None
    duration: float = 0.0
    events: dict[str, int] = field(default_factory=dict)
    #: whether events were counted at all ({} then means: not one matching event ran)
    events_counted: bool = False
    #: the recorder that counted them (``harness.stack.dispatch.RECORDERS``)
    recorder: str = ""
    #: one of ``OUTCOMES``
    outcome: str = "error"
    method: str = "spawn"
    #: signal number that ended the child, if any
    signal: int | None = None
    #: the child's formatted traceback (raised / error outcomes)
    traceback: str = ""
    #: Python stacks faulthandler printed (crash) or that we asked for (timeout)
    stack: str = ""
    #: message for skip / xfail / fail / error outcomes
    message: str = ""
    #: whether pytest.fail in the child asked for a Python traceback
    pytrace: bool = True
    #: the exception object rebuilt in the parent (``raised`` outcome)
    exception: BaseException | None = field(default=None, repr=False)
    #: fully qualified type name of the child's exception
    exc_type: str = ""
    timeout: float | None = None
    #: free-form extras from child-side plugins (hardware spoof, logprob reports...)
    extras: dict[str, Any] = field(default_factory=dict)
    #: what the child had reported ("returned a result", "skipped: ...") when it then died
    #: by a signal or a non-zero exit status; the reported value stays in ``value``
    after_result: str = ""
    #: things the reader of this result should know about how it was run (a replaced
    #: isolation server), one line each
    notes: list[str] = field(default_factory=list)

    @property
    def signame(self) -> str | None:
        return signal_name(self.signal)

    def summary(self) -> str:
        """One line for reports: how the child ended."""
        if self.outcome == "crashed":
            if self.after_result:
                return f"crashed: {self.after_result}, then {self.ending()} during exit " \
                    f"(pid {self.pid})"
            if self.signal is not None:
                return f"crashed: killed by {self.signame} (pid {self.pid})"
            return f"crashed: exited with code {self.exitcode} before returning a result"
        if self.outcome == "timeout":
            return f"timeout: still running after {self.timeout:g} s (pid {self.pid})"
        if self.outcome == "raised":
            return f"raised {self.exc_type}"
        return self.outcome

    def ending(self) -> str:
        """How the process ended: ``was killed by SIGSEGV`` / ``exited with code 3``."""
        if self.signal is not None:
            return f"was killed by {self.signame}"
        return f"exited with code {self.exitcode}"

    def raise_for_outcome(self) -> IsolatedResult:
        """Return self if fn returned; otherwise raise what the child's ending means."""
        import pytest  # deferred: the child side must not need pytest to build results

        __tracebackhide__ = True
        if self.outcome == "returned":
            return self
        if self.outcome == "skip":
            # reported at the test's location, not at this line
            raise pytest.skip.Exception(self.message, _use_item_location=True)
        if self.outcome == "xfail":
            pytest.xfail(self.message)
        if self.outcome == "fail":
            pytest.fail(self.message, pytrace=self.pytrace)
        if self.outcome == "raised" and self.exception is not None:
            raise self.exception
        if self.outcome == "crashed":
            raise ChildCrashed(self)
        if self.outcome == "timeout":
            raise ChildTimeout(self)
        raise ChildError(self)


def tail_text(text: str, limit: int = 4000) -> str:
    """The last ``limit`` characters of ``text``, marked when cut (messages, report lines)."""
    return text if len(text) <= limit else "[...]\n" + text[-limit:]


class IsolationError(Exception):
    """Base of every error that says how an isolated child ended badly."""

    def __init__(self, result: IsolatedResult, message: str) -> None:
        super().__init__(message)
        self.result = result

    @property
    def pid(self) -> int | None:
        return self.result.pid

    @property
    def stderr(self) -> str:
        return self.result.stderr


class ChildError(IsolationError):
    """The child raised something that could not be rebuilt here, or the run itself broke."""

    def __init__(self, result: IsolatedResult) -> None:
        self.type_name = result.exc_type
        self.traceback_text = result.traceback
        msg = result.message or "isolated child failed"
        if result.traceback:
            msg += "\n" + child_traceback_note(result.pid, result.traceback.rstrip())
        super().__init__(result, msg)


class ChildCrashed(IsolationError):
    """The child died from a signal, or exited before handing back a result."""

    def __init__(self, result: IsolatedResult) -> None:
        self.signal = result.signal
        self.signame = result.signame
        self.exitcode = result.exitcode
        parts = [f"isolated child {result.summary().removeprefix('crashed: ')}"]
        if result.stack:
            parts.append("--- Python stack (faulthandler) ---\n" + result.stack.rstrip())
        if result.stderr:
            parts.append("--- stderr tail ---\n" + tail_text(result.stderr).rstrip())
        super().__init__(result, "\n".join(parts))


class ChildTimeout(IsolationError):
    """The child was still running at its timeout; its stacks were taken, then its group ended."""

    def __init__(self, result: IsolatedResult) -> None:
        self.stack = result.stack
        self.timeout = result.timeout
        parts = [
            f"isolated child (pid {result.pid}) still running after {result.timeout:g} s; "
            "its process group was ended"
        ]
        load = result.extras.get("timeout_load")
        if load:
            share = load["child_cpu_s"] / max(load["wall_s"], 1e-9)
            verdict = ("it was computing most of the time: a slow (loaded) machine or more "
                       "work than the budget, not a hang" if share >= 0.5 else
                       "it was mostly waiting: a hang, or a peer (Ray, an engine) that never "
                       "answered")
            parts.append(
                f"machine load average {load['load_avg_1m']:g} on {load['cores']} cores; "
                f"the child's processes used {load['child_cpu_s']:g} s of CPU in "
                f"{load['wall_s']:g} s ({share:.0%}): {verdict}")
        stack = result.stack.rstrip() or "(none captured)"
        parts.append("--- Python stacks of all threads at timeout ---\n" + stack)
        if result.stderr:
            parts.append("--- stderr tail ---\n" + tail_text(result.stderr).rstrip())
        super().__init__(result, "\n".join(parts))


# Shown as harness.ChildCrashed etc. in tracebacks: the public names users import.
for _cls in (IsolatedResult, IsolationError, ChildError, ChildCrashed, ChildTimeout):
    _cls.__module__ = "harness"
