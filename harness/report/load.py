"""Reading results files (and JUnit XML) from other runners, which may be truncated,
malformed or hostile.

Nothing here trusts its input: every line is parsed on its own, every field is checked for
type and size, and a bad line becomes a recorded problem (file and line number), never an
exception. A truncated file (a killed run) yields every complete line and says it had no
footer.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import os
import re
import stat
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.report import schema
from harness.report.schema import OUTCOMES

FAILING = ("failed", "error", "xpassed")
_OUTCOME = {o: o for o in OUTCOMES}
#: longest string kept from any field (longer ones are cut, not rejected)
MAX_TEXT = 20_000
MAX_LINE = 2_000_000
#: problems kept per list (a night of 500,000 duplicate ids must not make an 85 MB page):
#: the rest are counted
MAX_PROBLEMS = 1000
#: collected-but-not-yet-seen ids kept per run (beyond it, only the counts)
MAX_PENDING = 200_000
#: deepest nesting kept from a header, footer or report field (deeper parts become text)
MAX_DEPTH = 8
#: worst first: which outcome a test id that appears twice keeps
_SEVERITY = {"error": 0, "failed": 1, "xpassed": 2, "passed": 3, "xfailed": 4, "skipped": 5}


@dataclass(slots=True)
class TestResult:
    id: str
    outcome: str
    duration: float = 0.0
    reason: str = ""
    longrepr: str = ""
    dispatch_events: dict[str, int] | None = None
    logprob_report: Any = None
    children: tuple[dict[str, Any], ...] = ()
    #: "upstream-drift" where the failure is a missing or renamed upstream symbol
    category: str = ""
    #: a switch case's dispatcher footprint: operator -> the dispatch keys it changed
    dispatcher_footprint: dict[str, tuple[str, ...]] | None = None
    #: the size of a difference, compared and drawn night to night: rollout vs training's
    #: (``schema.FIGURES``) and the figures of the drift record that decided the test (its
    #: worst judged: a row that grew before one within), never a merge of its rows (an fp32
    #: row's figure beside a bf16 row's bound would be neither)
    figures: dict[str, float] | None = None
    #: that record's envelope bounds, and how it was judged ("within", "grew",
    #: "no-envelope"...)
    bounds: dict[str, float] | None = None
    judged: str = ""
    #: that record's row key ("batch-size/tiny/cpu/x86_64/float32/off"), where it has one
    drift_row: str = ""
    #: a failure's problem lines as the check stated them (empty in older files)
    problems: tuple[str, ...] = ()
    #: the check's other recorded properties (where it ran, its settings), name -> value
    properties: dict[str, Any] | None = None

    @property
    def failing(self) -> bool:
        return self.outcome in FAILING


class Problems(list[str]):
    """A list of problems that keeps the first ``MAX_PROBLEMS`` and counts the rest."""

    def __init__(self, items: Any = ()) -> None:
        super().__init__()
        self.dropped = 0
        self.extend(items)

    def append(self, problem: str) -> None:
        if len(self) < MAX_PROBLEMS:
            super().append(problem)
        else:
            self.dropped += 1

    def extend(self, problems: Any) -> None:
        self.dropped += getattr(problems, "dropped", 0)
        for problem in problems:
            self.append(problem)

    @property
    def total(self) -> int:
        return len(self) + self.dropped


@dataclass
class RunResults:
    path: str
    runner: str
    header: dict[str, Any] = field(default_factory=dict)
    footer: dict[str, Any] | None = None
    tests: dict[str, TestResult] = field(default_factory=dict)
    problems: Problems = field(default_factory=Problems)
    #: why the file was not read at all (a link, a FIFO, unreadable), or None
    refused: str | None = None
    #: how many tests the run collected ("collected" lines; None: not recorded)
    collected: int | None = None
    #: collected ids with no test line (yet): after reading, the tests that never ran
    pending: set[str] = field(default_factory=set)
    #: pending ids past MAX_PENDING, counted only
    pending_uncounted: int = 0
    #: lines that could not be read at all, and those whose id and outcome were recovered
    unreadable: int = 0
    #: each of those lines as said in ``problems`` (``FILE:LINE: why``), in file order
    lost: list[str] = field(default_factory=list)
    recovered: int = 0
    #: test lines whose duration was not a finite number (shown as n/a)
    bad_durations: int = 0
    #: why this run's clock is not trusted to date the report (set by the comparison)
    clock_warning: str | None = None
    #: why this reader cannot trust its reading of the file (a newer results schema)
    schema_problem: str | None = None

    @property
    def start(self) -> _dt.datetime | None:
        """The run's start as an aware UTC time, where its header has a readable one."""
        return utc_time(self.header.get("start"))

    @property
    def date(self) -> str:
        """The night: the run's start date in UTC."""
        start = self.start
        return start.date().isoformat() if start is not None else "unknown-date"

    @property
    def duration(self) -> float | None:
        """The run's duration in seconds; None (n/a) where it is not a finite number."""
        if self.footer and "duration" in self.footer:
            value = self.footer["duration"]
            return float(value) if _finite(value) else None
        return sum(t.duration for t in self.tests.values())

    @property
    def complete(self) -> bool:
        return self.footer is not None

    @property
    def not_run(self) -> int:
        """Collected tests that never ran (the night ended first)."""
        return len(self.pending) + self.pending_uncounted

    @property
    def ended_early(self) -> str | None:
        """How the night ended before its end, in words for the first screen, or None."""
        footer = self.footer
        if footer is not None and footer.get("source") == "junit":
            return None
        ran = len(self.tests)
        of = f" of {self.collected}" if self.collected is not None else ""
        if footer is None:
            return (f"no footer: the run was killed (or is still running) after {ran}{of} "
                    "tests")
        signame = footer.get("signal")
        status = footer.get("exitstatus")
        if isinstance(signame, str) and signame:
            return f"ended by {_text(signame, 20)} after {ran}{of} tests: exitstatus {status}"
        if footer.get("interrupted") or status == 2:
            return f"interrupted after {ran}{of} tests: exitstatus {status}"
        if self.not_run:
            return f"ended after {ran}{of} tests: exitstatus {status}"
        return None


