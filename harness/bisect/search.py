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
#: a failure, but not tonight's (it partly agrees with it): on the good side of a search for
#: the first release that ends as tonight, and said as such, never called good
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
    """Where the search over one package's releases ended."""

    #: index of the last candidate that did not end as tonight (as the good night, or in
    #: another failure), and of the first that did (0 and len-1 are the two nights' own)
    last_good: int
    first_bad: int
    #: candidate index -> verdict, in the order they were tried
    verdicts: dict[int, str] = field(default_factory=dict)
    #: indices between last_good and first_bad that could not be judged
    unresolved: list[int] = field(default_factory=list)

    @property
    def found(self) -> bool:
        return not self.unresolved


def first_bad(count: int, probe: Callable[[int], str]) -> VersionSearch:
    """Binary search over candidates ``0..count-1`` (0 known GOOD, ``count-1`` known BAD):
    ``probe(i)`` is candidate ``i``'s verdict. GOOD and OTHER (a failure that is not
    tonight's) are before the change, BAD after it; a SKIP or FLAKY candidate is stepped
    around (the untried candidate nearest the middle is tried instead) and, where it is left
    between the two, the search ends unresolved."""
    if count < 2:
        raise ValueError("a version search needs the good and the bad version")
    verdicts: dict[int, str] = {0: GOOD, count - 1: BAD}
    while True:
        bad = min(i for i, v in verdicts.items() if v == BAD)
        good = max(i for i, v in verdicts.items() if v in (GOOD, OTHER) and i < bad)
        untried = [i for i in range(good + 1, bad) if i not in verdicts]
        if not untried:
            unresolved = [i for i in range(good + 1, bad) if verdicts.get(i) in UNJUDGED]
            return VersionSearch(good, bad, verdicts, unresolved)
        middle = (good + bad) / 2
        pick = min(untried, key=lambda i: (abs(i - middle), i))
        verdicts[pick] = probe(pick)
