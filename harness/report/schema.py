"""The results file's contract, shared by its writer (``harness.plugin.results``) and its
reader (``harness.report.load``): the schema version, the four line types and their fields,
the outcomes, and how a line is laid out (type, id and outcome first, so that a reader that
cannot parse a huge or deeply nested line still finds them in its first bytes).

A file is JSON lines: one ``header``, ``collected`` lines (the ids the session means to
run), one ``test`` line per finished test (a teardown error is a second line for the same
id), and one ``footer``; a file without a footer is a run cut short. A reader checks the
header's ``schema``: a file written by a newer schema is read as far as it goes, and said."""

from __future__ import annotations

import json
from typing import Any, TypedDict

#: bumped when a field changes meaning or a line type is added; readers say when a file is
#: newer than they are
SCHEMA = 1

HEADER, COLLECTED, TEST, FOOTER = "header", "collected", "test", "footer"
LINE_TYPES = (HEADER, COLLECTED, TEST, FOOTER)
OUTCOMES = ("passed", "failed", "error", "skipped", "xfailed", "xpassed")
#: the keys every line starts with, in this order, where it has them
FIRST_KEYS = ("type", "id", "outcome")


class Header(TypedDict, total=False):
    type: str
    schema: int
    runner: str
    host: str
    platform: str
    #: the CPU's model, architecture and rounding-relevant flags (envelopes name it)
    cpu: str
    python: str
    packages: dict[str, str | None]
    git_commit: str | None
    start: str  # ISO 8601, UTC
    device: dict[str, Any]
    hardware: dict[str, Any] | None
    isolation: str
    args: list[str]
    #: the stack manifest (``harness.plugin.stack_manifest``)
    manifest: dict[str, ManifestEntry] | None
    #: the stack profile and the pairing verdict (``harness.plugin.verdicts``)
    stack: dict[str, Any] | None


class ManifestEntry(TypedDict, total=False):
    """One package of the stack manifest: its version and where it was read
    (``harness.stack.installed``)."""

    version: str | None
    source: str
    #: npu-regress's own entry: the checkout's commit, and where it was read
    revision: str | None
    revision_source: str


class DriftRecord(TypedDict, total=False):
    """The size of a difference against its envelope (``harness.drift``), one per judged
    row: the row (table, key), the runner it was judged as, its figures, and how."""

    table: str
    key: dict[str, str]
    #: the row's claim: differ, gap, equal, record
    row: str
    #: the runner's identity (``harness.stack.identity``): what chooses its kernels
    runner: dict[str, str]
    figures: dict[str, float]
    #: what each count figure counts out of (``differing`` of 42 cases)
    totals: dict[str, float]
    #: within, grew, unjudgeable, no-envelope, stale, equal, none
    judged: str
    #: the envelope judged by: runs, measured, tolerance, judged_by, runner, figures, bounds
    envelope: dict[str, Any]
    grew: list[str]
    unjudgeable: list[str]
    #: why this run cannot measure the row (too few threads)
    not_adoptable: str
    sentence: str


class Collected(TypedDict):
    type: str
    total: int
    ids: list[str]


class Child(TypedDict, total=False):
    """One isolated child of a test (``harness.plugin.results.child_record``)."""

    pid: int | None
    method: str
    outcome: str
    recorder: str | None
    exitcode: int | None
    signal: str | None
    summary: str
    duration: float
    stdout_tail: str
    stderr_tail: str
    notes: list[str]


#: a test line's ``category``: whose problem a failure (or an expected failure) is. The
#: README's verdict table lists the same ids (tests/test_verdicts.py keeps the two equal)
CATEGORIES = ("release-finding", "drift-grew", "known-finding", "fixed-upstream",
              "upstream-drift", "vacuous", "not-comparable", "unsupported-stack",
              "forward-compat", "harness", "stand-in-limit", "required-capability")
#: the categories that say a failure is the runner's (a capability it declares required is
#: missing): never a release's, so nothing a bisect over releases could find
RUNNERS_OWN = ("required-capability",)


#: a failure's ``problems`` kept: lines, written and read back
MAX_PROBLEM_LINES = 64
#: a test line's ``properties``: how many, and the JSON text of each, kept at most
MAX_PROPERTIES = 32
MAX_PROPERTY_CHARS = 4000


class Test(TypedDict, total=False):
    type: str
    id: str
    outcome: str  # one of OUTCOMES
    when: str  # setup, call or teardown: the phase that ended the test
    duration: float
    device: str
    hardware: str | None
    isolation: str
    dispatch_events: dict[str, int] | None
    logprob_report: Any
    dispatcher_footprint: dict[str, list[str]] | None
    patch_guard: Any
    #: the cause before the verdict: one of ``CATEGORIES``
    category: str | None
    verdict: dict[str, str] | None
    release_finding: Any
    upstream_drift: Any
    #: the size of a difference against its envelope, one record per judged row
    #: (``harness.drift``: table, key, row, figures, envelope, judged)
    drift: list[DriftRecord] | None
    children: list[Child]
    #: the check's other recorded properties (``record_property``) that have no field of
    #: their own: where it ran (``collective_nodes``), its settings and rows, the IPC
    #: decision... name -> JSON value, each cut to ``MAX_PROPERTY_CHARS`` (as text past it)
    properties: dict[str, Any] | None
    reason: str  # a skip's or an xfail's
    longrepr: str  # a failure's text, its tail
    #: a failure's problem lines, whole (``failure_lines`` of the exception): what a bisect
    #: compares as the failure's signature
    problems: list[str]


