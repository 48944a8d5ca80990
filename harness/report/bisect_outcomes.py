"""``bisect.json`` files (written by ``npu-regress bisect``) read onto tonight's new
failures: the card of each new failure a bisect ran for says what it found ("first bad for
tonight's failure: vllm 0.24.0 (ends as tonight in 5 of 5 runs); 0.23.0 good in 5 of 5 runs;
3 candidates tried, 1 skip") or why it found nothing. Read as
untrusted input like every other file of the report: a file that is not a bisect outcome is
a problem said on the page, never a crash or a silent line."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from harness.report.compare import Comparison
from harness.report.load import Problems, read_json

#: the bisect.json layouts this reader knows (2: one outcome per failure group)
SCHEMAS = (1, 2, 3)
MAX_BYTES = 8 * 1024 * 1024


def load(paths: list[Path]) -> tuple[list[dict[str, Any]], Problems]:
    outcomes, problems = [], Problems()
    for path in paths:
        data, why = read_json(path, MAX_BYTES)
        if why is not None:
            problems.append(f"{path}: not read as a bisect outcome: {why}")
            continue
        fault = _fault(data)
        if fault:
            problems.append(f"{path}: not a bisect outcome ({fault})")
            continue
        outcomes.append(data)
    return outcomes, problems


def _fault(data: Any) -> str | None:
    if not isinstance(data, dict):
        return "not a JSON object"
    if data.get("schema") not in SCHEMAS:
        return f"schema {str(data.get('schema'))[:20]!r}, this reader knows {SCHEMAS}"
    for name, kind in (("runner", str), ("card", str), ("status", str), ("tests", list)):
        if not isinstance(data.get(name), kind):
            return f"'{name}' missing or not a {kind.__name__}"
    if not all(isinstance(t, str) for t in data["tests"]):
        return "'tests' holds a non-string"
    if data["schema"] >= 2:
        groups = data.get("groups")
        if not isinstance(groups, list) or not all(
                isinstance(g, dict) and isinstance(g.get("card"), str)
                and isinstance(g.get("tests"), list)
                and all(isinstance(t, str) for t in g["tests"]) for g in groups):
            return "'groups' missing, or a group without a 'card' text and 'tests' list"
    return None


def _cards(outcome: dict[str, Any]) -> list[tuple[str, list[str]]]:
    """(card line, its tests): one per failure group (schema 2), or the one outcome's."""
    if outcome["schema"] >= 2:
        return [(g["card"], g["tests"]) for g in outcome["groups"]]
    return [(outcome["card"], outcome["tests"])]


def attach(comp: Comparison, outcomes: list[dict[str, Any]]) -> Problems:
    """Each outcome's card line onto its runner's cells of its tests; an outcome for tests
    that are not tonight's failures of that runner is said (an old or misplaced file)."""
    problems = Problems()
    for outcome in outcomes:
        matched = 0
        for text, tests in _cards(outcome):
            for test in tests:
                cell = comp.cells.get((test, outcome["runner"]))
                if cell is not None and cell.outcome in ("failed", "error"):
                    cell.bisect = text[:400]
                    matched += 1
        if not matched:
            problems.append(f"bisect of runner {outcome['runner']!r} "
                            f"({', '.join(outcome['tests'])[:200]}): none of its tests fails "
                            "on that runner tonight: not shown (another night's bisect?)")
    return problems