def utc_time(value: Any) -> _dt.datetime | None:
    """An ISO time as aware UTC (a naive one is taken as UTC), or None."""
    if not isinstance(value, str) or len(value) < 10:
        return None
    try:
        when = _dt.datetime.fromisoformat(value[:40])
    except ValueError:
        try:
            when = _dt.datetime.fromisoformat(value[:10])
        except ValueError:
            return None
    if when.tzinfo is None:
        return when.replace(tzinfo=_dt.timezone.utc)
    return when.astimezone(_dt.timezone.utc)


def _finite(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and \
        math.isfinite(value)


def _text(value: Any, limit: int = MAX_TEXT) -> str:
    if value is None:
        return ""
    text = value if isinstance(value, str) else json.dumps(_plain(value), default=str)
    text = text if len(text) <= limit else text[:limit] + " [...cut]"
    return _writable(text)


def _writable(text: str) -> str:
    """``text``, or a copy with each lone surrogate ("\ud800" in JSON, which cannot be
    written as UTF-8) replaced; the original object when there is none (memory)."""
    if text.isascii():
        return text
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "replace").decode("utf-8")
    return text


def _plain(value: Any, depth: int = 0) -> Any:
    """A JSON value with strings made writable and nesting cut at MAX_DEPTH (a 1000-deep
    line must not break every later render)."""
    if isinstance(value, str):
        return _writable(value)
    if depth >= MAX_DEPTH and isinstance(value, dict | list):
        return "[nested too deep: cut]"
    if isinstance(value, dict):
        return {_plain(str(k)): _plain(v, depth + 1) for k, v in list(value.items())[:1000]}
    if isinstance(value, list):
        return [_plain(v, depth + 1) for v in value[:1000]]
    if isinstance(value, float) and not math.isfinite(value):
        return None  # NaN / Infinity: not JSON, and no number to draw
    return value


#: distinct dispatch-event counts seen, each held once: 10^6 tests mostly share a few
#: (read-only: nothing mutates a result's counts)
_SHARED_EVENTS: dict[tuple[tuple[str, int], ...], dict[str, int]] = {}
_SHARED_MAX = 100_000


def _events(value: Any) -> dict[str, int] | None:
    if not isinstance(value, dict):
        return None
    events = {sys.intern(_text(k, 200)): int(v) for k, v in list(value.items())[:500]
              if isinstance(v, int) and not isinstance(v, bool)}
    key = tuple(events.items())
    shared = _SHARED_EVENTS.get(key)
    if shared is not None:
        return shared
    if len(_SHARED_EVENTS) < _SHARED_MAX:
        _SHARED_EVENTS[key] = events
    return events


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and _finite(value)


