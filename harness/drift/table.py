"""An expectation table as a data file beside its code: one ``[[row]]`` per key, with its
outcome, the prose evidence, and (where measured) its ``[row.envelope]``.

A family names its key fields (the logprob table: check, source, device, machine, dtype,
switch); the file's leading comment lines are its header and are kept when the file is
written again, so that ``npu-regress expectations update`` gives a diff to review."""

from __future__ import annotations

import sys
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

from harness.drift.envelope import DEFAULT_TOLERANCE, Envelope, EnvelopeError, from_data

#: "equal" must hold; "differ" must differ, inside its envelope; "gap" a known coverage gap
#: (an XFAIL inside its envelope); "not-from" a diagnosis; "record" no claim (recorded)
OUTCOMES = ("equal", "differ", "gap", "not-from", "record")


@dataclass(frozen=True)
class Row:
    key: tuple[str, ...]
    outcome: str
    evidence: str
    envelope: Envelope | None = None
    #: the family's own fields (the logprob table's ``threads`` and ``op``)
    extra: dict[str, Any] = field(default_factory=dict)


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
            if row.envelope is not None:
                env: dict[str, Any] = {"runs": row.envelope.runs,
                                       "measured": row.envelope.measured}
                if row.envelope.tolerance != DEFAULT_TOLERANCE:
                    env["tolerance"] = row.envelope.tolerance
                if row.envelope.recorded_only:
                    env["recorded_only"] = list(row.envelope.recorded_only)
                for name, (lo, hi) in row.envelope.figures.items():
                    env[name] = [lo, hi]
                data["envelope"] = env
            rows.append(data)
        body = tomli_w.dumps({"row": rows}, multiline_strings=False)
        return "".join(f"{line}\n" for line in self.header) + ("\n" if self.header else "") \
            + body

    def write(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(self.dumps(), encoding="utf-8")


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
        envelope = from_data(raw["envelope"], where) if "envelope" in raw else None
        extra = {k: v for k, v in raw.items()
                 if k not in (*key_fields, "outcome", "evidence", "envelope")}
        table.rows[key] = Row(key, raw["outcome"], raw["evidence"], envelope, extra)
    return table


def with_envelope(row: Row, envelope: Envelope | None) -> Row:
    return replace(row, envelope=envelope)
