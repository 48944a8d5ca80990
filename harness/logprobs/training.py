"""The training side of RL consistency: per-token logprobs as a trainer computes them.

A trainer recomputes the logprobs of sampled sequences in micro-batches, padded (right or
left) or packed without padding (verl's remove-padding layout: the sequences of a micro-batch
concatenated into one row, position ids restarting per sequence, each attending only to
itself), and turns logits into logprobs with its own function (verl 0.9.1's
``verl.utils.torch_functional.logprobs_from_logits``; its CPU path, ``logprobs_from_logits_v2``,
uses ``logsumexp`` in fp32 and ``log_softmax`` in bf16). RL users need the result not to
depend on the micro-batch size (verl #6280: ``log_prob`` != ``old_log_prob`` when the two
passes use different micro-batch sizes) nor on the layout.

The model is Hugging Face transformers' ``LlamaForCausalLM`` loaded from the seeded model
folder the engine loads (``seeded_model.build``): the same checkpoint as the rollout side,
and ``weights_digest`` says which parameters a side really holds.
"""

from __future__ import annotations

import os
from typing import Any

import torch

from harness.logprobs import seeded_model
from harness.logprobs.hf_source import PAD_ID, pad, positions
from harness.logprobs.invariance_check import InvarianceReport
from harness.logprobs.seeded_model import weights_digest

#: our loop's layouts (``TrainingForward``), then verl's engine's (``verl_engine``: remove-padding
#: on and off), each through its own forward
LOOP_LAYOUTS = ("right", "left", "packed")
LAYOUTS = (*LOOP_LAYOUTS, "verl-rmpad", "verl-padded")
MICRO_BATCHES = (1, 2, 4, 8)
#: eight sequences of mixed lengths: a micro-batch's padding width changes with its members
LENGTHS = (37, 64, 12, 50, 23, 64, 41, 30)
#: verl's flash-attn cross entropy is not bitwise reproducible; verl's own switch to its
#: log_softmax+gather path (no flash-attn on CPU anyway)
VERL_ENV = {"VERL_DISABLE_FLASH_ATTN_CE": "1"}


def sequences(seed: int = 1, vocab: int = 1024) -> list[list[int]]:
    """The sampled sequences the trainer scores (token ids, never the pad id)."""
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(3, vocab, (n,), generator=gen).tolist() for n in LENGTHS]