def _rollout_figures(report: Any) -> dict[str, float]:
    """A rollout-vs-training report's figures, when every one is a finite number."""
    if not isinstance(report, dict) or report.get("check") != schema.ROLLOUT_CHECK:
        return {}
    values = {name: report.get(name) for name in schema.FIGURES}
    if not all(_number(v) for v in values.values()):
        return {}
    return {name: float(v) for name, v in values.items()}  # type: ignore[arg-type]


#: how a drift record was judged, worst first (a test keeps its worst record's)
JUDGED_ORDER = ("grew", "stale", "no-envelope", "within", "equal", "none")


def _drift(record: dict[str, Any]) -> tuple[dict[str, float] | None, dict[str, float] | None,
                                            str, str]:
    """(figures, bounds, judged, row) of a test line: its rollout figures and the figures
    and bounds of the one drift record that decided it (the worst judged, the first of
    equals), how it was judged, and its row key."""
    figures = _rollout_figures(record.get("logprob_report"))
    records = record.get("drift")
    chosen: dict[str, Any] | None = None
    judged = ""
    for item in records[:64] if isinstance(records, list) else ():
        if not isinstance(item, dict):
            continue
        how = item.get("judged")
        how = how if how in JUDGED_ORDER else ""
        if chosen is None or (how and (not judged or JUDGED_ORDER.index(how)
                                       < JUDGED_ORDER.index(judged))):
            chosen, judged = item, how
    if chosen is None:
        return figures or None, None, "", ""
    for name, value in (chosen.get("figures") or {}).items() if isinstance(
            chosen.get("figures"), dict) else ():
        if isinstance(name, str) and len(name) <= 60 and _number(value):
            figures[name] = float(value)
    envelope = chosen.get("envelope")
    bounds = {name: float(value) for name, value in
              ((envelope.get("bounds") or {}).items() if isinstance(envelope, dict)
               and isinstance(envelope.get("bounds"), dict) else ())
              if isinstance(name, str) and len(name) <= 60 and _number(value)}
    key = chosen.get("key")
    row = "/".join(str(v) for v in key.values())[:200] if isinstance(key, dict) else ""
    return figures or None, bounds or None, judged, row


def _small(value: Any) -> Any:
    """A JSON value kept as-is when small, else its text cut to MAX_TEXT."""
    if value is None:
        return None
    value = _plain(value)
    text = json.dumps(value, default=str)
    return value if len(text) <= MAX_TEXT else _text(text)


def _children(value: Any) -> tuple[dict[str, Any], ...]:
    if not isinstance(value, list) or not value:
        return ()
    out = []
    for child in value[:20]:
        if isinstance(child, dict):
            out.append({_text(k, 100): (v if isinstance(v, int | float | bool) or v is None
                                        else _text(v, 4000)) for k, v in child.items()})
    return tuple(out)


def parse_test(record: dict[str, Any], *, lean: bool = False) -> TestResult:
    """One test line, checked and cut to size; ``lean``: only what the history folds (id,
    outcome, duration, dispatch events), the texts left out."""
    test_id, outcome = record.get("id"), record.get("outcome")
    if not isinstance(test_id, str) or not test_id:
        raise ValueError("a test line without a string 'id'")
    if outcome not in OUTCOMES:
        raise ValueError(f"outcome {_text(outcome, 40)!r} is not one of {', '.join(OUTCOMES)}")
    duration = record.get("duration", 0.0)
    result = TestResult(
        id=_text(test_id, 1000), outcome=_OUTCOME[outcome],  # one str object per outcome
        duration=float(duration) if _finite(duration) else 0.0,
        dispatch_events=_events(record.get("dispatch_events")))
    result.figures, result.bounds, result.judged, result.drift_row = _drift(record)
    if not lean:
        reason = _text(record.get("reason"))
        result.reason = sys.intern(reason) if len(reason) <= 300 else reason  # shared
        result.longrepr = _text(record.get("longrepr"))
        result.problems = _lines(record.get("problems"))
        result.logprob_report = _small(record.get("logprob_report"))
        if result.failing:  # only a failure's card shows its children (memory)
            result.children = _children(record.get("children"))
        result.category = _text(record.get("category"), 40)
        result.dispatcher_footprint = _footprint(record.get("dispatcher_footprint"))
        result.properties = _properties(record.get("properties"))
    return result


def _properties(value: Any) -> dict[str, Any] | None:
    """A test line's ``properties``: a mapping of at most ``schema.MAX_PROPERTIES`` names,
    each value small or cut to text; None if not a mapping."""
    if not isinstance(value, dict):
        return None
    return {_text(name, 100): _small(item)
            for name, item in list(value.items())[:schema.MAX_PROPERTIES]} or None


