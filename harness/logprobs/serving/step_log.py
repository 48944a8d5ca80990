"""Which requests each engine step scheduled, written from inside a vLLM server: the HTTP
serving case's proof that its probe shared steps with other requests.

A vLLM general plugin (entry point ``vllm.general_plugins``: ``npu_regress_step_log``).
vLLM loads general plugins in every process it starts, the engine core included; this one
does nothing unless ``$NPU_REGRESS_STEP_LOG`` names a file, which only the harness's own
server sets. There it wraps the scheduler's ``schedule`` and appends one JSON line per step
that scheduled anything: the ids of the requests it scheduled. Its first line says it loaded
(or why it could not wrap the scheduler), so a server where it did not load is told apart
from one where nothing shared the probe's steps: both are vacuous, never a pass.

We patch vLLM here, so we guard it as users guard theirs: the wrapper is feature-checked
(the class and its ``num_scheduled_tokens`` output), applied once a process, and says when
it cannot apply.
"""

from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ENV = "NPU_REGRESS_STEP_LOG"
#: the entry point's name (``VLLM_PLUGINS`` lists plugins by it)
PLUGIN = "npu_regress_step_log"
_lock = threading.Lock()


def _write(path: str, record: dict[str, Any]) -> None:
    line = json.dumps(record) + "\n"
    with _lock, open(path, "a") as out:  # one write a line: lines from processes interleave
        out.write(line)


def register() -> None:
    """The plugin: wrap the scheduler's ``schedule`` in this process (inert without the
    variable)."""
    path = os.environ.get(ENV)
    if not path:
        return
    try:
        from vllm.v1.core.sched.scheduler import Scheduler
    except ImportError as exc:
        _write(path, {"pid": os.getpid(), "unsupported": f"no v1 scheduler: {exc}"})
        return
    original = Scheduler.schedule
    if getattr(original, "_npu_regress_step_log", False):
        return

    def schedule(self: Any, *args: Any, **kwargs: Any) -> Any:
        out = original(self, *args, **kwargs)
        scheduled = getattr(out, "num_scheduled_tokens", None)
        if isinstance(scheduled, dict) and scheduled:
            _write(path, {"t": time.time(), "requests": sorted(scheduled)})
        elif scheduled is None:
            _write(path, {"pid": os.getpid(), "unsupported": "the scheduler's output has no "
                          "num_scheduled_tokens"})
        return out

    schedule._npu_regress_step_log = True  # type: ignore[attr-defined]
    Scheduler.schedule = schedule  # type: ignore[method-assign]
    _write(path, {"pid": os.getpid(), "loaded": True})


def server_env(path: Path, environ: dict[str, str]) -> dict[str, str]:
    """The variables a server needs to log its steps to ``path`` (keeps an allowlist the
    user set in ``VLLM_PLUGINS``, with this plugin added)."""
    env = {ENV: str(path)}
    allowed = environ.get("VLLM_PLUGINS")
    if allowed is not None and PLUGIN not in allowed.split(","):
        env["VLLM_PLUGINS"] = ",".join(p for p in (allowed, PLUGIN) if p)
    return env


@dataclass
class StepLog:
    """What a server's steps scheduled, read back."""

    loaded: bool = False
    unsupported: str | None = None
    steps: list[list[str]] = field(default_factory=list)

    @classmethod
    def read(cls, path: Path) -> StepLog:
        log = cls()
        if not path.exists():
            return log
        for line in path.read_text().splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line cut by the server's end
            log.loaded = log.loaded or bool(record.get("loaded"))
            log.unsupported = log.unsupported or record.get("unsupported")
            if "requests" in record:
                log.steps.append(record["requests"])
        return log

    def beside(self, marker: str) -> list[int]:
        """For each step that scheduled the request whose id holds ``marker``: how many
        other requests it scheduled."""
        return [len(step) - 1 for step in self.steps if any(marker in r for r in step)]

    def why_vacuous(self, marker: str, min_others: int) -> str | None:
        """Why these steps do not show the probe sharing a step with ``min_others`` others
        (the plugin not loaded, unsupported, the probe never seen, or alone), or None."""
        if self.unsupported:
            return f"vacuous: the step log could not wrap the scheduler: {self.unsupported}"
        if not self.loaded:
            return (f"vacuous: the server's step log ({PLUGIN}, a vllm.general_plugins entry "
                    "point of npu-regress) did not load, so the probe's steps are unknown")
        beside = self.beside(marker)
        if not beside:
            return "vacuous: no engine step scheduled the probe (its request id was not seen)"
        if max(beside) < min_others:
            return (f"vacuous: the probe's {len(beside)} engine steps held at most "
                    f"{max(beside)} other request(s) (needs {min_others})")
        return None