def _logprob_fn() -> Any:
    """verl's function where verl is installed, else the same log_softmax + gather."""
    for key, value in VERL_ENV.items():
        os.environ.setdefault(key, value)
    try:
        from verl.utils.torch_functional import logprobs_from_logits

        return logprobs_from_logits
    except ImportError:
        def plain(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
            lp = torch.log_softmax(logits, dim=-1)
            return lp.gather(-1, labels.unsqueeze(-1)).squeeze(-1)

        return plain


class TrainingForward:
    """Per-token logprobs of whole sequences, in micro-batches, in a layout."""

    def __init__(self, *, dtype: str = "float32", seed: int = 0, folder: Any = None,
                 attn: str = "sdpa", device: Any = "cpu") -> None:
        import transformers

        self.folder = folder or seeded_model.build(None, seed=seed)
        self.model = transformers.LlamaForCausalLM.from_pretrained(
            str(self.folder), dtype=getattr(torch, dtype), attn_implementation=attn,
        ).to(device).eval()
        self.device = torch.device(device)
        self.digest = weights_digest(self.model)
        self.logprob_fn = _logprob_fn()
        where = getattr(self.logprob_fn, "__module__", "")
        self.name = (f"transformers {transformers.__version__} LlamaForCausalLM ({dtype}, "
                     f"{attn}, seeded 4-layer llama) + {where}.{self.logprob_fn.__name__}")

    def logprobs(self, seqs: list[list[int]], micro_batch: int, layout: str
                 ) -> list[torch.Tensor]:
        """Each sequence's logprobs of its tokens 1..n-1, micro-batch by micro-batch."""
        if layout not in LOOP_LAYOUTS:
            raise ValueError(f"layout={layout!r}: use one of {', '.join(LOOP_LAYOUTS)} "
                             "(verl's layouts run through verl_engine.VerlEngineForward)")
        out: list[torch.Tensor] = []
        for start in range(0, len(seqs), micro_batch):
            out += self._forward(seqs[start:start + micro_batch], layout)
        return out

    def _labels(self, seq: list[int]) -> torch.Tensor:
        return torch.tensor(seq[1:], device=self.device).unsqueeze(0)

    @torch.no_grad()
    def _forward(self, chunk: list[list[int]], layout: str,
                 width: int | None = None) -> list[torch.Tensor]:
        if layout == "packed":
            return self._packed(chunk)
        ids, mask = pad(chunk, layout, PAD_ID, width)
        ids, mask = ids.to(self.device), mask.to(self.device)
        logits = self.model(input_ids=ids, attention_mask=mask,
                            position_ids=positions(mask)).logits
        out = []
        for i, seq in enumerate(chunk):
            cols = mask[i].nonzero().squeeze(1)
            out.append(self.logprob_fn(logits[i, cols[:-1]].unsqueeze(0),
                                       self._labels(seq))[0].float().cpu())
        return out

    def _packed(self, chunk: list[list[int]]) -> list[torch.Tensor]:
        """One row, no padding: position ids restart per sequence and a block-diagonal
        causal mask keeps each sequence to itself (what flash-attn's varlen kernels do
        from cumulative lengths in verl's remove-padding path)."""
        ids = torch.tensor([t for s in chunk for t in s], device=self.device).unsqueeze(0)
        positions = torch.cat([torch.arange(len(s)) for s in chunk]).unsqueeze(0)
        segment = torch.cat([torch.full((len(s),), i) for i, s in enumerate(chunk)])
        total = int(segment.numel())
        allow = (segment[:, None] == segment[None, :]) & torch.ones(
            total, total, dtype=torch.bool).tril()
        logits = self.model(input_ids=ids, position_ids=positions.to(self.device),
                            attention_mask=allow[None, None].to(self.device)).logits[0]
        out, offset = [], 0
        for seq in chunk:
            rows = logits[offset:offset + len(seq) - 1].unsqueeze(0)
            out.append(self.logprob_fn(rows, self._labels(seq))[0].float().cpu())
            offset += len(seq)
        return out


def check_micro_batch(fwd: Any, layout: str, seqs: list[list[int]] | None = None
                      ) -> InvarianceReport:
    """Every sequence's logprobs at micro-batch sizes 2, 4, 8 in ``layout`` against the
    sequence alone, unpadded (micro-batch 1); and two passes with different micro-batch sizes
    against each other (``old_log_prob`` at 2 vs ``log_prob`` at 4, verl #6280). A layout
    that moves a logprob far (a packed row without its block mask) is a large difference on
    the same inputs: a drift, judged against the row's envelope, never "not comparable"."""
    seqs = seqs or sequences()
    reference = fwd.logprobs(seqs, 1, "right" if layout in LOOP_LAYOUTS else layout)
    report = InvarianceReport(f"{fwd.name}, {layout}", MICRO_BATCHES[1:], (layout,), 0,
                              max(len(s) for s in seqs))
    report.check = "micro-batch"
    passes = {}
    for micro in MICRO_BATCHES[1:]:
        passes[micro] = fwd.logprobs(seqs, micro, layout)
        for i, (ref, got) in enumerate(zip(reference, passes[micro], strict=True)):
            report.compare(layout, micro, f"seq {i} ({len(seqs[i])} tokens)", i, ref, got,
                           "the sequence alone, unpadded")
    for i, (old, new) in enumerate(zip(passes[2], passes[4], strict=True)):
        report.compare("old-vs-new", 4, f"seq {i} ({len(seqs[i])} tokens)", i, old, new,
                       "old_log_prob at micro-batch 2")
    return report


def forward(layout: str, dtype: str, device: Any = "cpu") -> Any:
    """The forward a layout runs through: our loop, or verl's own engine."""
    if layout in LOOP_LAYOUTS:
        return TrainingForward(dtype=dtype, device=device)
    from harness.logprobs.verl_engine import LAYOUTS as VERL_LAYOUTS
    from harness.logprobs.verl_engine import VerlEngineForward

    if layout not in VERL_LAYOUTS:
        raise ValueError(f"layout={layout!r}: use one of {', '.join(LAYOUTS)}")
    return VerlEngineForward(dtype=dtype, remove_padding=VERL_LAYOUTS[layout])


def run_training_case(layout: str, enabled: bool, dtype: str, target: str,
                      nudge: Any = None) -> InvarianceReport:
    """Child side: the target's switch the way users turn it on, then the training forward,
    then the micro-batch check. ``nudge(forward)``: a control's change to the training
    forward (a ``TrainingForward``)."""
    from harness.invariance import get_target
    from harness.stack import devices

    tgt = get_target(target)
    tgt.set_switch(enabled)
    fwd = forward(layout, dtype, devices.device())
    if nudge is not None:
        nudge(fwd)
    seqs = sequences()
    report = check_micro_batch(fwd, layout, seqs)
    report.source = (f"{report.source} [switch {'on' if enabled else 'off'}: {tgt.name}; "
                     f"weights {fwd.digest[:12]}]")
    report.threads = torch.get_num_threads()
    first = next((m for m in report.mismatches if m.phase == layout), None)
    if first is not None:
        report.first_divergence = diagnose(fwd, layout, seqs, first.batch_size,
                                           first.position)
    return report


def diagnose(fwd: TrainingForward, layout: str, seqs: list[list[int]], micro: int,
             index: int) -> dict[str, Any]:
    """Where the first difference comes from: sequence ``index`` alone but padded to the
    width of its micro-batch (of ``micro``) vs inside it (the micro-batch's own effect,
    named by op); if those agree, whether the padding width itself moves it."""
    from harness.logprobs.divergence import locate

    start = index // micro * micro
    batch = [seqs[index]] + [s for j, s in enumerate(seqs[start:start + micro], start)
                             if j != index]
    at = {"op": None, "batch_size": micro}
    if layout not in LOOP_LAYOUTS:
        return {**at, "sentence": "first divergent op: not located (verl's engine packs or "
                                  "pads the micro-batch itself: no op's output lines up with "
                                  "the sequence's alone)"}
    if layout == "packed":
        return {**at, "sentence": "first divergent op: not located (a packed row holds every "
                                  "sequence of its micro-batch: no op's output lines up with "
                                  "the sequence's alone)"}
    width = max(len(s) for s in batch)

    def alone() -> list[torch.Tensor]:
        return fwd._forward(batch[:1], layout, width)

    found = locate(alone, lambda: fwd._forward(batch, layout))
    if found is not None:
        return {**at, "op": found.op, "sentence": found.sentence(micro)}
    if not torch.equal(fwd._forward(batch[:1], layout)[0], alone()[0]):
        why = (f"none between sequence {index} alone padded to its micro-batch's width "
               f"({width} tokens) and inside it; alone, it differs between its own length "
               "and that width: the padding width itself moves it")
    else:
        why = (f"none found (sequence {index} alone, padded or not, and inside its "
               "micro-batch agree)")
    return {**at, "sentence": f"first divergent op: {why}"}