#: characters kept of each of a failure's problem lines (``schema.MAX_PROBLEM_LINES`` of them)
MAX_PROBLEM_CHARS = 2000


def _lines(value: Any) -> tuple[str, ...]:
    """A failure's problem lines: strings only, cut to size; () if not a list."""
    if not isinstance(value, list):
        return ()
    return tuple(_text(v, MAX_PROBLEM_CHARS) for v in value[:schema.MAX_PROBLEM_LINES]
                 if isinstance(v, str))


#: operators kept of one footprint (a switch overrides a handful; the rest is noise)
MAX_FOOTPRINT = 64


def _footprint(value: Any) -> dict[str, tuple[str, ...]] | None:
    """A dispatcher footprint ({op: [keys]}) checked and cut to size; None if not one."""
    if not isinstance(value, dict):
        return None
    out: dict[str, tuple[str, ...]] = {}
    for op, keys in list(value.items())[:MAX_FOOTPRINT]:
        if isinstance(op, str) and isinstance(keys, list):
            out[_text(op, 200)] = tuple(_text(k, 40) for k in keys[:8] if isinstance(k, str))
    return out


def load_junit(path: Path) -> RunResults:
    """A JUnit XML file from a runner that wrote no results file (pytest --junitxml, other
    harnesses). Parsed with defusedxml: entity bombs and external entities are refused."""
    from defusedxml import ElementTree
    from defusedxml.common import DefusedXmlException

    run = RunResults(path=str(path), runner=path.stem)
    run.refused = readable_file(path)
    if run.refused:
        run.problems.append(f"{path}: {run.refused}")
        return run
    try:
        root = ElementTree.parse(path).getroot()
    except (ElementTree.ParseError, DefusedXmlException, OSError) as exc:
        run.problems.append(f"{path.name}: not readable JUnit XML ({type(exc).__name__}: "
                            f"{_text(str(exc), 300)})")
        return run
    suites = [root] if root.tag == "testsuite" else root.findall("testsuite")
    for suite in suites:
        if suite.get("hostname") and run.runner == path.stem:
            run.runner = _text(suite.get("hostname"), 200)
        if suite.get("timestamp"):
            run.header.setdefault("start", _text(suite.get("timestamp"), 40))
        for case in suite.iter("testcase"):
            name = f"{case.get('classname', '')}::{case.get('name', '')}".strip(":")
            if not name:
                run.problems.append(f"{path.name}: a testcase without a name skipped")
                continue
            outcome, text = "passed", ""
            for tag, meaning in (("failure", "failed"), ("error", "error"),
                                 ("skipped", "skipped")):
                node = case.find(tag)
                if node is not None:
                    outcome = meaning
                    text = node.get("message", "") + "\n" + (node.text or "")
                    break
            props = {p.get("name"): p.get("value") for p in case.iter("property")}
            try:
                events = json.loads(props["dispatch_events"]) if "dispatch_events" in props \
                    else None
            except ValueError:
                events = None
            try:
                duration = float(case.get("time", 0) or 0)
            except ValueError:
                duration = 0.0
            run.tests[_text(name, 1000)] = TestResult(
                id=_text(name, 1000), outcome=outcome, duration=duration,
                reason=_text(text.strip()) if outcome == "skipped" else "",
                longrepr=_text(text.strip()) if outcome != "skipped" else "",
                dispatch_events=_events(events))
    run.footer = {"source": "junit"}
    return run


def load_any(path: Path) -> RunResults:
    """A results file (JSON lines) or, by its .xml suffix, a JUnit XML file."""
    return load_junit(path) if path.suffix.lower() == ".xml" else load_results(path)


#: what a path that is not a regular file is, by its mode
_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
          (stat.S_ISSOCK, "a socket"))


def readable_file(path: Path, *, follow_links: bool = True) -> str | None:
    """Why ``path`` must not be read (a FIFO would hang, /dev/zero never ends, a link out of
    the history folder is not ours), named as what it is; None for a regular file, which
    is read as a stream whatever its size."""
    try:
        st = os.stat(path) if follow_links else os.lstat(path)
    except FileNotFoundError:
        return "no such results file"
    except OSError as exc:
        return f"cannot read ({exc})"
    if stat.S_ISLNK(st.st_mode):
        return "a symbolic link: not followed"
    if not stat.S_ISREG(st.st_mode):
        kind = next((name for test, name in _KINDS if test(st.st_mode)), "not a regular file")
        return f"{kind}, not a results file: not read"
    return None


