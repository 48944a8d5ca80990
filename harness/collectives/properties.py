"""What a collectives check measures on each rank, and the parent's reading of it.

On every rank, per dtype and message size: the collective's result at the probe rows, twice
(``repeat``), and each probe row's result when it is the message's only row (``alone``). The
parent then reads, on every rank (each named, with its node, where it is not rank 0):

- ``repeat``: the same message gives the same bits run after run;
- ``sizes``: a row's result is the same whether the message holds 1 row or up to 512 (the
  collective's own batch invariance), first, middle and last row; a reduce-scatter's on
  each rank's own shard;
- ``ranks``: every rank holds the same result of an all-reduce as rank 0;
- ``exact``: an all-gather returns every rank's rows bit for bit, as every rank holds them;
- ``order``: whether these inputs can show summation order on this many ranks at all; if
  not, a sizes result proves nothing (vacuous, never a pass).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from harness.collectives import inputs, ops
from harness.drift.bits import compare_bits


def measure(rank: int, world: int, collective: str, dtypes: tuple[str, ...],
            sizes: tuple[int, ...], seed: int = 0) -> dict[str, Any]:
    """Rank side (``ranks.run_ranks`` body)."""
    fn = ops.get(collective)
    blocks = world if collective == "reduce_scatter" else 1
    out: dict[str, Any] = {}
    for dtype in dtypes:
        table = inputs.table(rank, blocks, dtype, seed)
        rows = lambda i, b, t=table: t[b, i]  # noqa: E731
        by_size: dict[int, dict[str, Any]] = {}
        alone: dict[int, torch.Tensor] = {}
        for n in sizes:
            first = fn(rows, n, rank, world)
            second = fn(rows, n, rank, world)
            by_size[n] = {"rows": first,
                          "repeat": [p for p in first if not _same(first[p], second[p])]}
            for p in first:
                if p not in alone:
                    shifted = lambda i, b, t=table, p=p: t[b, p + i]  # noqa: E731
                    alone[p] = fn(shifted, 1, rank, world)[0]
        out[dtype] = {"sizes": by_size, "alone": alone}
    return out


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(a, b)


def _diff(a: torch.Tensor, b: torch.Tensor) -> str:
    a32, b32 = a.float(), b.float()
    differ = (a32 != b32) & ~(a32.isnan() & b32.isnan())
    return (f"{int(differ.sum())} of {a.numel()} elements, max |diff| "
            f"{float((a32 - b32).abs()[differ].max()) if differ.any() else 0.0:.3g}")


@dataclass
class CollectiveMismatch:
    """One difference: which property, where, and how much."""

    prop: str
    dtype: str
    size: int
    row: int
    detail: str
    rank: int = 0
    #: where ``rank`` and rank 0 ran, on more than one node (``RankResult.place``)
    place: str = ""
    ref_place: str = ""
    #: the size of a difference: ULP distance and |diff| (``harness.drift.bits``)
    ulp: int = 0
    max_abs: float = 0.0

    def sentence(self, collective: str) -> str:
        where = f"{collective} {self.dtype}, a {self.size}-row message, row {self.row}"
        if self.prop in ("sizes", "repeat") and self.rank:
            where += f" on rank {self.rank}{self.place}"
        if self.prop == "sizes":
            return f"{where}: differs from the row alone in a 1-row message ({self.detail})"
        if self.prop == "repeat":
            return f"{where}: differs between two runs of the same message"
        if self.prop == "ranks":
            return (f"{where}: rank {self.rank}{self.place} holds other bits than rank 0"
                    f"{self.ref_place} ({self.detail})")
        return (f"{where}: rank {self.rank}{self.place}'s gathered row is not its input "
                f"({self.detail})")


@dataclass
class Reading:
    """The parent's reading of one collective on all ranks."""

    collective: str
    world: int
    sizes: tuple[int, ...]
    dtypes: tuple[str, ...]
    mismatches: list[CollectiveMismatch] = field(default_factory=list)
    #: dtype -> whether the inputs can show summation order on this many ranks
    order_shows: dict[str, bool] = field(default_factory=dict)
    #: rank -> where it ran (" on node N (node rank K, local rank L)"), across nodes only
    places: dict[int, str] = field(default_factory=dict)

    def of(self, prop: str, dtype: str | None = None) -> list[CollectiveMismatch]:
        return [m for m in self.mismatches
                if m.prop == prop and (dtype is None or m.dtype == dtype)]

    def sizes_differing(self, dtype: str) -> list[int]:
        return sorted({m.size for m in self.of("sizes", dtype)})

    def figures(self, dtype: str) -> dict[str, Any]:
        """The size property's drift in ``dtype`` (``harness.drift.figures``)."""
        differing = self.of("sizes", dtype)
        return {"sizes_differing": len(self.sizes_differing(dtype)),
                "max_ulp": max((m.ulp for m in differing), default=0),
                "max_abs": max((m.max_abs for m in differing), default=0.0),
                "totals": {"sizes_differing": len([n for n in self.sizes if n > 1])}}

    def row(self, dtype: str) -> str:
        """One line of the measured table."""
        differ = self.sizes_differing(dtype)
        tried = len([n for n in self.sizes if n > 1])
        ulp = self.figures(dtype)["max_ulp"]
        return (f"{self.collective} {dtype} x{self.world}: sizes {len(differ)} of {tried} "
                f"differ{' (' + ', '.join(map(str, differ)) + ' rows)' if differ else ''}"
                f"{f', max {ulp} ULP' if differ else ''}; "
                f"repeat {'differs' if self.of('repeat', dtype) else 'equal'}")