#: a ``logprob_report`` whose ``check`` is this carries rollout-vs-training figures, which the
#: report compares night to night (``harness.logprobs.rollout.Consistency.to_dict``)
ROLLOUT_CHECK = "rollout-vs-training"
#: the figures kept per test and night (numbers; the rest of the report is not folded)
FIGURES = ("tokens", "bit_equal", "max_ulp", "max_abs", "kl_max")


class Footer(TypedDict, total=False):
    type: str
    end: str
    exitstatus: int
    interrupted: bool
    signal: str | None
    collected: int | None
    counts: dict[str, int]
    duration: float


def line(record: Header | Collected | Test | Footer | dict[str, Any]) -> str:
    """One line of the results file: ``FIRST_KEYS`` first, the rest sorted."""
    first = {key: record[key] for key in FIRST_KEYS if key in record}  # type: ignore[literal-required]
    rest = {key: value for key, value in record.items() if key not in first}
    text = json.dumps(first, default=str)
    if rest:
        tail = json.dumps(rest, default=str, sort_keys=True)
        text = text[:-1] + ", " + tail[1:] if first else tail
    return text + "\n"


def schema_problem(header: dict[str, Any]) -> str | None:
    """Why this reader cannot trust its reading of a file with ``header``, or None."""
    version = header.get("schema")
    if version is None:
        return None  # written before the field existed: schema 1
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        return f"header schema {str(version)[:40]!r} is not a schema version"
    if version > SCHEMA:
        return (f"written with results schema {version}, newer than this reader's "
                f"{SCHEMA}: read as far as it goes; update npu-regress to read it whole")
    return None


# --- the contract as a JSON Schema (docs/results.schema.json is generated from it) -------

#: where the generated schema is kept (``python -m harness.report.schema > FILE``);
#: tests/test_results_contract.py fails when it is stale
SCHEMA_FILE = "docs/results.schema.json"


def _type_schema(hint: Any) -> dict[str, Any]:
    """A JSON Schema for one annotation of the contract's TypedDicts."""
    import types
    import typing

    if hint is Any:
        return {}
    if hint is type(None):
        return {"type": "null"}
    if hint is bool:
        return {"type": "boolean"}
    if hint is int:
        return {"type": "integer"}
    if hint is float:
        return {"type": "number"}
    if hint is str:
        return {"type": "string"}
    if typing.is_typeddict(hint):
        return {"$ref": f"#/$defs/{hint.__name__}"}
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return {"anyOf": [_type_schema(a) for a in args]}
    if origin is list:
        return {"type": "array", "items": _type_schema(args[0]) if args else {}}
    if origin is dict:
        return {"type": "object", "additionalProperties": _type_schema(args[1]) if args
                else {}}
    raise TypeError(f"the results contract has an annotation the schema cannot say: {hint!r}")


def _object(cls: Any) -> dict[str, Any]:
    import typing

    hints = typing.get_type_hints(cls)
    found: dict[str, Any] = {"type": "object", "properties": {
        name: _type_schema(hint) for name, hint in hints.items()}}
    if cls.__doc__ and not cls.__doc__.startswith(cls.__name__ + "("):
        found["description"] = " ".join(cls.__doc__.split())
    required = sorted(getattr(cls, "__required_keys__", ()))
    if required:
        found["required"] = required
    return found


def json_schema() -> dict[str, Any]:
    """The results file's lines as a JSON Schema (draft 2020-12): one of the four line
    types, each with its fields; fields the contract does not name are allowed (a newer
    writer's), as the readers allow them."""
    kinds = {HEADER: Header, COLLECTED: Collected, TEST: Test, FOOTER: Footer}
    defs = {cls.__name__: _object(cls)
            for cls in (Header, Collected, Test, Footer, Child, DriftRecord, ManifestEntry)}
    for kind, cls in kinds.items():
        defs[cls.__name__]["properties"]["type"] = {"const": kind}
        defs[cls.__name__]["required"] = sorted({"type", *defs[cls.__name__].get("required",
                                                                              [])})
    defs[TEST.capitalize()]["properties"]["outcome"] = {"enum": list(OUTCOMES)}
    defs[TEST.capitalize()]["properties"]["category"] = {
        "anyOf": [{"enum": list(CATEGORIES)}, {"type": "null"}]}
    return {"$schema": "https://json-schema.org/draft/2020-12/schema",
            "title": f"npu-regress results file line (schema {SCHEMA})",
            "description": "One line of results.jsonl (pytest --harness-results): generated "
                           "from harness/report/schema.py; do not edit.",
            "oneOf": [{"$ref": f"#/$defs/{cls.__name__}"} for cls in kinds.values()],
            "$defs": defs}


if __name__ == "__main__":
    print(json.dumps(json_schema(), indent=2, sort_keys=True))
