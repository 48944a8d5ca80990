"""Adopting figures as an envelope: the reviewed act behind ``npu-regress expectations
update RESULTS.jsonl...`` (as pytest-regressions' ``--force-regen`` or syrupy's
``--snapshot-update``: the data files change, and the diff is what a maintainer reviews).

Each results file's test lines carry ``drift`` records (table, key, figures, how judged). A
row's new envelope is the [smallest, largest] of each figure over every run given; it
replaces the old one (the runs given are the measurement; after a deliberate upstream change
the old one no longer holds). A record is refused, and said, when its test failed for any
reason but a drift that grew, when the row came out equal (stale: its outcome is what to
correct, not its envelope), or when the run cannot measure the row (too few threads)."""

from __future__ import annotations

import difflib
import json
import sys
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.drift.envelope import DEFAULT_TOLERANCE, Envelope, EnvelopeError
from harness.drift.figures import judged, unusable
from harness.drift.table import Row, Table, with_envelope

#: the runs a row's envelope should be measured over (docs/drift.md); fewer are adopted
#: and said
MIN_RUNS = 5
_ADOPTABLE = ("within", "grew", "no-envelope")


@dataclass
class Adoption:
    """What ``adopt`` did: rows written (table, key, runs), and records refused (why)."""

    written: list[tuple[str, tuple[str, ...], int]] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


@dataclass
class _Run:
    path: Path
    header: dict[str, Any]
    tests: list[dict[str, Any]]


def read_runs(paths: list[Path]) -> list[_Run]:
    """The results files; one that cannot be read raises ``ValueError`` naming it."""
    runs = []
    for path in paths:
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as exc:
            raise ValueError(f"{path}: cannot read it ({exc}); give a results.jsonl that "
                             "pytest --harness-results wrote") from None
        header: dict[str, Any] = {}
        tests = []
        for n, text in enumerate(lines, start=1):
            try:
                record = json.loads(text)
            except json.JSONDecodeError:
                raise ValueError(f"{path}:{n}: not a JSON line; a results file cut or edited "
                                 "by hand cannot measure an envelope") from None
            if not isinstance(record, dict):
                raise ValueError(f"{path}:{n}: not a results line (a JSON object)")
            if record.get("type") == "header":
                header = record
            elif record.get("type") == "test":
                tests.append(record)
        if not header:
            raise ValueError(f"{path}: no header line: not a results file of npu-regress")
        runs.append(_Run(path, header, tests))
    return runs


def adopt(paths: list[Path], tables: dict[str, Table]) -> Adoption:
    """Write the runs' figures into ``tables`` (in memory: ``Table.write`` saves them)."""
    done = Adoption()
    runs = read_runs(paths)
    figures: dict[tuple[str, tuple[str, ...]], list[dict[str, float]]] = defaultdict(list)
    rows: dict[tuple[str, tuple[str, ...]], str] = {}
    #: the runs (results files) a row was measured in: a row that a file reports twice (two
    #: targets' cases, hf and hf-left) is one run of it
    where: dict[tuple[str, tuple[str, ...]], dict[Path, dict[str, Any]]] = defaultdict(dict)
    for run in runs:
        for test in run.tests:
            for record in test.get("drift") or []:
                if isinstance(record, dict) and record.get("judged") in ("equal", "none"):
                    continue  # nothing differed: no figure to adopt
                key = _key(record, tables, run.path, test, done)
                if key is None:
                    continue
                why = _refusal(test, record)
                if why:
                    done.refused.append(f"{run.path}: {test.get('id')}: {why}")
                    continue
                raw = record.get("figures") or {}
                bad = [why for name in judged(raw) if (why := unusable(name, raw[name]))]
                if bad:  # an envelope of inf can never fail again
                    done.refused.append(f"{run.path}: {test.get('id')}: not adopted: "
                                        f"{'; '.join(bad)}")
                    continue
                figures[key].append(judged(raw))
                rows[key] = str(record.get("row") or "record")
                where[key][run.path] = run.header
    for (name, key), measured in figures.items():
        table = tables[name]
        names = sorted({n for m in measured for n in m})
        ranges = {n: (min(m[n] for m in measured if n in m), max(m[n] for m in measured
                                                                   if n in m))
                  for n in names}
        old = table.get(key)
        runs = len(where[(name, key)])
        kept = old.envelope if old and old.envelope else None
        envelope = Envelope(ranges, runs, _measured(list(where[(name, key)].values())),
                            kept.tolerance if kept else DEFAULT_TOLERANCE, table.where(key),
                            kept.recorded_only if kept else ())
        if old is None:
            old = Row(key, rows[(name, key)], f"adopted: {envelope.measured}")
        table.put(with_envelope(old, envelope))
        done.written.append((name, key, runs))
        if runs < MIN_RUNS:
            done.notes.append(f"{table.where(key)}: measured over {runs} run(s); "
                              f"docs/drift.md asks for {MIN_RUNS} to see the spread")
    return done


def _key(record: Any, tables: dict[str, Table], path: Path, test: dict[str, Any],
         done: Adoption) -> tuple[str, tuple[str, ...]] | None:
    if not isinstance(record, dict) or record.get("table") not in tables:
        done.refused.append(f"{path}: {test.get('id')}: a drift record of no known table "
                            f"({str(record)[:80]})")
        return None
    table = tables[record["table"]]
    raw = record.get("key") or {}
    if not all(raw.get(f) for f in table.key_fields):
        return None  # a row the table does not key (the switch-on default "equal")
    return record["table"], tuple(str(raw[f]) for f in table.key_fields)


def _refusal(test: dict[str, Any], record: dict[str, Any]) -> str:
    """Why this record's figures cannot become an envelope ("" where they can)."""
    judged_as = record.get("judged")
    if record.get("not_adoptable"):
        return f"not adopted: {record['not_adoptable']}"
    if judged_as == "stale":
        return ("not adopted: the row came out equal (stale); correct its outcome in the "
                "data file instead")
    if judged_as not in _ADOPTABLE:
        return f"not adopted: nothing measured to adopt (judged {judged_as!r})"
    category = test.get("category") or (test.get("verdict") or {}).get("category")
    if test.get("outcome") in ("failed", "error") and category != "drift-grew":
        return (f"not adopted: the test {test.get('outcome')} for another reason than a "
                f"drift ({category or 'a release finding'}); fix that first")
    return ""


def _measured(headers: list[dict[str, Any]]) -> str:
    """Where and when: the runs' dates, CPU, and the stack they ran."""
    dates = sorted(str(h.get("start", ""))[:10] for h in headers if h.get("start"))
    span = (dates[0] if dates and dates[0] == dates[-1] else
            f"{dates[0]}..{dates[-1]}" if dates else "undated")
    first = headers[0]
    packages = first.get("packages") or {}
    stack = ", ".join(f"{k} {v}" for k, v in packages.items()
                      if v and k in ("torch", "torch_npu", "vllm", "vllm_ascend", "verl"))
    device = (first.get("device") or {}).get("kind", "?")
    runs = f"{len(headers)} run{'s' if len(headers) != 1 else ''}"
    return (f"{runs}, {span}, on {first.get('cpu') or first.get('platform', '?')}"
            f" ({device}; {stack})")


def update(results: list[Path], tables: Callable[[], dict[str, Table]], *,
           check: bool = False) -> int:
    """The command: ``tables()`` reads every family's data file. 0: written (or nothing to
    change); 1: ``--check`` and something would change; 2: unusable inputs, named."""
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
