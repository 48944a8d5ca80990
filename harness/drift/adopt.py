"""Adopting figures as an envelope: the reviewed act behind ``npu-regress expectations
update RESULTS.jsonl...`` (as pytest-regressions' ``--force-regen`` or syrupy's
``--snapshot-update``: the data files change, and the diff is what a maintainer reviews).

Each results file's test lines carry ``drift`` records (table, key, figures, how judged). A
row's new envelope is the [smallest, largest] of each figure over every run given; it
replaces the old one (the runs given are the measurement; after a deliberate upstream change
the old one no longer holds). A record is refused, and said, when its test failed for any
reason but a drift that grew, when the row came out equal (stale: its outcome is what to
correct, not its envelope), or when the run cannot measure the row (too few threads).

Adoption cannot swallow a regression: a run whose row grew is refused unless the growth is
accepted with a reason (``--accept-growth``), which the row keeps in its ``history`` with the
envelope it replaced; a row measured over fewer than ``min_runs`` runs is not written. Each
record names the runner it was computed on (``harness.stack.identity``: the accelerator or
CPU, and the torch threads): runs of one runner make that runner's envelope of the row,
never another's, and a record that names no runner is refused. Every row written says, per
figure, its old range, its new one and the factor."""

from __future__ import annotations

import difflib
import sys
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from harness.drift.envelope import DEFAULT_TOLERANCE, Envelope, EnvelopeError
from harness.drift.figures import judged, unusable
from harness.drift.table import Row, Table, with_envelope
from harness.report.load import lost_lines, read_records
from harness.stack import identity

#: a row's envelope for one runner: (table, row key, the runner's label)
_Slot = tuple[str, tuple[str, ...], str]

#: the runs a row's envelope should be measured over (docs/drift.md); fewer are adopted
#: and said
MIN_RUNS = 5
_ADOPTABLE = ("within", "grew", "no-envelope")


@dataclass
class Adoption:
    """What ``adopt`` did: rows written (table, key, runs), records refused (why), notes, and
    per figure of each row written its old range, new range and factor."""

    written: list[tuple[str, tuple[str, ...], int]] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    figures: list[str] = field(default_factory=list)


@dataclass
class _Run:
    path: Path
    header: dict[str, Any]
    tests: list[dict[str, Any]]


def read_runs(paths: list[Path]) -> list[_Run]:
    """The results files, read by the report's parser (``harness.report.load``): one that
    cannot be read, has no header, or has a line that cannot be read raises ``ValueError``
    naming it (an envelope is never measured from part of a night)."""
    runs = []
    for path in paths:
        run, records = read_records(path)
        if run.refused:
            raise ValueError(f"{path}: {run.refused}; give a results.jsonl that pytest "
                             "--harness-results wrote")
        if lost := lost_lines(run):
            raise ValueError(f"{path}: {lost}; a results file cut or edited by hand cannot "
                             "measure an envelope")
        if not run.header:
            raise ValueError(f"{path}: no header line: not a results file of npu-regress")
        runs.append(_Run(path, run.header, [{"id": test_id, **record}
                                            for test_id, record in records]))
    return runs


def adopt(paths: list[Path], tables: dict[str, Table], *,
          shipped: dict[str, Table] | None = None, accept_growth: str | None = None,
          min_runs: int = 1, today: str = "") -> Adoption:
    """Write the runs' figures into ``tables`` (in memory: ``Table.write`` saves them).
    ``shipped``: the tables a row not yet in ``tables`` is taken from (its outcome, its
    tolerance); ``accept_growth``: the reason a grown row is adopted anyway."""
    done = Adoption()
    runs = read_runs(paths)
    #: per (table, row key, runner): the figures of each run
    figures: dict[_Slot, list[dict[str, float]]] = defaultdict(list)
    rows: dict[_Slot, str] = {}
    runners: dict[_Slot, dict[str, str]] = {}
    #: the runs (results files) a row was measured in: a row that a file reports twice (two
    #: targets' cases, hf and hf-left) is one run of it
    where: dict[_Slot, dict[Path, dict[str, Any]]] = defaultdict(dict)
    grown: dict[_Slot, list[str]] = defaultdict(list)
    for run in runs:
        for test in run.tests:
            for record in test.get("drift") or []:
                if isinstance(record, dict) and record.get("judged") in ("equal", "none"):
                    continue  # nothing differed: no figure to adopt
                found = _key(record, tables, run.path, test, done)
                if found is None:
                    continue
                runner = record.get("runner")
                if not isinstance(runner, dict) or not runner:
                    done.refused.append(
                        f"{run.path}: {test.get('id')}: not adopted: the record names no "
                        "runner (written before envelopes were keyed by the runner's "
                        "identity); run the suites again with this npu-regress")
                    continue
                runner = {str(k): str(v) for k, v in runner.items()}
                key = (*found, identity.label(runner))
                runners[key] = runner
                why = _refusal(test, record, accept_growth)
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
                if record.get("judged") == "grew":
                    grown[key].append(f"{run.path.name}: {', '.join(record.get('grew') or [])}")
    for slot, measured in figures.items():
        name, key, label = slot
        table = tables[name]
        headers = where[slot]
        count = len(headers)
        runner = runners[slot]
        at = f"{table.where(key)} on {label}"
        if count < min_runs:
            done.refused.append(f"{at}: not written: measured over {count} "
                                f"run(s), --min-runs asks for {min_runs}")
            continue
        names = sorted({n for m in measured for n in m})
        ranges = {n: (min(m[n] for m in measured if n in m), max(m[n] for m in measured
                                                                   if n in m))
                  for n in names}
        old = table.get(key)
        # a row new to ``tables`` starts from the shipped table's (its outcome, tolerance)
        base = old or (shipped[name].get(key) if shipped and name in shipped else None)
        kept = base.envelope_for(runner)[0] if base else None
        # a figure's settings (tolerance, recorded only) are the row's, whichever runner
        like = kept or (base.envelopes[0] if base and base.envelopes else None)
        envelope = Envelope(ranges, count, _measured(list(headers.values()), runner),
                            like.tolerance if like else DEFAULT_TOLERANCE, table.where(key),
                            like.recorded_only if like else (), runner)
        if old is None:
            outcome = base.outcome if base else rows[slot]
            extra = {k: v for k, v in (base.extra if base else {}).items() if k != "history"}
            old = Row(key, outcome, "", base.envelopes if base else (), extra)
        # a row's prose is kept where a maintainer wrote it, else written from the data
        evidence = (old.evidence if old.evidence and not old.evidence.startswith(
            ("learned from", "adopted:")) else
            f"learned from this runner's own runs: {envelope.measured}")
        history = list(old.extra.get("history", []))
        if grown[slot] and accept_growth:
            history.append({"date": today, "accepted_growth": accept_growth, "runner": label,
                            "grew_in": grown[slot],
                            "replaced": {n: list(r) for n, r in (kept.figures.items()
                                                                  if kept else ())},
                            "replaced_measured": kept.measured if kept else ""})
        extra = {**old.extra, **({"history": history} if history else {})}
        table.put(with_envelope(replace(old, evidence=evidence, extra=extra), envelope))
        done.written.append((name, key, count))
        done.figures.extend(_compare(at, kept, ranges))
        if count < MIN_RUNS:
            done.notes.append(f"{at}: measured over {count} run(s); "
                              f"docs/drift.md asks for {MIN_RUNS} to see the spread")
    return done


