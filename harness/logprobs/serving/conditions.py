"""The condition each serving property claims, read from what the scheduler did (the probe's
steps shared, the cache hit, the preemption, the adapters mixed); one that did not happen
makes the case vacuous, never a pass."""

from __future__ import annotations

from harness.logprobs.serving.comparison import ServingReport
from harness.logprobs.serving.loop import Served
from harness.logprobs.serving.workload import LORA_IDS, MIN_OTHERS


def require(report: ServingReport, served: Served, prop: str) -> None:
    """The condition ``prop`` claims, from what the scheduler did; else ``vacuous``."""
    stats = served.stats()
    report.condition.update(stats)
    if prop in ("concurrent", "repeat-under-load"):
        missing = []
        if stats["max_beside"] < MIN_OTHERS:
            missing.append(f"the probe ran beside at most {stats['max_beside']} other "
                           f"requests (needs {MIN_OTHERS})")
        if stats["joined"] < 1:
            missing.append("no request joined during the probe's decode")
        if stats["left"] < 1:
            missing.append("no request left during the probe's decode")
        if missing:
            report.vacuous = ("vacuous: the load did not share the probe's steps as the "
                              "property claims: " + "; ".join(missing))
    elif prop in ("prefix-cache", "prompt-cache-read") and stats["cached_tokens"] <= 0:
        report.vacuous = ("vacuous: the prefix cache did not hit (the probe's "
                          "num_cached_tokens is 0)")
    elif prop == "preemption" and stats["preemptions"] <= 0:
        report.vacuous = "vacuous: the probe was never preempted (num_preemptions 0)"
    elif prop == "lora-mix":
        missing = [f"adapter {i}" if i else "the base model" for i in (0, *LORA_IDS)
                   if i != report.condition.get("probe_lora") and i not in served.loras_beside]
        if stats["max_beside"] < MIN_OTHERS:
            missing.append(f"at least {MIN_OTHERS} requests in one step (ran beside at most "
                           f"{stats['max_beside']})")
        if missing:
            report.vacuous = ("vacuous: the probe's steps did not mix the adapters as the "
                              "property claims: no " + ", ".join(missing) + " beside it")
