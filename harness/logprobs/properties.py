"""Two more logprob properties that RL training depends on, beside batch size:

- decode versus prefill: the logprobs of tokens produced by decoding (KV cache, one token
  at a time) equal, bit for bit, the same tokens' logprobs recomputed by one prefill pass
  over the whole sequence, alone and inside the same batch. That recomputation is what a
  trainer does for the old/ref logprobs of a PPO step: where it differs, "on-policy"
  training is silently off-policy;
- repeat: the same batch, run again (in this process, and in another process: the suite
  compares two isolated runs with ``compare_repeat``), gives the same bits.

Mismatches carry the phase (``decode-vs-prefill``, ``repeat``), batch size, slot, position,
the first differing token (decode step), max |diff| and max ULP, and what was compared.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from harness.logprobs.bits import compare_bits
from harness.logprobs.invariance_check import (
    InvarianceReport,
    LogprobSource,
    SourceCannot,
    judge_vacuity,
    make_sequences,
    record_failing_pass,
    vocab_of,
)

DECODE_BATCH_SIZES = (1, 2, 4, 8)


def slot_name(position: int, batch_size: int) -> str:
    if position == 0:
        return "first"
    if position == batch_size - 1:
        return "last"
    return "middle" if position == batch_size // 2 else "other"


def _report(source: LogprobSource, check: str, batch_sizes: Sequence[int], steps: int,
            probe_length: int) -> InvarianceReport:
    return InvarianceReport(source=getattr(source, "name", type(source).__name__),
                            batch_sizes=tuple(batch_sizes), slots=("all",),
                            decode_steps=steps, probe_length=probe_length, check=check)


def _add(report: InvarianceReport, phase: str, bs: int, pos: int, ref: torch.Tensor,
         got: torch.Tensor, detail: str) -> bool:
    return report.compare(phase, bs, slot_name(pos, bs), pos, ref, got, detail)


def check_decode_matches_prefill(source: LogprobSource, *,
                                 batch_sizes: Sequence[int] = DECODE_BATCH_SIZES,
                                 decode_steps: int = 8, seed: int = 0) -> InvarianceReport:
    """Decode each batch greedily, then recompute every sequence's generated tokens by one
    prefill pass over prompt + generated tokens, alone and inside the same batch; compare
    the bits with the decoded logprobs."""
    report = _report(source, "decode-vs-prefill", batch_sizes, decode_steps, 0)
    judged = False
    for bs in batch_sizes:
        batch = make_sequences(seed + bs, vocab_of(source), bs, min_len=8, max_len=32)
        report.probe_length = max(report.probe_length, *(len(s) for s in batch))
        try:
            generated = source.generate(batch, decode_steps)
        except (SourceCannot, AttributeError) as exc:
            report.cannot.append(f"batch size {bs}: cannot report decoded tokens ({exc})")
            continue
        full = [list(seq) + list(tokens) for seq, (tokens, _) in zip(batch, generated,
                                                                     strict=True)]

        def window(lp: torch.Tensor, prompt: list[int]) -> torch.Tensor:
            start = len(prompt) - 1  # the logprob of full[t] sits at index t - 1
            return lp[start:start + decode_steps]

        try:
            together = source.prefill(full)
        except SourceCannot as exc:
            report.cannot.append(f"batch size {bs}: cannot prefill the decoded sequences "
                                 f"({exc})")
            continue
        if not judged:  # once: the model, not the batch, makes an input vacuous
            judged = True
            judge_vacuity(report, source, [d for _, d in generated] + list(together),
                          batch[0], decode_steps)
        for i, (_, decoded) in enumerate(generated):
            alone = source.prefill([full[i]])[0]
            if _add(report, "decode-vs-prefill", bs, i, decoded, window(alone, batch[i]),
                    "prefill alone"):
                record_failing_pass(report, lambda f=full[i]: source.prefill([f]))
            if _add(report, "decode-vs-prefill", bs, i, decoded, window(together[i], batch[i]),
                    "prefill in the same batch"):
                record_failing_pass(report, lambda f=full: source.prefill(f))
    return report


def check_repeatable(source: LogprobSource, *, runs: int = 3, batch_size: int = 8,
                     decode_steps: int = 8, seed: int = 0) -> InvarianceReport:
    """Prefill and decode the same batch ``runs`` times in this process; every run must give
    the first run's bits. The first run's outputs are kept (``report.outputs``) for
    ``compare_repeat`` across processes."""
    batch = make_sequences(seed, vocab_of(source), batch_size, min_len=8, max_len=32)
    report = _report(source, "repeat", (batch_size,), decode_steps, max(len(s) for s in batch))

    def once() -> list[torch.Tensor]:
        return [*source.prefill(batch), *source.decode(batch, decode_steps)]

    first = once()
    report.outputs = first
    judge_vacuity(report, source, first, batch[0], decode_steps)
    for run in range(2, runs + 1):
        again = once()
        for i, (ref, got) in enumerate(zip(first, again, strict=True)):
            phase = "prefill" if i < batch_size else "decode"
            if _add(report, "repeat", batch_size, i % batch_size, ref, got,
                    f"{phase}, run {run} vs run 1"):
                record_failing_pass(report, once)
    return report


def compare_repeat(first: InvarianceReport, second: InvarianceReport,
                   name: str = "process 2") -> InvarianceReport:
    """The same repeat check run in two processes: every output must have the same bits.
    Returns ``second`` with the differences added (detail "process 2 vs process 1"). Two
    processes whose kernel-choosing conditions differ (threads, CPU capability, the kernels'
    variables, the weights read) are not comparable: said in ``not_comparable``, and their
    bits are still compared, for the record."""
    from harness.stack.conditions import differences

    if first.conditions and second.conditions:
        apart = differences(first.conditions, second.conditions)
        if apart:
            second.not_comparable.append(
                f"{name} ran under other conditions than process 1 ({'; '.join(apart)})")
    bs = second.batch_sizes[0]
    for i, (ref, got) in enumerate(zip(first.outputs, second.outputs, strict=True)):
        phase = "prefill" if i < bs else "decode"
        _add(second, "repeat", bs, i % bs, ref, got, f"{phase}, {name} vs process 1")
    return second


def processes_agreeing(reports: Sequence[InvarianceReport]) -> str:
    """Which of several processes' repeat outputs have the same bits, as a sentence
    ("processes 1 and 3 agree, 2 differs"): a third process tells a process that went its
    own way from two stable answers."""
    groups: list[list[int]] = []
    for n, report in enumerate(reports, start=1):
        for group in groups:
            ref = reports[group[0] - 1].outputs
            if all(compare_bits(a, b) is None
                   for a, b in zip(ref, report.outputs, strict=True)):
                group.append(n)
                break
        else:
            groups.append([n])
    if len(groups) == 1:
        return f"all {len(reports)} processes agree"
    return "; ".join(f"process{'es' if len(g) > 1 else ''} "
                     f"{' and '.join(map(str, g))} {'agree' if len(g) > 1 else 'alone'}"
                     for g in groups)
