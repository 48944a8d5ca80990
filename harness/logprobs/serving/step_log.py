"""Which requests each engine step scheduled, read back: the HTTP serving case's proof that
its probe shared steps with other requests.

The writer is a vLLM general plugin (entry point ``vllm.general_plugins``:
``npu_regress_step_log``), a top-level module of its own so that the vLLM processes that load
it import nothing of the harness (its source: ``harness/vllm_plugin/``). Here: the variables
a server needs to write the log, and the reader that says whether the probe's own steps held
other requests (vacuous when the plugin did not load, could not wrap the scheduler, or never
saw the probe).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from npu_regress_step_log import ENV, PLUGIN, register

__all__ = ["ENV", "PLUGIN", "StepLog", "register", "server_env"]


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
