"""The top-1 / top-2 margin of a logprob row, what the vacuity guard reads (greedy among
near-ties); the bit comparison every logprob check reports lives with the other figures of
a drift (``harness.drift.bits``) and is re-exported here."""

from __future__ import annotations

import torch

from harness.drift.bits import compare_bits

__all__ = ["compare_bits", "top2_margin"]


def top2_margin(rows: torch.Tensor) -> torch.Tensor:
    """Per row of logprobs over the vocabulary: the best minus the second best (fp32)."""
    top = rows.float().topk(2, dim=-1).values
    return (top[..., 0] - top[..., 1]).detach().cpu()
