"""What each collective is expected to show on the size property, per backend and settings.

Repeat, rank agreement and gather exactness must always hold. The size property (a row's
result the same in a 1-row and an n-row message) is claimed by a switch for the collectives
its settings pin (HCCL_DETERMINISTIC=strict, NCCL's algorithm, protocol and channels): with
the switch's settings it must hold on HCCL and NCCL; without them it is recorded (the inverse
control). gloo reads none of those settings: its rows are what was measured here, so a
change either way is seen ("differ" that came out equal fails too: update the table)."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.drift.baselines import overlay
from harness.drift.envelope import TOTALS, Envelope, unjudgeable_sentence
from harness.drift.figures import describe
from harness.drift.table import Table, load
from harness.stack import identity

#: the measured gloo table (torch 2.13.0+cpu, 4 ranks, 2-core runner), a data file
DATA = Path(__file__).with_name("expected.toml")
KEY_FIELDS = ("collective", "backend", "world", "dtype")


@functools.lru_cache(maxsize=1)
def table() -> Table:
    return overlay(load(DATA, KEY_FIELDS), "collectives")


@dataclass(frozen=True)
class CollectiveExpectation:
    """``sizes``: "equal" (must hold), "differ" (must differ: a known property or the negative
    control) or "record" (no claim: measured and reported). ``measured``: per dtype, the
    data file's envelope of a measured row (None: none)."""

    sizes: str
    why: str
    measured: dict[str, Envelope | None] = field(default_factory=dict)
    #: the data file's key of the measured rows, without the dtype (empty: not a table row)
    key: tuple[str, ...] = ()
    #: the runner judged (``harness.stack.identity``), and per dtype why no envelope is its
    runner: dict[str, str] = field(default_factory=dict)
    elsewhere: dict[str, str] = field(default_factory=dict)


def expect(backend: str, collective: str, settings: str, world: int = 4
           ) -> CollectiveExpectation:
    if collective == "order_varying_all_reduce":
        return CollectiveExpectation(
            "differ", "the negative control: ranks summed in an order that rotates with the "
            "message size")
    if collective in ("fixed_order_all_reduce", "all_gather"):
        return CollectiveExpectation(
            "equal", f"{collective} fixes every element's order (or moves bits only), "
            "whatever the backend")
    rows = {key[3]: row for key, row in table().rows.items()
            if key[:2] == (collective, backend)}
    if backend == "gloo" and rows:
        if world != 4:
            return CollectiveExpectation(
                "record", f"gloo on {world} ranks: not measured (the table holds 4 ranks); "
                "recorded")
        ours = {d: r for d, r in rows.items() if r.key[2] == str(world)}
        first = next(iter(ours.values()))
        here = identity.runner("cpu")  # gloo ranks compute on the host CPU
        found = {d: r.envelope_for(here) for d, r in ours.items()}
        return CollectiveExpectation(first.outcome, first.evidence,
                                     {d: env for d, (env, _) in found.items()},
                                     (collective, backend, str(world)), here,
                                     {d: why for d, (_, why) in found.items() if why})
    if settings == "switch":
        return CollectiveExpectation(
            "equal", f"{backend} with the switch's collective settings: the switch promises "
            "batch-invariant collectives")
    return CollectiveExpectation(
        "record", f"{backend} without the switch's settings: no claim (the inverse control, "
        "recorded)")


