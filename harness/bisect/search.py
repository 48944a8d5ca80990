"""The two searches, as pure functions over a ``probe`` (so that they are tested without
installing anything): delta debugging over the changed packages (Zeller's ddmin: the
smallest set of packages at tonight's versions, the rest at the good night's, that still
fails), and the first bad release of one package (a binary search that steps around skips,
as ``git bisect`` does, and reruns the two releases it ends on, so that a flaky verdict is
caught and said instead of named as the answer)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

GOOD, BAD, SKIP = "good", "bad", "skip"
#: a rerun that disagreed with the first run: neither good nor bad
FLAKY = "flaky"
VERDICTS = (GOOD, BAD, SKIP, FLAKY)

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


def ddmin(changes: Sequence[T], probe: Callable[[list[T]], str]) -> list[T]:
    """The 1-minimal subset of ``changes`` for which ``probe`` says BAD (``changes`` as a
    whole is known BAD, none of them known GOOD). ``probe(subset)``: the verdict with the
    changes in ``subset`` applied and the others reverted; SKIP (or FLAKY) is unresolved."""
    current = list(changes)
    n = 2
    while len(current) >= 2:
        chunks = _chunks(current, n)
        for chunk in chunks:
            if probe(chunk) == BAD:
                current, n = chunk, 2
                break
        else:
            for chunk in chunks:
                rest = [c for c in current if c not in chunk]
                if len(chunks) > 2 and probe(rest) == BAD:
                    current, n = rest, max(n - 1, 2)
                    break
            else:
                if n >= len(current):
                    break
                n = min(len(current), 2 * n)
    return current


@dataclass
class VersionSearch:
    """Where the search over one package's releases ended."""

    #: index of the last candidate that behaved as on the good night, and of the first that
    #: behaved as tonight (0 and len-1 are the two nights' own versions)
    last_good: int
    first_bad: int
    #: candidate index -> verdict, in the order they were tried (reruns included once)
    verdicts: dict[int, str] = field(default_factory=dict)
    #: indices between last_good and first_bad that could not be judged
    unresolved: list[int] = field(default_factory=list)

    @property
    def found(self) -> bool:
        return not self.unresolved


def first_bad(count: int, probe: Callable[[int], str],
              rerun: Callable[[int], str] | None = None) -> VersionSearch:
    """Binary search over candidates ``0..count-1`` (0 known GOOD, ``count-1`` known BAD):
    ``probe(i)`` is candidate ``i``'s verdict. A SKIP is stepped around (the untried
    candidate nearest the middle is tried instead). Where the search ends, the last good
    and the first bad candidate (not the two nights' own) are run once more with ``rerun``:
    one that disagrees with its first run is FLAKY, set aside like a skip, and the search
    goes on."""
    if count < 2:
        raise ValueError("a version search needs the good and the bad version")
    verdicts: dict[int, str] = {0: GOOD, count - 1: BAD}
    confirmed = {0, count - 1}
    while True:
        bad = min(i for i, v in verdicts.items() if v == BAD)
        good = max(i for i, v in verdicts.items() if v == GOOD and i < bad)
        untried = [i for i in range(good + 1, bad) if i not in verdicts]
        if untried:
            middle = (good + bad) / 2
            pick = min(untried, key=lambda i: (abs(i - middle), i))
            verdicts[pick] = probe(pick)
            continue
        if rerun is not None:
            doubtful = [i for i in (good, bad) if i not in confirmed]
            if doubtful:
                for i in doubtful:
                    confirmed.add(i)
                    if rerun(i) != verdicts[i]:
                        verdicts[i] = FLAKY
                continue
        unresolved = [i for i in range(good + 1, bad) if verdicts.get(i) in (SKIP, FLAKY)]
        return VersionSearch(good, bad, verdicts, unresolved)
