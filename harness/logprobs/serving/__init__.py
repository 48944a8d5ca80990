"""Logprob properties under serving load (issue 43): the engine's own scheduler decides.

The probe request (a 64-token prompt, 16 greedy steps, sample logprobs) is served alone and
while other requests arrive over time: mixed prompt lengths and ``max_tokens``, some
sampled (temperature 0.8, seeded), some asking for logprobs, added between engine steps
(``LLMEngine.add_request`` / ``step``, in this process, so that arrivals are reproducible
and the dispatch recorder sees the ops). The probe joins a batch that is already decoding,
and others join and leave during its decode. Properties:

- ``concurrent``: the probe's tokens and logprobs served alone equal, bit for bit, those
  served under the load;
- ``repeat-under-load``: the same load, served three times, gives the probe the same bits;
- ``prefix-cache``: the probe with its 128-token prefix computed by an earlier request
  (cache hot) equals the probe computed cold (prefix caching on in both engines);
- ``preemption``: with a KV cache small enough that the probe is preempted and recomputed,
  its logprobs equal those of a run without preemption.

No vacuous pass: each property proves the condition it claims, from the engine's own
scheduler (``Scheduler.running``, the request's ``num_preemptions``) and outputs
(``num_cached_tokens``): the probe's steps ran beside at least ``MIN_OTHERS`` other running
requests, one joined and one left during its decode; the cache hit; a preemption happened.
A condition that did not happen makes the case vacuous, never a pass.

Modules by job: ``workload`` (the probe and the load), ``loop`` (the serve loop and what the
scheduler did), ``comparison`` (the report), ``conditions`` (each property's claim),
``properties`` and ``lora`` (the drivers), ``over_http`` (the case through ``vllm serve``).
"""

from __future__ import annotations

from harness.logprobs.serving.comparison import ServingReport
from harness.logprobs.serving.conditions import require
from harness.logprobs.serving.loop import Served, scheduler_of, serve
from harness.logprobs.serving.properties import run_serving_case
from harness.logprobs.serving.workload import (
    MIN_OTHERS,
    PROBE_STEPS,
    PROPERTIES,
    Arrival,
    load,
    probe_prompt,
)

__all__ = ["MIN_OTHERS", "PROBE_STEPS", "PROPERTIES", "Arrival", "Served", "ServingReport",
           "load", "probe_prompt", "require", "run_serving_case", "scheduler_of", "serve"]
