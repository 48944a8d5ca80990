"""``npu-regress expectations update RESULTS.jsonl...``: the runs' figures become the
envelopes of their rows in the families' data files, printed as a diff to review."""

from __future__ import annotations

import difflib
import sys
from pathlib import Path

from harness.collectives import expected
from harness.drift.adopt import adopt
from harness.drift.envelope import EnvelopeError
from harness.drift.table import Table, load
from harness.logprobs import expectations


def tables() -> dict[str, Table]:
    """Every family's data file, by the name its drift records use."""
    return {"logprobs": load(expectations.DATA, expectations.KEY_FIELDS),
            "collectives": load(expected.DATA, expected.KEY_FIELDS)}


def update(results: list[Path], *, check: bool = False) -> int:
    """0: written (or nothing to change); 1: ``--check`` and something would change;
    2: unusable inputs, named."""
    try:
        found = tables()
        before = {name: table.dumps() for name, table in found.items()}
        done = adopt(results, found)
    except (ValueError, EnvelopeError) as exc:
        print(f"npu-regress expectations: {exc}", file=sys.stderr)
        return 2
    for line in done.refused:
        print(f"refused: {line}", file=sys.stderr)
    changed = False
    for name, table in found.items():
        after = table.dumps()
        if after == before[name]:
            continue
        changed = True
        rel = table.path.name
        sys.stdout.writelines(difflib.unified_diff(
            before[name].splitlines(keepends=True), after.splitlines(keepends=True),
            f"a/{rel}", f"b/{rel}"))
        if not check:
            table.write()
    for line in done.notes:
        print(f"note: {line}", file=sys.stderr)
    rows = len(done.written)
    print(f"npu-regress expectations: {rows} row(s) measured from {len(results)} run(s)"
          + ("; would change the data files" if check and changed else
             "; written: review the diff" if changed else "; nothing changed"),
          file=sys.stderr)
    return 1 if check and changed else 0
