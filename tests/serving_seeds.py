"""Regressions seeded into a running engine for the serving family's negative controls
(imported by the isolated child that built the engine: ``knobs["seed_regression"]``)."""

from __future__ import annotations

from typing import Any

_KEEP: list[Any] = []


def silu_by_rows(src: Any) -> None:
    """aten::silu on the CPU computed one way for one row and another for several: a
    request's result then depends on what else the engine schedules in its step (decode
    alone: 1 row; beside others: N), the kind of regression the concurrent case must catch
    and name by op."""
    import torch

    lib = torch.library.Library("aten", "IMPL")

    def silu(x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, x.shape[-1]).shape[0] if x.dim() else 1
        return x / (1 + torch.exp(-x)) if rows > 1 else x * torch.sigmoid(x)

    lib.impl("silu", silu, "CPU")
    _KEEP.append(lib)


def silu_scaled_by_rows(src: Any) -> None:
    """aten::silu on the CPU off by a factor of 1 + 2^-10 when the step holds several rows
    (a fused kernel picked by the row count, with its own approximation): the switch-off
    concurrent case's difference grows from the measured 1 ULP to hundreds or more."""
    import torch

    lib = torch.library.Library("aten", "IMPL")

    def silu(x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, x.shape[-1]).shape[0] if x.dim() else 1
        out = x * torch.sigmoid(x)
        return out * (1 + 2 ** -10) if rows > 1 else out

    lib.impl("silu", silu, "CPU")
    _KEEP.append(lib)