def read_json(path: Path, max_bytes: int) -> tuple[Any, str | None]:
    """A small JSON file given to the report (a bisect outcome, a reproducer's record):
    (its data, None), or (None, why it was not read: not a regular file, larger than
    ``max_bytes``, not JSON)."""
    why = readable_file(path)
    if why is None and path.stat().st_size > max_bytes:
        why = f"larger than {max_bytes} bytes"
    if why is not None:
        return None, why
    try:
        return json.loads(path.read_text(encoding="utf-8", errors="replace")), None
    except ValueError as exc:
        return None, f"not JSON: {exc}"


#: what becomes of each test line read: (run, where, record, result) -> None
Keep = Callable[[RunResults, str, dict[str, Any], TestResult], None]


def load_results(path: Path, *, follow_links: bool = True, keep: Keep | None = None,
                 lean: bool = False) -> RunResults:
    """Every readable line of one results file; problems recorded, never raised. Each test
    goes into ``run.tests`` (the worst outcome of a repeated id kept), or to ``keep``
    instead: the history folds its nights line by line, never holding a whole night, and
    reads them ``lean`` (no failure texts: see ``parse_test``)."""
    run = RunResults(path=str(path), runner=path.stem)
    run.refused = readable_file(path, follow_links=follow_links)
    if run.refused:
        run.problems.append(f"{path}: {run.refused}")
        return run
    try:
        fh = open(path, "rb")  # noqa: SIM115 - read line by line: memory by tests, not lines
    except OSError as exc:
        run.refused = f"cannot read ({exc})"
        run.problems.append(f"{path}: {run.refused}")
        return run
    name, keep = path.name, keep or keep_worst
    with fh:
        number = 0
        while raw_line := fh.readline(MAX_LINE + 1):
            number += 1
            if len(raw_line) > MAX_LINE:  # read no more of it than the limit at a time
                size, head = len(raw_line), raw_line[:RECOVER_BYTES]
                outcome = _recover_outcome(raw_line)
                while not raw_line.endswith(b"\n") and (raw_line := fh.readline(MAX_LINE)):
                    size += len(raw_line)
                    outcome = outcome or _recover_outcome(raw_line)
                _unreadable(run, f"{name}:{number}", head, outcome,
                            f"a line of {size} bytes, more than the {MAX_LINE} read", keep)
                continue
            _read_line(run, f"{name}:{number}", raw_line, keep, lean)
    if not run.header:
        run.problems.append(f"{path.name}: no header line; runner named after the file")
    if run.footer is None:
        run.problems.append(f"{path.name}: no footer: the run was cut short; "
                            f"{len(run.tests)} finished tests kept")
    return run


def read_records(path: Path) -> tuple[RunResults, list[tuple[str, dict[str, Any]]]]:
    """The one parse of a results file for the readers that need its test lines as written
    (the expectations tools, the reproducer): the run (header, footer, problems, the
    unreadable lines counted and named) and each test line's (id, record) in file order. A
    line whose id and outcome alone were recovered comes as (id, {"outcome": ...})."""
    records: list[tuple[str, dict[str, Any]]] = []

    def keep(run: RunResults, where: str, record: dict[str, Any], result: TestResult) -> None:
        records.append((result.id, record))
        keep_worst(run, where, record, result)

    return load_results(path, keep=keep), records


def lost_lines(run: RunResults) -> str:
    """The lines of ``run`` that could not be read, said as every reader says them (how
    many, and the first few named), or "" when every line was read."""
    if not run.lost:
        return ""
    return (f"{len(run.lost)} line(s) could not be read ({'; '.join(run.lost[:3])}"
            f"{'; ...' if len(run.lost) > 3 else ''}: a night cut short or a file edited by "
            "hand)")


#: bytes at the start of an unreadable line searched for its type, id and outcome (the
#: harness writes those first)
RECOVER_BYTES = 65536
_TYPE_TEST = re.compile(rb'"type"\s*:\s*"test"')
_ID = re.compile(rb'"id"\s*:\s*"((?:[^"\\]|\\.){1,2000})"')
_OUTCOME_RE = re.compile(rb'"outcome"\s*:\s*"(' + "|".join(OUTCOMES).encode() + rb')"')


def _recover_outcome(chunk: bytes) -> str | None:
    found = _OUTCOME_RE.search(chunk)
    return found.group(1).decode() if found else None


