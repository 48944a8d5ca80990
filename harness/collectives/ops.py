"""The collectives under test, each as ``fn(rows, world) -> probe rows`` on one rank.

``rows(i, block)``: the rank's message row ``i`` (of block ``block`` for reduce-scatter),
the same bits whatever the message size, so a row's result can be compared across sizes.
Each function builds an ``n``-row message, runs the collective and returns the rows of its
result that the message's probe rows became (positions first, middle, last).

Native: ``all_reduce``, ``reduce_scatter``, ``all_gather`` (the backend's own algorithms).
Ours: ``fixed_order_all_reduce`` (all-gather, then the ranks summed in rank order: the kind
of all-reduce a batch-invariant stack registers; invariant by construction, the family's
positive control) and ``order_varying_all_reduce``, the negative control: the ranks summed
in an order that rotates with the message size, which must fail the size property on 3 or
more ranks (a 2-rank sum is the same in either order); and ``node_skewed_all_reduce``, the
cross-node control: the ranks of every node but node 0 one ULP off.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

#: (row, block) -> the rank's message row (``harness.collectives.inputs``)
Rows = Callable[[int, int], torch.Tensor]


def positions(n: int) -> list[int]:
    """The probe rows of an ``n``-row message: first, middle and last."""
    return sorted({0, n // 2, n - 1})


def _message(rows: Rows, n: int, block: int = 0) -> torch.Tensor:
    return torch.stack([rows(i, block) for i in range(n)])


def _to_device(x: torch.Tensor) -> torch.Tensor:
    from harness.stack import devices

    return x.to(devices.device()) if devices.device_kind() != "cpu" else x


def all_reduce(rows: Rows, n: int, rank: int, world: int) -> dict[int, torch.Tensor]:
    import torch.distributed as dist

    x = _to_device(_message(rows, n))
    dist.all_reduce(x)
    return {p: x[p].cpu().clone() for p in positions(n)}


def reduce_scatter(rows: Rows, n: int, rank: int, world: int) -> dict[int, torch.Tensor]:
    """Each rank sends ``world`` blocks of ``n`` rows; block ``r`` reduced lands on rank r."""
    import torch.distributed as dist

    x = _to_device(torch.cat([_message(rows, n, block) for block in range(world)]))
    out = torch.empty_like(x[:n])
    dist.reduce_scatter_tensor(out, x)
    return {p: out[p].cpu().clone() for p in positions(n)}


def all_gather(rows: Rows, n: int, rank: int, world: int) -> dict[int, torch.Tensor]:
    """The gathered rows of every rank at each probe position (rank-major)."""
    import torch.distributed as dist

    x = _to_device(_message(rows, n))
    out = torch.empty((world * n, *x.shape[1:]), dtype=x.dtype, device=x.device)
    dist.all_gather_into_tensor(out, x)
    return {p: torch.stack([out[r * n + p] for r in range(world)]).cpu() for p in positions(n)}


def _gathered(x: torch.Tensor, world: int) -> list[torch.Tensor]:
    import torch.distributed as dist

    parts = [torch.empty_like(x) for _ in range(world)]
    dist.all_gather(parts, x)
    return parts


def _sum_in(parts: list[torch.Tensor], order: list[int]) -> torch.Tensor:
    acc = parts[order[0]].clone()
    for r in order[1:]:
        acc += parts[r]
    return acc


def fixed_order_all_reduce(rows: Rows, n: int, rank: int, world: int
                           ) -> dict[int, torch.Tensor]:
    """All-gather, then rank 0 + rank 1 + ... elementwise: no order depends on the size."""
    parts = _gathered(_to_device(_message(rows, n)), world)
    out = _sum_in(parts, list(range(world)))
    return {p: out[p].cpu().clone() for p in positions(n)}


def order_varying_all_reduce(rows: Rows, n: int, rank: int, world: int
                             ) -> dict[int, torch.Tensor]:
    """The negative control: the summation starts at rank ``n % world``."""
    parts = _gathered(_to_device(_message(rows, n)), world)
    out = _sum_in(parts, [(n + i) % world for i in range(world)])
    return {p: out[p].cpu().clone() for p in positions(n)}


def node_skewed_all_reduce(rows: Rows, n: int, rank: int, world: int
                           ) -> dict[int, torch.Tensor]:
    """The cross-node control: an all-reduce whose ranks on any node but node 0 (torchrun's
    ``GROUP_RANK``) hold their sum one ULP up: the ranks property must name them by node."""
    import os

    got = all_reduce(rows, n, rank, world)
    if int(os.environ.get("GROUP_RANK", "0")) == 0:
        return got
    return {p: torch.nextafter(x, torch.full_like(x, float("inf"))) for p, x in got.items()}


COLLECTIVES: dict[str, Callable[..., dict[int, Any]]] = {
    "all_reduce": all_reduce,
    "reduce_scatter": reduce_scatter,
    "all_gather": all_gather,
    "fixed_order_all_reduce": fixed_order_all_reduce,
}
#: the negative control, kept out of the suite's list: it must fail
CONTROLS: dict[str, Callable[..., dict[int, Any]]] = {
    "order_varying_all_reduce": order_varying_all_reduce,
    "node_skewed_all_reduce": node_skewed_all_reduce,
}
#: collectives that reduce (order can show); all_gather only moves bits
REDUCING = ("all_reduce", "reduce_scatter", "fixed_order_all_reduce",
            "order_varying_all_reduce", "node_skewed_all_reduce")


def get(name: str) -> Callable[..., dict[int, Any]]:
    found = {**COLLECTIVES, **CONTROLS}.get(name)
    if found is None:
        known = ", ".join([*COLLECTIVES, *CONTROLS])
        raise KeyError(f"unknown collective {name!r}; known: {known}")
    return found
