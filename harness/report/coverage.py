"""The switch coverage table: which operators and functions each target's switch covers, per
runner, side by side, so that a gap in one stack (SGLang's missing sum override, a release
that stops overriding ``_log_softmax``) is visible at a glance.

Read from the switch suite's results only: the operators from the "switch, enabled" case's
dispatcher footprint (what the switch really changed, not what it declares), the functions
from the outcome of the checks that test each rebinding with the switch on.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from harness.report.compare import Comparison

CASE = re.compile(r"::test_switch\[(?P<target>.+)-(?P<check>[a-z_]+)-enabled\]$")
#: check -> the column of the function it tests
FUNCTIONS = (("torch_sum", "torch.sum"), ("tensor_sum", "Tensor.sum"),
             ("add_rms_norm", "add_rms_norm"), ("fused_infer_attention_score", "FIA"))
#: a function check's outcome -> its cell
FUNCTION_CELL = {"passed": "yes", "skipped": "-", "failed": "FAILS", "error": "FAILS",
                 "xfailed": "FAILS (known finding)", "xpassed": "yes (ledger stale)"}


@dataclass
class CoverageRow:
    runner: str
    target: str
    #: one cell per column of ``Coverage.columns``
    cells: list[str]
    #: why the row has no footprint ("switch case failed", "skipped: ..."), or ""
    note: str = ""


@dataclass
class Coverage:
    columns: list[str]
    #: how many leading columns are operators (the rest are functions)
    op_columns: int
    rows: list[CoverageRow]


def coverage(comp: Comparison) -> Coverage:
    """The table for tonight's runs; empty rows where no switch case ran."""
    found: dict[tuple[str, str], dict[str, object]] = {}
    for runner in comp.runners:
        run = comp.runs.get(runner)
        for test_id, res in (run.tests.items() if run else ()):
            match = CASE.search(test_id)
            if match is None:
                continue
            found.setdefault((runner, match["target"]), {})[match["check"]] = res
    ops = sorted({op for checks in found.values()
                  if (res := checks.get("switch")) is not None
                  for op in (res.dispatcher_footprint or {})})
    rows = []
    for (runner, target), checks in sorted(found.items()):
        switch = checks.get("switch")
        footprint = getattr(switch, "dispatcher_footprint", None)
        note = ""
        if switch is None:
            note = "no switch case"
        elif switch.outcome == "skipped":
            note = f"skipped: {switch.reason}"[:200]
        elif footprint is None:
            note = f"switch case {switch.outcome}, no footprint recorded"
        cells = [("overridden" if op in footprint else "-") if footprint is not None else "?"
                 for op in ops]
        for check, _ in FUNCTIONS:
            res = checks.get(check)
            cells.append("?" if res is None else FUNCTION_CELL.get(res.outcome, res.outcome))
        if note.startswith("skipped"):
            cells = ["" for _ in cells]
        rows.append(CoverageRow(runner, target, cells, note))
    return Coverage([*ops, *(label for _, label in FUNCTIONS)], len(ops), rows)
