"""Tonight's failures grouped by signature: two new failures with different statements are
two bisects, each with its own card, budget share and resumable state; the tests of one
group (the parametrizations of a check failing alike) are one bisect."""

from __future__ import annotations

from dataclasses import dataclass

from harness.bisect.signature import Signature
from harness.bisect.trial import Ending
from harness.report.load import RunResults


@dataclass(frozen=True)
class Group:
    """Tests that fail tonight with one signature."""

    signature: Signature
    tests: tuple[str, ...]

    @property
    def name(self) -> str:
        return self.signature.digest


def by_signature(tonight: RunResults, tests: list[str]) -> list[Group]:
    """``tests`` grouped by tonight's signature of each, in the order of their first test."""
    found: dict[Signature, list[str]] = {}
    for test in tests:
        found.setdefault(Ending.of(tonight.tests.get(test)).signature, []).append(test)
    return [Group(signature, tuple(members)) for signature, members in found.items()]
