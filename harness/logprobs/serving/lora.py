"""lora-mix: the probe on one adapter, alone and beside requests on the base model and the
other adapters."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from harness.drift.bits import compare_bits
from harness.logprobs.serving.comparison import ServingReport
from harness.logprobs.serving.conditions import require
from harness.logprobs.serving.loop import Served, serve
from harness.logprobs.serving.workload import LORA_IDS, Arrival, load


def lora_mix(report: ServingReport, src: Any, probe: list[int], vocab: int,
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
