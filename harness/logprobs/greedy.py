"""Greedy decoding over full logprob rows: the loop the torch sources (TinyDecoder, the HF
source) share. A source says how decoding starts (``_start``: the last prompt position's
logprob rows, and a step that feeds the chosen tokens and returns the next rows); the
mix-in gives it ``generate``, ``decode`` and the vacuity guard's ``margins``."""

from __future__ import annotations

from collections.abc import Callable

import torch

from harness.logprobs.bits import top2_margin

#: feeds one chosen token per sequence, returns the next logprob rows
Step = Callable[[torch.Tensor], torch.Tensor]


def greedy(last: torch.Tensor, step: Step, steps: int, margins: bool = False
           ) -> tuple[list[tuple[list[int], torch.Tensor]], list[torch.Tensor]]:
    """``steps`` greedy steps from the rows ``last``: (tokens, their logprobs) per sequence,
    and, with ``margins``, each step's top-1 minus top-2 logprob per sequence (only when
    asked: ``topk`` would join the op stream the checks record)."""
    count = last.shape[0]
    tokens: list[list[int]] = [[] for _ in range(count)]
    chosen: list[list[torch.Tensor]] = [[] for _ in range(count)]
    gaps: list[torch.Tensor] = []
    for _ in range(steps):
        nxt = last.argmax(-1)
        picked = last.gather(1, nxt.unsqueeze(1)).squeeze(1)
        if margins:
            gaps.append(top2_margin(last))
        for i in range(count):
            tokens[i].append(int(nxt[i]))
            chosen[i].append(picked[i])
        last = step(nxt)
    per_seq = list(torch.stack(gaps, dim=1)) if gaps else []
    return [(t, torch.stack(c).cpu()) for t, c in zip(tokens, chosen, strict=True)], per_seq


class GreedyDecoding:
    """``generate`` / ``decode`` / ``margins`` from a source's ``_start(batch)``."""

    def _start(self, batch: list[list[int]]) -> tuple[torch.Tensor, Step]:
        raise NotImplementedError

    @torch.no_grad()
    def generate(self, batch: list[list[int]], steps: int
                 ) -> list[tuple[list[int], torch.Tensor]]:
        """Greedy decoding of the whole batch together: the chosen tokens and their
        logprobs, ``steps`` per sequence."""
        return greedy(*self._start(batch), steps)[0]

    @torch.no_grad()
    def margins(self, batch: list[list[int]], steps: int) -> list[torch.Tensor]:
        """Per sequence, per greedy step: the top-1 minus the top-2 logprob."""
        return greedy(*self._start(batch), steps, margins=True)[1]

    def decode(self, batch: list[list[int]], steps: int) -> list[torch.Tensor]:
        """The chosen tokens' logprobs of ``generate``."""
        return [lp for _, lp in self.generate(batch, steps)]
