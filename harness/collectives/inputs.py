"""The ranks' messages: seeded rows with widened exponents, so that summation order shows.

Mantissas uniform in [-1, 1) times 2**e with e in [-12, 12]: adding the same four numbers
in another order rounds differently in fp32 and bf16 (small integers or values of one
magnitude add exactly and would hide it; vLLM's all-reduce test widens exponents for the
same reason). A row's bits depend on the rank, the block, the row and the seed only, never
on the message size, so a row can be compared across sizes; the parent rebuilds any rank's
rows to check a gather and to prove that order can show at all."""

from __future__ import annotations

import torch

HIDDEN = 256
#: message sizes in rows: 1, around powers of two (chunk and protocol thresholds), up to 512
SIZES = (1, 2, 3, 7, 16, 17, 64, 65, 128, 255, 256, 512)
DTYPES = ("float32", "bfloat16")
EXPONENT = 12


def block(rank: int, index: int, dtype: str, seed: int = 0) -> torch.Tensor:
    """Rank ``rank``'s block ``index``: ``[max(SIZES), HIDDEN]`` in ``dtype``."""
    gen = torch.Generator().manual_seed(seed * 1_000_003 + rank * 7919 + index * 104_729 + 17)
    shape = (max(SIZES), HIDDEN)
    mantissa = torch.rand(shape, generator=gen) * 2 - 1
    exponent = torch.randint(-EXPONENT, EXPONENT + 1, shape, generator=gen)
    return (mantissa * torch.exp2(exponent.float())).to(getattr(torch, dtype))


def table(rank: int, blocks: int, dtype: str, seed: int = 0) -> torch.Tensor:
    """Rank ``rank``'s rows: ``[blocks, max(SIZES), HIDDEN]``; block 0 whatever ``blocks``."""
    return torch.stack([block(rank, index, dtype, seed) for index in range(blocks)])


def order_shows(world: int, dtype: str, seed: int = 0, rows: int = 8) -> bool:
    """Whether these inputs can show summation order at all on ``world`` ranks: the rank-order
    sum of some probe row differs from a rotated one (never on 2 ranks: a + b == b + a)."""
    parts = [block(r, 0, dtype, seed)[:rows] for r in range(world)]
    for start in range(1, world):
        order = [(start + i) % world for i in range(world)]
        base, other = parts[0].clone(), parts[order[0]].clone()
        for r in range(1, world):
            base += parts[r]
            other += parts[order[r]]
        if not torch.equal(base, other):
            return True
    return False
