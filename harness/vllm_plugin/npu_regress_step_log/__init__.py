"""npu-regress's vLLM general plugin: which requests each engine step scheduled, written from
inside a vLLM server (the HTTP serving case's proof that its probe shared steps).

vLLM loads every ``vllm.general_plugins`` entry point in every process it starts, the engine
core included, in every environment where npu-regress is installed. So this is a top-level
module of its own (installed as ``npu_regress_step_log``; its source sits under
``harness/vllm_plugin/`` only because the repository's top level is fixed) that imports the
standard library alone and nothing of the harness: without ``$NPU_REGRESS_STEP_LOG`` it
returns at once, and a vLLM process pays one small import for it. The reader of the log, and
the variables a server is given, are ``harness.logprobs.serving.step_log``'s.

With the variable (only the harness's own server sets it) it wraps the scheduler's
``schedule`` and appends one JSON line per step that scheduled anything: the ids of the
requests it scheduled. Its first line says it loaded (or why it could not wrap the
scheduler), so a server where it did not load is told apart from one where nothing shared the
probe's steps: both are vacuous, never a pass. We patch vLLM here, so we guard it as users
guard theirs: feature-checked (the class and its ``num_scheduled_tokens`` output), applied once
a process, and it says when it cannot apply.
"""

from __future__ import annotations

import json
import os
import threading
import time
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