def _compare(where: str, kept: Envelope | None,
             ranges: dict[str, tuple[float, float]]) -> list[str]:
    """Per figure: old range -> new range, and the factor of the new largest over the old."""
    lines = []
    for name, (lo, hi) in ranges.items():
        if kept is None or name not in kept.figures:
            lines.append(f"{where}: {name}: new {lo:g}..{hi:g}")
            continue
        old_lo, old_hi = kept.figures[name]
        factor = (f"x{hi / old_hi:.3g}" if old_hi > 0 else "from 0" if hi > 0 else "x1")
        lines.append(f"{where}: {name}: {old_lo:g}..{old_hi:g} -> {lo:g}..{hi:g} ({factor})")
    return lines


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


def _refusal(test: dict[str, Any], record: dict[str, Any],
             accept_growth: str | None = None) -> str:
    """Why this record's figures cannot become an envelope ("" where they can)."""
    judged_as = record.get("judged")
    if judged_as == "grew" and not accept_growth:
        return (f"not adopted: its row grew ({', '.join(record.get('grew') or []) or 'a figure'}"
                " above its bound): a regression is not an envelope; if the growth is "
                "deliberate (an upstream change you accept), adopt it with --accept-growth "
                "\"REASON\", which keeps the reason and the old envelope in the row's history")
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


def _measured(headers: list[dict[str, Any]], runner: dict[str, str]) -> str:
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
    threads = f", {runner['threads']} torch threads" if runner.get("threads") else ""
    return (f"{runs}, {span}, on {first.get('cpu') or first.get('platform', '?')}"
            f" ({device}; {stack}{threads})")


def update(results: list[Path], tables: Callable[[], dict[str, Table]], *,
           check: bool = False, shipped: Callable[[], dict[str, Table]] | None = None,
           accept_growth: str | None = None, min_runs: int = 1, today: str = "") -> int:
    """The command: ``tables()`` reads the tables to write (the user's baselines, or with
    ``--package-tables`` the shipped ones), ``shipped()`` those a new row is taken from. 0:
    written (or nothing to change); 1: ``--check`` and something would change; 2: unusable
    inputs, named."""
    try:
        found = tables()
        before = {name: table.dumps() for name, table in found.items()}
        done = adopt(results, found, shipped=shipped() if shipped else None,
                     accept_growth=accept_growth, min_runs=min_runs, today=today)
    except (ValueError, EnvelopeError) as exc:
        print(f"npu-regress expectations: {exc}", file=sys.stderr)
        return 2
    for line in done.refused:
        print(f"refused: {line}", file=sys.stderr)
    changed: list[str] = []
    for name, table in found.items():
        after = table.dumps()
        if after == before[name]:
            continue
        changed.append(str(table.label or table.path))
        rel = table.label or table.path.name
        sys.stdout.writelines(difflib.unified_diff(
            before[name].splitlines(keepends=True), after.splitlines(keepends=True),
            f"a/{rel}", f"b/{rel}"))
        if not check:
            table.write()
    for line in done.figures:
        print(f"figure: {line}", file=sys.stderr)
    for line in done.notes:
        print(f"note: {line}", file=sys.stderr)
    rows = len(done.written)
    print(f"npu-regress expectations: {rows} row(s) measured from {len(results)} run(s)"
          + ("; would change the data files" if check and changed else
             f"; written into {', '.join(changed)}: review the diff" if changed
             else "; nothing changed"),
          file=sys.stderr)
    return 1 if check and changed else 0
