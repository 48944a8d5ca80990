"""An expectation table as a data file beside its code: one ``[[row]]`` per key, with its
outcome, the prose evidence, and (where measured) its ``[[row.envelope]]``: one per runner
it was measured on (``runner``, ``harness.stack.identity``), each judging that runner only.

A family names its key fields (the logprob table: check, source, device, machine, dtype,
switch); the file's leading comment lines are its header and are kept when the file is
written again, so that ``npu-regress expectations update`` gives a diff to review."""

from __future__ import annotations

import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

from harness.drift.envelope import DEFAULT_TOLERANCE, Envelope, EnvelopeError, from_data
from harness.stack import identity

#: "equal" must hold; "differ" must differ, inside its envelope; "gap" a known coverage gap
#: (an XFAIL inside its envelope); "not-from" a diagnosis; "record" no claim (recorded)
OUTCOMES = ("equal", "differ", "gap", "not-from", "record")


@dataclass(frozen=True)
class Row:
    key: tuple[str, ...]
    outcome: str
    evidence: str
    #: one per runner identity it was measured on
    envelopes: tuple[Envelope, ...] = ()
    #: the family's own fields (the logprob table's ``op``, a row's ``history``)
    extra: dict[str, Any] = field(default_factory=dict)

    def envelope_for(self, here: Mapping[str, str]) -> tuple[Envelope | None, str]:
        """The envelope measured on a runner of ``here``'s identity, exactly; else None and
        why: the nearest envelope's runner and each field that differs."""
        for envelope in self.envelopes:
            if identity.matches(envelope.runner, here):
                return envelope, ""
        if not self.envelopes:
            return None, ""
        near = identity.nearest([e.runner for e in self.envelopes], here) or {}
        apart = identity.differences(near, here) if near else ["it names no runner"]
        return None, (f"no envelope for this runner ({identity.label(here)}): the nearest, "
                      f"measured on {identity.label(near)}, differs in "
                      + "; ".join(apart))


@dataclass
class Table:
    path: Path
    key_fields: tuple[str, ...]
    rows: dict[tuple[str, ...], Row]
    header: list[str] = field(default_factory=list)
    #: how the file is named in a row's ``where`` (default: its file name)
    label: str = ""

    def get(self, key: tuple[str, ...]) -> Row | None:
        return self.rows.get(key)

    def where(self, key: tuple[str, ...]) -> str:
        return f"{self.label or self.path.name} row {'/'.join(key)}"

    def put(self, row: Row) -> None:
        self.rows[row.key] = row

    def dumps(self) -> str:
        """The file's text: the header, then every row in order."""
        import tomli_w

        rows = []
        for row in self.rows.values():
            data: dict[str, Any] = dict(zip(self.key_fields, row.key, strict=True))
            data["outcome"] = row.outcome
            data.update(row.extra)
            data["evidence"] = row.evidence
            if row.envelopes:
                data["envelope"] = [_dump(envelope) for envelope in row.envelopes]
            rows.append(data)
        body = tomli_w.dumps({"row": rows}, multiline_strings=False)
        return "".join(f"{line}\n" for line in self.header) + ("\n" if self.header else "") \
            + body

    def write(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(self.dumps(), encoding="utf-8")


def _dump(envelope: Envelope) -> dict[str, Any]:
    env: dict[str, Any] = {"runs": envelope.runs, "measured": envelope.measured}
    if envelope.tolerance != DEFAULT_TOLERANCE:
        env["tolerance"] = envelope.tolerance
    if envelope.recorded_only:
        env["recorded_only"] = list(envelope.recorded_only)
    for name, (lo, hi) in envelope.figures.items():
        env[name] = [lo, hi]
    if envelope.runner:
        env["runner"] = dict(envelope.runner)
    return env


def load(path: Path, key_fields: Iterable[str], label: str = "") -> Table:
    """Read a table; a row that cannot be judged by raises ``EnvelopeError`` naming it.
    ``label``: how the file is named in its rows' ``where`` (default: its file name)."""
    key_fields = tuple(key_fields)
    text = path.read_text(encoding="utf-8")
    header = []
    for line in text.splitlines():
        if not line.startswith("#"):
            break
        header.append(line)
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise EnvelopeError(f"{path}: not TOML ({exc}); fix the file or take it from git") \
            from None
    table = Table(path, key_fields, {}, header, label)
    for n, raw in enumerate(data.get("row", []), start=1):
        missing = [f for f in (*key_fields, "outcome", "evidence") if f not in raw]
        if missing:
            raise EnvelopeError(f"{path} row {n}: no {', '.join(missing)}")
        key = tuple(str(raw[f]) for f in key_fields)
        where = table.where(key)
        if raw["outcome"] not in OUTCOMES:
            raise EnvelopeError(f"{where}: outcome {raw['outcome']!r}: use one of "
                                f"{', '.join(OUTCOMES)}")
        if key in table.rows:
            raise EnvelopeError(f"{where}: the key is there twice; keep one")
        found = raw.get("envelope", [])
        found = [found] if isinstance(found, dict) else found  # one table: an older file
        envelopes = tuple(from_data(env, where) if isinstance(env, dict) else
                          _not_a_table(env, where) for env in found)
        runners = [identity.label(e.runner) for e in envelopes]
        if len(set(runners)) < len(runners):
            raise EnvelopeError(f"{where}: two envelopes of one runner; keep one")
        extra = {k: v for k, v in raw.items()
                 if k not in (*key_fields, "outcome", "evidence", "envelope")}
        table.rows[key] = Row(key, raw["outcome"], raw["evidence"], envelopes, extra)
    return table


def _not_a_table(value: Any, where: str) -> Envelope:
    raise EnvelopeError(f"{where}: envelope = {value!r}: give a [[row.envelope]] table")


def with_envelope(row: Row, envelope: Envelope) -> Row:
    """``row`` with ``envelope`` in place of the one of the same runner (or added)."""
    kept = tuple(e for e in row.envelopes if dict(e.runner) != dict(envelope.runner))
    return replace(row, envelopes=(*kept, envelope))
