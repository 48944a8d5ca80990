"""What the two sides agree on: the prompts, the steps sampled, and the checkpoint's
identity (each side computes it from the files it loaded)."""

from __future__ import annotations

import torch

from harness.logprobs.seeded_model import checkpoint_digest  # noqa: F401 - both sides use it

#: prompts of mixed lengths, sampled continuations of STEPS tokens
PROMPT_LENGTHS = (12, 30, 23, 41)
STEPS = 12


def prompts(seed: int = 11, vocab: int = 1024) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(3, vocab, (n,), generator=gen).tolist() for n in PROMPT_LENGTHS]
