"""The report card's line of one bisect outcome (a failure group's), and the summary line of
several."""

from __future__ import annotations

from typing import Any


def card(outcome: dict[str, Any]) -> str:
    """One group's line: what it found, or why not, and what it tried."""
    tried = outcome.get("candidates_tried", 0)
    skips = outcome.get("skips", 0)
    tail = f"{tried} candidate{'s' * (tried != 1)} tried, {skips} skip{'s' * (skips != 1)}"
    if outcome.get("flaky"):
        tail += f", {len(outcome['flaky'])} flaky ({'; '.join(outcome['flaky'])[:300]})"
    if outcome["status"] == "found":
        first, last = outcome["first_bad"], outcome["last_good"]
        if outcome.get("last_good_other"):
            # the release before failed too, another way: it is not called good
            good = "fails another way"
        else:
            # "good" only where the good night's tests passed; a test that failed another
            # way that night (a fix bisected, an API that did not exist yet) ended "as
            # that night"
            good = "good" if outcome.get("good_night_passed", True) else "as the good night"
        return (f"first bad: {first['package']} {first['version']} ({last['version']} "
                f"{good}), {tail}")
    if outcome.get("culprits"):
        return f"culprit: {', '.join(outcome['culprits'])}; no single release: " \
            f"{outcome['why']}; {tail}"
    return f"not found: {outcome['why']}; {tail}"


def summary(groups: list[dict[str, Any]]) -> str:
    """The whole bisect's line: a group's own, or one per distinct failure."""
    if len(groups) == 1:
        return str(groups[0]["card"])
    return f"{len(groups)} distinct failures, one bisect each: " + " | ".join(
        f"[{i}] {', '.join(g['tests'])[:120]}: {g['card']}" for i, g in enumerate(groups, 1))
