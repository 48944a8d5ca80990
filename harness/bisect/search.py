"""The two searches, as pure functions over a ``probe`` (so that they are tested without
installing anything): delta debugging over the changed packages (Zeller's ddmin: the
smallest set of packages at tonight's versions, the rest at the good night's, that still
fails; a subset that could not be judged is named, never taken for good), and the first bad
release of one package (a binary search that steps around what cannot be judged, skips and
flaky probes, as ``git bisect`` does). A probe confirms its own verdict (a trial's runs
agree, or it is FLAKY): the searches never rerun one."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

GOOD, BAD, SKIP = "good", "bad", "skip"
#: runs of one probe that disagreed: neither good nor bad
FLAKY = "flaky"
#: a failure, but not tonight's (it partly agrees with it): neither good nor bad. It bounds
#: the search for the first release that ends as tonight, and is said with its signature,
#: never called good
OTHER = "other"
VERDICTS = (GOOD, BAD, SKIP, FLAKY, OTHER)
#: verdicts that cannot be taken either way
UNJUDGED = (SKIP, FLAKY)

T = TypeVar("T")


def _chunks(items: list[T], n: int) -> list[list[T]]:
    size, extra = divmod(len(items), n)
    out, start = [], 0
    for i in range(n):
        end = start + size + (1 if i < extra else 0)
        if end > start:
            out.append(items[start:end])
        start = end
    return out


@dataclass
class Reduction(Generic[T]):
    """Where delta debugging ended: the smallest failing subset it found, and the subsets of
    it that could not be judged (any of them might fail alone)."""

    culprits: list[T]
    untried: list[list[T]] = field(default_factory=list)

    @property
    def minimal(self) -> bool:
        """No smaller failing subset can hide among the untried ones."""
        return len(self.culprits) == 1 or not self.untried


def ddmin(changes: Sequence[T], probe: Callable[[list[T]], str]) -> Reduction[T]:
    """The 1-minimal subset of ``changes`` for which ``probe`` says BAD (``changes`` as a
    whole is known BAD, none of them known GOOD). ``probe(subset)``: the verdict with the
    changes in ``subset`` applied and the others reverted; only BAD counts as failing, and a
    subset that SKIPs or is FLAKY is kept as untried."""
    current = list(changes)
    unjudged: list[list[T]] = []

    def fails(subset: list[T]) -> bool:
        verdict = probe(subset)
        if verdict in UNJUDGED:
            unjudged.append(subset)
        return verdict == BAD

    n = 2
    while len(current) >= 2:
        chunks = _chunks(current, n)
        for chunk in chunks:
            if fails(chunk):
                current, n = chunk, 2
                break
        else:
            for chunk in chunks:
                rest = [c for c in current if c not in chunk]
                if len(chunks) > 2 and fails(rest):
                    current, n = rest, max(n - 1, 2)
                    break
            else:
                if n >= len(current):
                    break
                n = min(len(current), 2 * n)
    untried = [s for s in unjudged if set(map(id, s)) < set(map(id, current))]
    return Reduction(current, untried)


@dataclass
class VersionSearch:
    """Where the search over one package's releases ended.

    The releases run GOOD, then (maybe) OTHER, then BAD: ``first_bad`` is the first that ends
    as tonight; ``before`` the one just before it that was judged (GOOD or OTHER);
    ``last_good`` the last that ended as the good night; ``other_since`` the first that fails
    another way (None where none did): the releases from it to ``before`` fail another way,
    which may hide tonight's failure, and are said, never called good."""

    last_good: int
    first_bad: int
    before: int
    other_since: int | None = None
    #: candidate index -> verdict, in the order they were tried
    verdicts: dict[int, str] = field(default_factory=dict)
    #: indices between ``before`` and ``first_bad`` that could not be judged
    unresolved: list[int] = field(default_factory=list)
    #: indices between ``last_good`` and ``other_since`` that could not be judged
    other_unresolved: list[int] = field(default_factory=list)

    @property
    def found(self) -> bool:
        return not self.unresolved


def first_bad(count: int, probe: Callable[[int], str],
              ends: tuple[str, str] = (GOOD, BAD)) -> VersionSearch:
    """Binary search over candidates ``0..count-1`` (0 known GOOD, ``count-1`` known BAD;
    ``ends`` where a confirmation found otherwise): ``probe(i)`` is candidate ``i``'s
    verdict. Two boundaries are searched: the first BAD (every candidate before it judged
    GOOD or OTHER), then, where some fail another way (OTHER), the first of those. A SKIP or
    FLAKY candidate is stepped around (the untried candidate nearest the middle is tried
    instead); one left next to a boundary leaves it unresolved."""
    if count < 2:
        raise ValueError("a version search needs the good and the bad version")
    verdicts: dict[int, str] = {0: ends[0], count - 1: ends[1]}
    while True:
        bads = [i for i, v in verdicts.items() if v == BAD]
        bad = min(bads) if bads else count
        judged = [i for i, v in verdicts.items() if v in (GOOD, OTHER) and i < bad]
        before = max(judged) if judged else -1
        gap = [i for i in range(before + 1, bad) if i not in verdicts]
        others = [i for i, v in verdicts.items() if v == OTHER and i < bad]
        goods = [i for i, v in verdicts.items() if v == GOOD and i < min(others or [bad])]
        good = max(goods) if goods else -1
        if not gap and others:
            gap = [i for i in range(good + 1, min(others)) if i not in verdicts]
        if not gap:
            unresolved = [i for i in range(before + 1, bad) if verdicts.get(i) in UNJUDGED]
            if before < 0 or bad >= count:  # an end itself could not be judged
                unresolved = [i for i in (0, count - 1) if verdicts[i] in UNJUDGED]
            since = min(others) if others else None
            other_unresolved = [i for i in range(good + 1, since)
                                if verdicts.get(i) in UNJUDGED] if since is not None else []
            return VersionSearch(good, bad, before, since, verdicts, unresolved,
                                 other_unresolved)
        middle = (min(gap) + max(gap)) / 2
        pick = min(gap, key=lambda i: (abs(i - middle), i))
        verdicts[pick] = probe(pick)


def runs_for(confidence: float) -> int:
    """Runs that must all agree before a boundary candidate is believed: the fewest ``n``
    for which a candidate that ends the other way in at least half of its runs would have
    agreed in all ``n`` with a chance under ``1 - confidence`` (0.5 ** n; 5 runs for 0.95)."""
    if not 0 < confidence < 1:
        raise ValueError(f"confidence {confidence}: give a number between 0 and 1")
    n = 1
    while 0.5 ** n >= 1 - confidence:
        n += 1
    return n
