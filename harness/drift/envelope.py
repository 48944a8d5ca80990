"""An envelope: the range each figure of a row took over the runs it was measured in, and
the bound above which tonight's figure is a drift that grew.

The bound of a figure measured from ``lo`` to ``hi`` over the runs, with the row's tolerance
``t`` (default ``DEFAULT_TOLERANCE``; at most ``MAX_TOLERANCE``):

- ``t * hi``, but never ``GROWTH_CAP`` times the smallest measured value or more: a growth
  of ten times what was measured never passes, whatever the tolerance;
- never below ``hi``: every measured run is inside its own envelope;
- a counted figure (cases, ULP) at least ``hi + 1``.

A figure measured as 0 in every run has the bound 0 (1 for a count): any drift there grew.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from harness.drift.figures import COUNTS, JUDGED, describe, judged

#: the default factor over the largest measured value: the measured rows repeat their
#: figures bit for bit run to run on one machine (docs/drift.md), so the slack is for
#: another machine of the same kind, not for noise
DEFAULT_TOLERANCE = 3.0
MAX_TOLERANCE = 9.0
#: a growth of this many times the smallest measured value always fails
GROWTH_CAP = 10.0


class EnvelopeError(ValueError):
    """A data file's envelope that cannot be judged by (the message names the row and the
    fix)."""


@dataclass(frozen=True)
class Breach:
    """One figure above its bound."""

    figure: str
    value: float
    lo: float
    hi: float
    bound: float

    def sentence(self, measured: str) -> str:
        growth = (f", {self.value / self.hi:.3g} times its measured maximum"
                  if self.hi > 0 else "")
        return (f"{describe(self.figure, self.value)} ({JUDGED.get(self.figure, self.figure)}) "
                f"is above its envelope {_num(self.figure, self.lo)}..{_num(self.figure, self.hi)} "
                f"(bound {_num(self.figure, self.bound)}{growth}); envelope measured: {measured}")


def _num(name: str, value: float) -> str:
    return describe(name, value).split(" ", 1)[1]


@dataclass(frozen=True)
class Envelope:
    """Per figure, (lo, hi) over ``runs`` runs; ``measured``: where, when, on what stack."""

    figures: dict[str, tuple[float, float]]
    runs: int
    measured: str
    tolerance: float = DEFAULT_TOLERANCE
    #: where the row came from, for the failure text ("harness/logprobs/expectations.toml
    #: row batch-size/tiny/...")
    where: str = field(default="", compare=False)
    #: figures kept and shown but never judged: those that count how many values a
    #: non-reproducible schedule touched (HTTP arrivals), not how far each moved; the row's
    #: evidence says why
    recorded_only: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not 1.0 <= self.tolerance <= MAX_TOLERANCE:
            raise EnvelopeError(f"{self.where}: tolerance {self.tolerance} is outside 1..."
                                f"{MAX_TOLERANCE}: a wider one would let a tenfold drift pass; "
                                "measure the row again instead")
        for name, (lo, hi) in self.figures.items():
            if name not in JUDGED:
                raise EnvelopeError(f"{self.where}: figure {name!r} is not one the judge "
                                    f"reads ({', '.join(JUDGED)})")
            if not 0 <= lo <= hi:
                raise EnvelopeError(f"{self.where}: figure {name} = [{lo}, {hi}]: give "
                                    "[smallest, largest] measured, both >= 0")

    def bound(self, name: str) -> float:
        lo, hi = self.figures[name]
        bound = self.tolerance * hi
        if lo > 0:
            bound = min(bound, GROWTH_CAP * lo * 0.99)
        bound = max(bound, hi)
        if name in COUNTS:
            bound = max(bound, hi + 1)
        return bound

    def breaches(self, figures: Mapping[str, Any]) -> list[Breach]:
        """The figures above their bounds (those the envelope holds; others are recorded,
        not judged)."""
        found = []
        for name, value in judged(figures).items():
            if name in self.recorded_only:
                continue
            if name in self.figures and value > self.bound(name):
                lo, hi = self.figures[name]
                found.append(Breach(name, value, lo, hi, self.bound(name)))
        return found

    def judge(self, figures: Mapping[str, Any], record: dict[str, Any]) -> list[Breach]:
        """Judge ``figures`` and note it in a drift ``record``: the envelope and bounds
        judged by, "grew" (and which figures) or "within". Returns the breaches."""
        record["envelope"] = self.to_record()
        grew = self.breaches(figures)
        record["judged"] = "grew" if grew else "within"
        if grew:
            record["grew"] = [b.figure for b in grew]
        return grew

    def to_record(self) -> dict[str, Any]:
        """For the results file: the ranges and bounds tonight was judged by."""
        return {"runs": self.runs, "measured": self.measured, "tolerance": self.tolerance,
                "figures": {n: list(r) for n, r in self.figures.items()},
                "bounds": {n: self.bound(n) for n in self.figures
                           if n not in self.recorded_only},
                **({"recorded_only": list(self.recorded_only)} if self.recorded_only else {})}


def from_data(data: Mapping[str, Any], where: str) -> Envelope:
    """An envelope from its data file table (``runs``, ``measured``, ``tolerance``, and a
    ``[lo, hi]`` per figure)."""
    figures: dict[str, tuple[float, float]] = {}
    for name, value in data.items():
        if name in ("runs", "measured", "tolerance", "recorded_only"):
            continue
        if (not isinstance(value, list) or len(value) != 2
                or not all(isinstance(v, (int, float)) for v in value)):
            raise EnvelopeError(f"{where}: figure {name} = {value!r}: give [smallest, "
                                "largest] measured")
        figures[name] = (value[0], value[1])
    runs = data.get("runs")
    if not isinstance(runs, int) or runs < 1:
        raise EnvelopeError(f"{where}: runs = {runs!r}: say how many runs measured it")
    recorded_only = data.get("recorded_only", [])
    if not isinstance(recorded_only, list) or not all(n in JUDGED for n in recorded_only):
        raise EnvelopeError(f"{where}: recorded_only = {recorded_only!r}: give a list of "
                            f"figures ({', '.join(JUDGED)})")
    return Envelope(figures, runs, str(data.get("measured", "")),
                    float(data.get("tolerance", DEFAULT_TOLERANCE)), where,
                    tuple(recorded_only))
