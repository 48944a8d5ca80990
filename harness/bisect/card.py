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
    confirmed = outcome.get("confirmed") or []
    if outcome["status"] == "found":
        first, last = outcome["first_bad"], outcome["last_good"]
        said = next((c for c in confirmed if c.startswith(f"{last['version']} ")), None)
        if outcome.get("other_since") or outcome.get("last_good_other"):
            # the releases before it failed too, another way: never called good
            since = outcome.get("other_since") or last["version"]
            good = (f"{said or last['version'] + ' fails another way'}; the releases before "
                    f"it fail another way since {since}: "
                    f"{str(outcome.get('last_good_other') or '')[:200]}")
        elif outcome.get("good_night_passed", True):
            good = said or f"{last['version']} good"
        else:
            # a test that failed another way on the good night (a fix bisected, an API that
            # did not exist yet) ended "as that night", not "good"
            good = (said or f"{last['version']} good").replace(" good", " as the good night",
                                                              1)
        bad = next((c for c in confirmed if c.startswith(f"{first['version']} ")), None)
        return (f"first bad for tonight's failure: {first['package']} {first['version']}"
                f"{' (' + bad.split(' ', 1)[1] + ')' if bad else ''}; {good}; {tail}")
    if outcome.get("culprits") and outcome.get("together"):
        return (f"culprits together: {', '.join(outcome['culprits'])}; no single release: "
                f"{outcome['why']}; {tail}")
    if outcome.get("culprits"):
        return f"culprit: {', '.join(outcome['culprits'])}; not found: {outcome['why']}; {tail}"
    return f"not found: {outcome['why']}; {tail}"


def summary(groups: list[dict[str, Any]]) -> str:
    """The whole bisect's line: a group's own, or one per distinct failure."""
    if len(groups) == 1:
        return str(groups[0]["card"])
    return f"{len(groups)} distinct failures, one bisect each: " + " | ".join(
        f"[{i}] {', '.join(g['tests'])[:120]}: {g['card']}" for i, g in enumerate(groups, 1))