def judge_sizes(reading: Any, expectation: CollectiveExpectation
                ) -> tuple[str, str, list[dict[str, Any]]]:
    """The size property's outcome ("pass", "fail", "xfail" or "record"), its message, and a
    drift record per dtype of a measured row, from a ``properties.Reading`` (vacuity is
    judged before: see ``vacuous``)."""
    collective = reading.collective
    differing = reading.of("sizes")
    rows = "; ".join(reading.row(d) for d in reading.dtypes)
    drift = [_record(reading, expectation, d) for d in reading.dtypes if expectation.key]
    if expectation.sizes == "equal" and differing:
        shown = [m.sentence(collective) for m in differing[:6]]
        more = [f"... {len(differing) - 6} more"] if len(differing) > 6 else []
        return "fail", (f"{collective} on {reading.world} ranks is not batch invariant "
                        f"({expectation.why}):\n- " + "\n- ".join(shown + more)), drift
    if expectation.sizes == "differ":
        if not differing:
            for record in drift:
                record["judged"] = "stale"
            return "fail", (f"{collective}: expected to differ across message sizes "
                            f"({expectation.why}), but every size gave the row's bits alone: "
                            "the table in harness/collectives/expected.toml is out of date"), \
                drift
        lost = [r["sentence"] for r in drift if r["judged"] == "unjudgeable"]
        if lost:  # fails closed, as ours (category harness, from the records)
            return "fail", "; ".join(lost), drift
        grew = [r["sentence"] for r in drift if r["judged"] == "grew"]
        if grew:
            return "fail", (f"drift grew: {collective} on {reading.world} "
                            f"{expectation.key[1]} ranks: " + "; ".join(grew)), drift
        if any(r["judged"] == "no-envelope" for r in drift):
            elsewhere = "".join(f"; {d}: {why}" for d, why in expectation.elsewhere.items())
            return "xfail", (f"no envelope: {rows}{elsewhere}; the figures are recorded, not "
                             "judged (npu-regress expectations update RESULTS.jsonl, or learn "
                             f"--history, adopts them into this runner's baselines); "
                             f"{expectation.why}"), drift
        if drift:
            return "xfail", (f"differs as expected, within its envelope: {rows} "
                             f"({expectation.why})"), drift
        return "xfail", f"{expectation.why}; here: {rows}", drift
    return ("record" if expectation.sizes == "record" else "pass"), rows, drift


def _record(reading: Any, expectation: CollectiveExpectation, dtype: str) -> dict[str, Any]:
    """One dtype's drift record: its figures against its row's envelope."""
    raw = reading.figures(dtype)
    figures = {n: v for n, v in raw.items() if n != TOTALS}
    envelope = expectation.measured.get(dtype)
    record: dict[str, Any] = {
        "table": "collectives", "row": expectation.sizes, "figures": figures,
        TOTALS: raw.get(TOTALS, {}),
        "key": dict(zip(KEY_FIELDS, (*expectation.key, dtype), strict=True)),
        "runner": dict(expectation.runner)}
    if not figures["sizes_differing"]:
        record["judged"] = "equal"
    elif envelope is None:
        record["judged"] = "no-envelope"
    else:
        grew = envelope.judge(raw, record)
        if grew:
            record["sentence"] = f"{dtype}: " + "; ".join(
                b.sentence(envelope.measured, envelope.where) for b in grew)
        elif record["judged"] == "unjudgeable":
            record["sentence"] = unjudgeable_sentence(record, f"{dtype} sizes")
    if record["judged"] not in ("grew", "unjudgeable"):
        record["sentence"] = f"{dtype}: " + ", ".join(describe(n, v)
                                                       for n, v in figures.items())
    return record


def vacuous(reading: Any, backend: str) -> str | None:
    """Why the size property proves nothing here (too few ranks to show order), or None."""
    from harness.collectives import ops

    if reading.collective not in ops.REDUCING or all(reading.order_shows.values()):
        return None
    return (f"vacuous: {reading.world} {backend} rank(s) cannot show summation order (a "
            "2-rank sum is the same in either order); the size property needs 3 or more "
            "ranks (NPU_REGRESS_COLLECTIVE_RANKS; without -n on an accelerator runner): "
            "not a pass")


def vacuous_nodes(nodes: dict[int, str], claimed: int) -> str | None:
    """Why a run that claims ``claimed`` nodes did not show it (fewer distinct node ids among
    its ranks), or None: a cross-node property not seen across nodes is not a pass."""
    seen = sorted(set(nodes.values()))
    if claimed <= 1 or len(seen) >= claimed:
        return None
    return (f"vacuous: {claimed} nodes claimed (--ranks-nnodes), but the group's {len(nodes)} "
            f"ranks ran on {len(seen)} ({', '.join(seen)}): give each node a distinct host "
            "name or $NPU_REGRESS_NODE_ID; not a pass")