def read(collective: str, world: int, values: list[dict[str, Any]], sizes: tuple[int, ...],
         dtypes: tuple[str, ...], seed: int = 0, places: dict[int, str] | None = None
         ) -> Reading:
    """Parent side: every rank's ``measure`` values, read into mismatches; ``places``: where
    each rank ran, named in a mismatch (ranks on more than one node)."""
    reading = Reading(collective, world, sizes, dtypes, places=dict(places or {}))
    here = reading.places.get
    reducing = collective in ops.REDUCING
    for dtype in dtypes:
        reading.order_shows[dtype] = reducing and inputs.order_shows(world, dtype, seed)
        first = values[0][dtype]
        for n in sizes:
            for rank, value in enumerate(values):  # every rank's own, not rank 0's alone
                got = value[dtype]["sizes"][n]
                for p in got["repeat"]:
                    reading.mismatches.append(CollectiveMismatch(
                        "repeat", dtype, n, p, "", rank, here(rank, "")))
                for p, row in got["rows"].items():
                    alone = value[dtype]["alone"][p]
                    if not _same(row, alone):
                        size = compare_bits(alone, row) or (0, float("inf"), -1, 1)
                        reading.mismatches.append(CollectiveMismatch(
                            "sizes", dtype, n, p, _diff(row, alone), rank, here(rank, ""),
                            ulp=size[2], max_abs=size[1]))
                if collective == "all_gather":
                    reading.mismatches.extend(_gather_exact(got["rows"], world, dtype, n, seed,
                                                            reading.places, rank))
            if collective in ("all_gather", "reduce_scatter"):
                continue  # a gather is checked against the inputs; a scatter's shards differ
            for rank, other in enumerate(values[1:], start=1):
                for p, row in other[dtype]["sizes"][n]["rows"].items():
                    if not _same(row, first["sizes"][n]["rows"][p]):
                        reading.mismatches.append(CollectiveMismatch(
                            "ranks", dtype, n, p, _diff(row, first["sizes"][n]["rows"][p]),
                            rank, here(rank, ""), here(0, "")))
    return reading


def _gather_exact(rows: dict[int, torch.Tensor], world: int, dtype: str, n: int, seed: int,
                  places: dict[int, str], holder: int = 0) -> list[CollectiveMismatch]:
    """Rank ``holder``'s gathered rows against every rank's inputs."""
    found = []
    for rank in range(world):
        expected = inputs.block(rank, 0, dtype, seed)
        for p, gathered in rows.items():
            if not _same(gathered[rank], expected[p]):
                held = f"as held by rank {holder}{places.get(holder, '')}: " if holder else ""
                found.append(CollectiveMismatch("exact", dtype, n, p,
                                                held + _diff(gathered[rank], expected[p]), rank,
                                                places.get(rank, "")))
    return found