def _unreadable(run: RunResults, where: str, head: bytes, outcome: str | None, why: str,
                keep: Keep) -> None:
    """A line that cannot be loaded is still counted: a test line whose id and outcome
    can be found in its first bytes is kept with them (its failure text says what was
    lost); any other is counted as unreadable, for the first screen."""
    found = _ID.search(head) if _TYPE_TEST.search(head[:4096]) else None
    test_id = None
    if found:
        try:
            test_id = json.loads(b'"' + found.group(1) + b'"')
        except ValueError:
            test_id = None
    if isinstance(test_id, str) and test_id and outcome is not None:
        run.recovered += 1
        run.lost.append(f"{where}: {why}; only its id and outcome were recovered")
        run.problems.append(run.lost[-1])
        result = TestResult(id=_text(test_id, 1000), outcome=_OUTCOME[outcome],
                            longrepr=f"(this test's results line could not be read: {why}; "
                                     "its id and outcome were recovered, its failure text "
                                     "and properties are lost)")
        keep(run, where, {"outcome": outcome}, result)
        run.pending.discard(result.id)
        return
    run.unreadable += 1
    shown = f" (test {_text(test_id, 200)!r}, outcome not found)" if test_id else ""
    run.lost.append(f"{where}: {why}: unreadable{shown}")
    run.problems.append(run.lost[-1])


def _read_line(run: RunResults, where: str, raw_line: bytes, keep: Keep, lean: bool) -> None:
    """One line of a results file into ``run``; a bad line is recovered or counted."""
    line = raw_line.decode("utf-8", errors="replace")
    if not line.strip():
        return
    try:
        record = json.loads(line)
        if not isinstance(record, dict):
            raise ValueError("not a JSON object")
        kind = record.get("type")
        if kind == schema.HEADER:
            run.header = {k: _plain(v) for k, v in record.items() if isinstance(k, str)}
            if isinstance(record.get("runner"), str) and record["runner"].strip():
                run.runner = _text(record["runner"], 200)
            newer = schema.schema_problem(record)
            if newer:
                run.schema_problem = newer
                run.problems.append(f"{where}: {newer}")
        elif kind == schema.TEST:
            result = parse_test(record, lean=lean)
            if not _finite(record.get("duration", 0.0)):
                run.bad_durations += 1
            keep(run, where, record, result)
            run.pending.discard(result.id)
        elif kind == schema.COLLECTED:
            _collected(run, record)
        elif kind == schema.FOOTER:
            run.footer = {k: _plain(v) for k, v in record.items() if isinstance(k, str)}
        else:
            raise ValueError(f"unknown line type {_text(kind, 40)!r}")
    except (ValueError, TypeError, KeyError, RecursionError) as exc:
        why = "nested too deep to read" if isinstance(exc, RecursionError) else \
            f"not readable ({_text(str(exc), 300)})"
        _unreadable(run, where, raw_line[:RECOVER_BYTES], _recover_outcome(raw_line), why,
                    keep)


def _collected(run: RunResults, record: dict[str, Any]) -> None:
    """A "collected" line: ids the run meant to run (the first MAX_PENDING kept)."""
    total, ids = record.get("total"), record.get("ids")
    if not isinstance(ids, list):
        raise ValueError("a collected line without an 'ids' list")
    if isinstance(total, int) and not isinstance(total, bool):
        run.collected = total
    for test_id in ids:
        if not isinstance(test_id, str) or test_id in run.tests:
            continue
        if len(run.pending) < MAX_PENDING:
            run.pending.add(_text(test_id, 1000))
        else:
            run.pending_uncounted += 1


def keep_worst(run: RunResults, where: str, record: dict[str, Any], result: TestResult) -> None:
    """Into ``run.tests``; a repeated id keeps its worst outcome and is reported."""
    earlier = run.tests.get(result.id)
    if earlier is not None:
        teardown = record.get("when") == "teardown" and result.outcome == "error"
        if not teardown:  # a second teardown-error line is the harness's own
            run.problems.append(
                f"{where}: test id {_text(result.id, 200)!r} appears again "
                f"({earlier.outcome}, then {result.outcome}); the worst is kept")
        if worse(earlier.outcome, result.outcome):
            return  # never hide a worse outcome behind a better one
        result.longrepr = (earlier.longrepr + "\n" + result.longrepr).strip()
    run.tests[result.id] = result


def worse(first: str, second: str) -> bool:
    """Whether outcome ``first`` is at least as bad as ``second`` (error worst, skip least)."""
    return _SEVERITY[first] <= _SEVERITY[second]
