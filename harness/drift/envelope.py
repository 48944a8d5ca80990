"""An envelope: the range each figure of a row took over the runs it was measured in, and
the bound above which tonight's figure is a drift that grew.

The bound of a figure measured from ``lo`` to ``hi`` over the runs, with the row's tolerance
``t`` (default ``DEFAULT_TOLERANCE``; at most ``MAX_TOLERANCE``):

- ``t * hi``, but never ``GROWTH_CAP`` times the smallest measured value or more: a growth
  of ten times what was measured never passes, whatever the tolerance;
- never below ``hi``: every measured run is inside its own envelope;
- a counted figure (cases, ULP) at least ``hi + 1``, but never its total (the cases
  compared, the tokens): where the bound would reach it, ``hi + 1``, said in the record;
- an exact count (``tokens_changed``) no slack at all: measured as 0, the first fails.

A figure measured as 0 in every run has the bound 0 (1 for a count): any drift there grew.

The judge fails closed: a figure the envelope holds that tonight's record lacks, or holds
as NaN, infinite, negative or no number, is not judged within. The record says
``judged = "unjudgeable"`` with each figure and why, and the row fails as ours (category
``harness``: our code lost the figure), never as a pass.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from harness.drift.figures import COUNTS, EXACT, JUDGED, describe, judged, unusable

#: a record's key holding a count figure's total: ``differing`` of ``totals["differing"]``
TOTALS = "totals"

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

    def sentence(self, measured: str, where: str = "") -> str:
        growth = (f", {self.value / self.hi:.3g} times its measured maximum"
                  if self.hi > 0 else "")
        return (f"{describe(self.figure, self.value)} ({JUDGED.get(self.figure, self.figure)}) "
                f"is above its envelope {_num(self.figure, self.lo)}..{_num(self.figure, self.hi)} "
                f"(bound {_num(self.figure, self.bound)}{growth}); envelope measured: {measured}"
                + (f"; judged by {where}" if where else ""))


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
    #: the runner it was measured on (``harness.stack.identity``); it judges only a runner
    #: of the same identity, field for field (empty: measured before envelopes named their
    #: runner, matching none)
    runner: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.figures:
            raise EnvelopeError(f"{self.where}: an envelope with no figure judges nothing; "
                                "measure the row again (npu-regress expectations update)")
        if not 1.0 <= self.tolerance <= MAX_TOLERANCE:
            raise EnvelopeError(f"{self.where}: tolerance {self.tolerance} is outside 1..."
                                f"{MAX_TOLERANCE}: a wider one would let a tenfold drift pass; "
                                "measure the row again instead")
        for name, (lo, hi) in self.figures.items():
            if name not in JUDGED:
                raise EnvelopeError(f"{self.where}: figure {name!r} is not one the judge "
                                    f"reads ({', '.join(JUDGED)})")
            if any(unusable(name, v) for v in (lo, hi)) or not lo <= hi:
                raise EnvelopeError(f"{self.where}: figure {name} = [{lo}, {hi}]: give "
                                    "[smallest, largest] measured, both finite and >= 0")

    def bound(self, name: str, total: float | None = None) -> float:
        """The bound of figure ``name``; ``total``: what a count counts out of tonight (the
        bound never reaches it while the measured maximum is below it)."""
        lo, hi = self.figures[name]
        if name in EXACT:
            return hi
        bound = self.tolerance * hi
        if lo > 0:
            bound = min(bound, GROWTH_CAP * lo * 0.99)
        bound = max(bound, hi)
        if name in COUNTS:
            bound = max(bound, hi + 1)
            if total is not None and bound >= total > hi + 1:
                bound = hi + 1
        return bound

    def judged_names(self) -> list[str]:
        return [n for n in self.figures if n not in self.recorded_only]

    def unjudgeable(self, figures: Mapping[str, Any]) -> dict[str, str]:
        """The envelope's judged figures that ``figures`` lacks or holds as no size, each
        with why: never judged within."""
        found = {}
        for name in self.judged_names():
            if name not in figures:
                found[name] = f"{name} is missing"
            elif why := unusable(name, figures[name]):
                found[name] = why
        return found

    def breaches(self, figures: Mapping[str, Any],
                 totals: Mapping[str, Any] | None = None) -> list[Breach]:
        """The figures above their bounds (those the envelope holds; others are recorded,
        not judged). Figures that cannot be judged are ``unjudgeable``'s, not here."""
        found = []
        totals = totals or {}
        for name, value in judged(figures).items():
            if name in self.recorded_only or name not in self.figures or unusable(name, value):
                continue
            bound = self.bound(name, _total(totals.get(name)))
            if value > bound:
                lo, hi = self.figures[name]
                found.append(Breach(name, value, lo, hi, bound))
        return found

    def judge(self, figures: Mapping[str, Any], record: dict[str, Any]) -> list[Breach]:
        """Judge ``figures`` and note it in a drift ``record``: the envelope and bounds
        judged by, and "grew" (which figures), "within", or "unjudgeable": a figure missing or
        no size (``record["unjudgeable"]``) with none grown, never within (the caller fails
        the row as ours). A figure that grew is the release's, said with the evidence there
        is; figures that could not be judged beside it are listed too. Returns the
        breaches."""
        totals = figures.get(TOTALS) if isinstance(figures.get(TOTALS), Mapping) else {}
        record["envelope"] = self.to_record(totals)
        bad = self.unjudgeable(figures)
        if bad:
            record["unjudgeable"] = list(bad.values())
        grew = self.breaches(figures, totals)
        record["judged"] = "grew" if grew else "unjudgeable" if bad else "within"
        if grew:
            record["grew"] = [b.figure for b in grew]
        return grew

    def to_record(self, totals: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """For the results file: the ranges and bounds tonight was judged by (a count's
        bound held below its total says so in ``capped``)."""
        totals = totals or {}
        bounds = {n: self.bound(n, _total(totals.get(n))) for n in self.judged_names()}
        capped = {n: f"bound {bounds[n]:g}: the largest measured count plus one, since "
                     f"{self.tolerance:g}x would reach the total {totals[n]:g}"
                  for n in bounds if bounds[n] != self.bound(n)}
        return {"runs": self.runs, "measured": self.measured, "tolerance": self.tolerance,
                "judged_by": self.where, "runner": dict(self.runner),
                "figures": {n: list(r) for n, r in self.figures.items()},
                "bounds": bounds, **({"capped": capped} if capped else {}),
                **({"recorded_only": list(self.recorded_only)} if self.recorded_only else {})}


def _total(value: Any) -> float | None:
    return float(value) if not unusable("total", value) else None


def unjudgeable_sentence(record: Mapping[str, Any], what: str) -> str:
    """The failure text of a row whose figures could not be judged: ours, naming each."""
    return (f"harness: {what}: cannot be judged against its envelope, "
            + "; ".join(record.get("unjudgeable") or ()) + ": the check lost or garbled a "
            "figure its row judges (a renamed upstream metric, a shape mismatch), so nothing "
            "is said to be within; a failure of ours, not the release's")


def from_data(data: Mapping[str, Any], where: str) -> Envelope:
    """An envelope from its data file table (``runs``, ``measured``, ``tolerance``, and a
    ``[lo, hi]`` per figure)."""
    figures: dict[str, tuple[float, float]] = {}
    for name, value in data.items():
        if name in ("runs", "measured", "tolerance", "recorded_only", "runner"):
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
    runner = data.get("runner", {})
    if not isinstance(runner, Mapping) or not all(isinstance(v, (str, int))
                                                  for v in runner.values()):
        raise EnvelopeError(f"{where}: runner = {runner!r}: give the identity it was measured "
                            "on as a table of fields (npu-regress expectations update writes "
                            "it)")
    return Envelope(figures, runs, str(data.get("measured", "")),
                    float(data.get("tolerance", DEFAULT_TOLERANCE)), where,
                    tuple(recorded_only), {str(k): str(v) for k, v in runner.items()})
