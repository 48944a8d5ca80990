"""Bit-for-bit comparison of float tensors, with the distance in units in the last place:
what every logprob, serving and collective comparison (and the first-divergent-op search)
reports, and so the size of a drift (``max_ulp``, ``max_abs``, ``mean_abs``)."""

from __future__ import annotations

import torch


def _ordered(bits: torch.Tensor, sign_bit: int) -> torch.Tensor:
    """Map IEEE bit patterns to integers whose difference counts ULPs."""
    b = bits.long() & ((1 << (sign_bit + 1)) - 1)
    mag = b & ((1 << sign_bit) - 1)
    return torch.where((b >> sign_bit) & 1 == 1, -mag, mag)


def _bits(t: torch.Tensor) -> tuple[torch.Tensor, int]:
    if t.dtype == torch.float64:
        return t.view(torch.int64), 63
    if t.dtype == torch.float32:
        return t.view(torch.int32), 31
    if t.dtype in (torch.bfloat16, torch.float16):
        return t.view(torch.int16), 15
    raise TypeError(f"logprobs must be floating point, got {t.dtype}")


def compare_bits(ref: torch.Tensor, got: torch.Tensor) -> tuple[int, float, int, int] | None:
    """None if bitwise equal; else (first index, max abs diff, max ULP, differing count)."""
    ref, got = ref.detach().cpu().flatten(), got.detach().cpu().flatten()
    if ref.dtype != got.dtype or ref.shape != got.shape:
        n = min(ref.numel(), got.numel())
        return (n, float("inf"), -1, abs(ref.numel() - got.numel()) or 1)
    rb, width = _bits(ref)
    gb, _ = _bits(got)
    differ = rb != gb
    if not bool(differ.any()):
        return None
    first = int(differ.nonzero()[0, 0])
    diff = (ref.double() - got.double()).abs()
    diff = torch.where(torch.isnan(diff), torch.full_like(diff, float("inf")), diff)
    if width == 63:
        ulp = int((rb - gb).abs().max())
    else:
        ulp = int((_ordered(rb, width) - _ordered(gb, width)).abs().max())
    return first, float(diff[differ].max()), ulp, int(differ.sum())



def abs_sum(ref: torch.Tensor, got: torch.Tensor) -> tuple[float, int]:
    """(sum of |got - ref| over the values, how many values): a mean |diff| over every
    compared value is the sum of these over the cases divided by the count (0 where equal,
    inf where one side is not finite and the other is)."""
    ref, got = ref.detach().cpu().flatten().double(), got.detach().cpu().flatten().double()
    if ref.shape != got.shape:
        return float("inf"), max(ref.numel(), got.numel())
    diff = (ref - got).abs()
    same = (ref == got) | (ref.isnan() & got.isnan())
    diff = torch.where(same, torch.zeros_like(diff), diff.nan_to_num(float("inf")))
    return float(diff.sum()), int(diff.numel())
