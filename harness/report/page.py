"""What the nightly page shows, in the order a reader at 3 a.m. needs it: which runners ran
what stack and how it went, what is new, each failure as a card with its diagnosis, then the
matrix by check family and the charts.

Plain data for the template (``report.html.j2``); every string here still comes from
untrusted results files and reaches HTML only through jinja2's autoescape.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from harness.report.compare import Cell, Comparison, changes_text
from harness.report.load import FAILING, RunResults, TestResult

#: check family -> the test-file name prefixes that belong to it (first match wins)
FAMILIES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("switch", ("test_batch_invariant_switch",)),
    ("logprob", ("test_logprob",)),
    ("rl-consistency", ("test_rl_consistency",)),
    ("collectives", ("test_collectives",)),
    ("hardware", ("test_ascend_hardware",)),
    ("patch-guard", ("test_patch_guard",)),
    ("preflight", ("test_stack_preflight",)),
)
OTHER = "other"
#: statuses that put a matrix row in view (the rest fold behind a count)
ATTENTION = ("new-failure", "still-failing", "flaky", "fixed", "newly-skipped", "vanished",
             "not-run")
#: the stack shown on each runner line: (label, where in the results header)
STACK = (("torch", ("packages", "torch")), ("torch_npu", ("packages", "torch_npu")),
         ("CANN", ("hardware", "cann_version")), ("driver", ("hardware", "driver_version")),
         ("vllm-ascend", ("packages", "vllm_ascend")), ("vLLM", ("packages", "vllm")),
         ("verl", ("packages", "verl")))
MESSAGE_LINES = 12
FIELD = 120


def family_of(test_id: str) -> str:
    module = test_id.split("::", 1)[0].rsplit("/", 1)[-1]
    for name, prefixes in FAMILIES:
        if module.startswith(prefixes):
            return name
    return OTHER


def _field(value: Any) -> str:
    """One header value as short text ('' when absent)."""
    if value is None or isinstance(value, dict | list):
        return ""
    text = str(value).strip()
    return text if len(text) <= FIELD else text[:FIELD] + "..."


def _lookup(header: dict[str, Any], path: tuple[str, str]) -> str:
    outer = header.get(path[0])
    return _field(outer.get(path[1])) if isinstance(outer, dict) else ""


@dataclass
class RunnerLine:
    runner: str
    chip: str
    devices: str
    stack: list[tuple[str, str]]
    counts: dict[str, int]
    complete: bool
    #: how the night ended early ("interrupted after 37 of 511 tests: exitstatus 2"), or ""
    ended_early: str = ""
    #: the run's duration, "n/a" where it is not a number
    duration: str = ""
    clock_warning: str = ""


def runner_line(name: str, run: RunResults) -> RunnerLine:
    header = run.header
    hardware = header.get("hardware") if isinstance(header.get("hardware"), dict) else {}
    device = header.get("device") if isinstance(header.get("device"), dict) else {}
    chip = _field(hardware.get("hardware"))
    if chip in ("", "NONE", "UNKNOWN"):
        chip = _field(device.get("kind")).upper() or "?"
    count = device.get("count")
    devices = f"{count} device{'s' if count != 1 else ''}" if isinstance(count, int) else \
        "devices unknown"
    stack = [(label, value) for label, path in STACK if (value := _lookup(header, path))
             and value != "absent"]
    counts = Counter(t.outcome for t in run.tests.values())
    counts["not run"] = run.not_run
    duration = run.duration
    return RunnerLine(name, chip, devices, stack,
                      {k: counts.get(k, 0) for k in ("passed", "failed", "error", "skipped",
                                                     "xfailed", "xpassed", "not run")},
                      run.complete, run.ended_early or "",
                      "n/a" if duration is None else f"{duration:.0f} s",
                      run.clock_warning or "")


@dataclass
class Alert:
    """Something on the first screen that makes the night less than it looks."""

    key: str
    text: str


def alerts(comp: Comparison) -> list[Alert]:
    """What a reader must see before any count: nights that ended early, result lines
    that could not be read, checks that crashed after their result, untrusted clocks."""
    found = []
    for name, run in sorted(comp.runs.items()):
        if run.ended_early:
            found.append(Alert("incomplete", f"{name}: {run.ended_early}"
                               + (f"; {run.not_run} collected tests never ran"
                                  if run.not_run else "")))
        if run.unreadable or run.recovered:
            found.append(Alert("unreadable", (
                f"{name}: {run.unreadable + run.recovered} unreadable result lines"
                + (f" ({run.recovered} recovered by id and outcome, shown below)"
                   if run.recovered else "") + f" in {run.path}")))
        if run.clock_warning:
            found.append(Alert("clock", f"{name}: {run.clock_warning}"))
    crashes = comp.summary()["post_result_crashes"]
    if crashes:
        first = crashes[0]
        found.append(Alert("post-result-crash", (
            f"{len(crashes)} check(s) crashed after returning a result (failed, not passed); "
            f"first: {first['test']} on {first['runner']}: {first['summary']}")))
    return found


def _message(longrepr: str) -> str:
    """The assertion in a failure's text: pytest's ``E`` lines, else its last lines."""
    lines = longrepr.splitlines()
    errors = [line[1:].strip() if line.startswith("E") else line for line in lines
              if line.startswith("E ") or line.startswith("E\t")]
    picked = errors or [line for line in lines if line.strip()][-MESSAGE_LINES:]
    if len(picked) > MESSAGE_LINES:
        picked = [*picked[:MESSAGE_LINES], f"... {len(picked) - MESSAGE_LINES} more lines"]
    return "\n".join(picked)


def _logprob_diagnosis(report: Any) -> str:
    if not isinstance(report, dict):
        return str(report)
    if "property" in report:  # a serving case (harness.logprobs.serving)
        condition = report.get("condition") if isinstance(report.get("condition"), dict) \
            else {}
        lines = [f"source: {_field(report.get('source'))}",
                 f"{_field(report.get('property'))}: {report.get('differ')} of "
                 f"{report.get('cases')} comparisons differ; max ULP {report.get('max_ulp')}",
                 "measured: " + ", ".join(f"{k} {_field(v)}" for k, v in condition.items())]
        for key in ("first_divergent_op", "vacuous"):
            if report.get(key):
                lines.append(f"{key.replace('_', ' ')}: {_field(report.get(key))}")
        return "\n".join(lines)
    lines = [f"source: {_field(report.get('source'))}",
             f"{report.get('mismatches')} of {report.get('cases')} cases differ from batch "
             f"size 1; batch sizes {report.get('batch_sizes_differing')}; phases "
             f"{report.get('phases_differing')}; max ULP {report.get('max_ulp')}"]
    first = report.get("first")
    if isinstance(first, dict):
        lines.append("first: " + ", ".join(f"{k} {_field(v)}" for k, v in first.items()))
    layers = report.get("layers")
    if isinstance(layers, dict) and layers.get("sentence"):
        lines.append(_field(layers.get("sentence")))
    elif report.get("first_divergent_op"):
        lines.append(f"first divergent op: {_field(report.get('first_divergent_op'))}")
    elif report.get("not_located"):
        lines.append(f"first divergent op: not located ({_field(report.get('not_located'))})")
    if report.get("vacuous"):
        lines.append(_field(report.get("vacuous")))
    return "\n".join(lines)


@dataclass
class Diagnosis:
    title: str
    text: str
    #: files beside the report it names: (label, relative link)
    links: tuple[tuple[str, str], ...] = ()


@dataclass
class Card:
    test: str
    family: str
    #: (runner, outcome, status, since)
    where: list[tuple[str, str, str, str]]
    message: str
    diagnoses: list[Diagnosis] = field(default_factory=list)
    #: (title, text) of each child's ending and output tail
    children: list[tuple[str, str]] = field(default_factory=list)
    full: str = ""
    #: a mass failure: how many tests failed with this same message, and the first ids
    count: int = 1
    others: list[str] = field(default_factory=list)


#: what each cause-before-verdict category (harness.plugin.verdicts) tells the reader
_CATEGORY_DIAGNOSES = (
    ("drift-grew", "drift grew: a difference left its measured envelope",
     "a difference allowed to exist (switch off, a known gap, rollout vs training, gloo "
     "sizes) is larger than the envelope its row was measured in: the failure names the "
     "figure, tonight's value, the bound and where the envelope was measured. A deliberate "
     "upstream change is accepted with npu-regress expectations update (docs/drift.md)"),
    ("release-finding", "a finding about the released code under test",
     "the release's own code does this; the reference target passes the same check"),
    ("known-finding", "a known release finding (the ledger)",
     "listed in harness/stack/known_findings.toml with its evidence and fix; not a new "
     "failure"),
    ("fixed-upstream", "fixed upstream: remove it from the ledger",
     "a ledger case passes on a release inside the ledger's range"),
    ("forward-compat", "forward-compatibility: breaks with the next releases",
     "the forward profile (the newest releases, which their declarations do not pair): not "
     "a finding about a stack users run"),
    ("vacuous", "vacuous: the condition the property needs did not happen",
     "too few ranks, no shared step, no cache hit, a flat distribution: the check proves "
     "nothing here, so it is never a pass (and never a finding)"),
    ("not-comparable", "not comparable: the two sides ran other weights or tokens",
     "rollout and training did not run one checkpoint on the same tokens: the figures say "
     "nothing about the stack, never a finding"),
    ("unsupported-stack", "on an unsupported stack",
     "the runner's stack is not one its releases pair (the preflight's pairing check): "
     "fix the stack before reading this failure"),
    ("harness", "the harness's own cause",
     "an install gap of the stack profile, a build-time file or the harness's code: ours, "
     "not the release's"),
    ("stand-in-limit", "a limit of the CPU stand-in",
     "the stand-in does not provide what the code called: not a property of the release"),
    ("required-capability", "a required capability is missing on this runner",
     "the runner declares it required (--harness-require), so the skip that names it is a "
     "failure: the runner's, not the release's"),
)


def _diagnoses(family: str, res: TestResult, cell: Cell) -> list[Diagnosis]:
    found = []
    for category, title, text in _CATEGORY_DIAGNOSES:
        if res.category == category:
            found.append(Diagnosis(title, text))
    if res.category == "upstream-drift":
        found.append(Diagnosis("upstream API moved: the stack changed under the adapter",
                               _message(res.longrepr)))
    if res.logprob_report is not None:
        found.append(Diagnosis("logprob mismatches", _logprob_diagnosis(res.logprob_report)))
    if res.properties:
        found.append(Diagnosis("recorded by the check", _properties_text(res.properties)))
    if res.dispatch_events is not None or family == "switch":
        seen = res.dispatch_events if res.dispatch_events is not None else "not recorded"
        text = f"events seen: {seen}"
        if cell.events_before is not None:
            text += f"\nlast night: {cell.events_before}"
        problems = [line.strip()[2:] for line in _message(res.longrepr).splitlines()
                    if line.strip().startswith("- ")]
        if problems:
            text = "expected vs seen:\n" + "\n".join(problems) + "\n" + text
        found.append(Diagnosis("switch: dispatch events", text))
    if family == "hardware":
        shown = set(_message(res.longrepr).splitlines())
        lines = [line for raw in res.longrepr.splitlines()
                 if (line := raw[1:].strip() if raw.startswith("E ") else raw) not in shown
                 and any(word in line.lower() for word in ("disagree", "source", "expected",
                                                           "npu-smi", "soc"))]
        if lines:
            found.append(Diagnosis("hardware: values and their sources",
                                   "\n".join(lines[-MESSAGE_LINES:])))
    return found


#: recorded properties a card names first, with a label: where the ranks ran
PROPERTY_LABELS = {"collective_nodes": "ran on nodes", "collective_settings": "settings",
                   "collective_rows": "rows"}


def _properties_text(props: dict[str, Any]) -> str:
    """One line per recorded property, the labelled ones first (``ran on nodes: ...``)."""
    ordered = sorted(props, key=lambda k: (k not in PROPERTY_LABELS, k))
    return "\n".join(f"{PROPERTY_LABELS.get(k, k)}: "
                     f"{v if isinstance(v, str) else json.dumps(v, default=str)}"
                     for k in ordered for v in (props[k],))


_ORDER = {"new-failure": 0, "flaky": 1, "still-failing": 2}


def failure_cards(comp: Comparison) -> list[Card]:
    """One card per failing test (all its failing runners on it), new failures first."""
    by_test: dict[str, list[Cell]] = {}
    for (test, _runner), cell in sorted(comp.cells.items()):
        if cell.outcome in FAILING:
            by_test.setdefault(test, []).append(cell)
    cards = []
    for test, cells in by_test.items():
        family = family_of(test)
        first = comp.result(test, cells[0].runner) or TestResult(test, cells[0].outcome)
        card = Card(test, family,
                    [(c.runner, c.outcome, c.status, c.since or "") for c in cells],
                    _message(first.longrepr) or "(no failure text recorded)",
                    _diagnoses(family, first, cells[0]), full=first.longrepr)
        for cell in cells:
            if cell.repro and not any(d.title == "reproducer" for d in card.diagnoses):
                card.diagnoses.insert(0, Diagnosis("reproducer", cell.repro,
                                                   cell.repro_links))
            if cell.bisect or cell.bisect_command:
                card.diagnoses.insert(0, Diagnosis(
                    f"bisect on {cell.runner}", cell.bisect
                    or f"not run tonight; to find the first bad release:\n"
                       f"{cell.bisect_command}"))
            if cell.status == "new-failure" and cell.last_passed:
                card.diagnoses.insert(0, Diagnosis(
                    f"what changed on {cell.runner} since it last passed ({cell.last_passed})",
                    changes_text(cell.changes).replace("; ", "\n")
                    or "nothing in the stack manifest: look at the test, the harness, or "
                    "the machine"))
            for child in getattr(comp.result(test, cell.runner), "children", ()):
                tail = str(child.get("stderr_tail") or "")
                title = f"{cell.runner}: child {child.get('pid')}: {child.get('summary')}"
                if tail or child.get("signal") or child.get("outcome") not in ("returned", None):
                    card.children.append((title, tail))
        cards.append(card)
    cards.sort(key=lambda c: (min(_ORDER.get(w[2], 3) for w in c.where), c.family, c.test))
    return _collapse(cards)


#: tests failing with one message that become one card, and the ids that card names
MASS_FAILURE = 10
MASS_IDS = 20


def _collapse(cards: list[Card]) -> list[Card]:
    """A mass failure (``MASS_FAILURE`` or more tests with the same family and message:
    a broken install, a dead device) is one card with its count and the first ids, not
    thousands of copies."""
    groups: dict[tuple[str, str], list[Card]] = {}
    for card in cards:
        groups.setdefault((card.family, card.message), []).append(card)
    out = []
    for card in cards:
        group = groups[(card.family, card.message)]
        if len(group) < MASS_FAILURE:
            out.append(card)
        elif group[0] is card:
            card.count = len(group)
            card.others = [c.test for c in group[1:MASS_IDS]]
            out.append(card)
    return out


@dataclass
class FamilyMatrix:
    name: str
    #: rows in view: failing, flaky, fixed, newly skipped (the first LOUD_ROWS, new failures
    #: first)
    loud: list[str]
    #: rows folded behind a count: passing, skipped, xfailed (the first QUIET_ROWS drawn)
    quiet: list[str]
    counts: dict[str, int]
    skip_reasons: list[tuple[str, int]]
    #: how many quiet rows there are in all (a million-test night draws QUIET_ROWS of them)
    quiet_total: int = 0
    #: how many loud rows there are in all (each is in summary.md and summary.json)
    loud_total: int = 0


#: quiet rows drawn per family: a page of 10^6 rows opens in no browser; the results file
#: and summary.json keep them all
QUIET_ROWS = 1000
#: loud rows drawn per family: a night where 5% of 10^6 tests flip is read in summary.md;
#: every failing test still has its card
LOUD_ROWS = 2000


def family_matrices(comp: Comparison) -> list[FamilyMatrix]:
    names = [name for name, _ in FAMILIES] + [OTHER]
    rows: dict[str, list[str]] = {name: [] for name in names}
    for test in comp.tests:
        rows[family_of(test)].append(test)
    out = []
    for name in names:
        tests = rows[name]
        if not tests:
            continue
        # stored cells are the news (failing, skipped, fixed...); the rest are plain passes
        cells = [c for t in tests for r in comp.runners if (c := comp.cells.get((t, r)))]
        loud_set = {c.test for c in cells if c.status in ATTENTION or c.outcome in FAILING}
        loud = sorted(loud_set, key=lambda t: (
            min(_ORDER.get(c.status, 3) for r in comp.runners
                if (c := comp.cells.get((t, r)))), t))
        counts = Counter(c.outcome for c in cells)
        present = sum(1 for t in tests for r in comp.runners if comp.result(t, r) is not None)
        counts["passed"] += present - sum(1 for c in cells
                                          if c.outcome not in ("absent", "not-run"))
        reasons = Counter(c.reason or "(no reason given)" for c in cells
                          if c.outcome == "skipped")
        ordered = {o: counts[o] for o in ("passed", "failed", "error", "xpassed", "xfailed",
                                          "skipped", "not-run") if counts.get(o)}
        quiet = [t for t in tests if t not in loud_set]
        out.append(FamilyMatrix(name, loud[:LOUD_ROWS], quiet[:QUIET_ROWS], ordered,
                                reasons.most_common(), len(quiet), len(loud)))
    return out


BAR_W, BAR_H, LABEL_W = 640, 22, 90


def family_bars(matrices: list[FamilyMatrix]) -> dict[str, Any]:
    """Tonight's outcomes per family as stacked horizontal bars (numbers only)."""
    kinds = (("passed", ("passed", "xfailed")), ("failed", ("failed", "error", "xpassed")),
             ("skipped", ("skipped",)))
    top = max((sum(m.counts.values()) for m in matrices), default=1) or 1
    bars = []
    for i, m in enumerate(matrices):
        x, parts = float(LABEL_W), []
        for kind, outcomes in kinds:
            n = sum(m.counts.get(o, 0) for o in outcomes)
            width = (BAR_W - LABEL_W - 200) * n / top  # 200: room for the counts
            parts.append({"kind": kind, "x": round(x, 1), "w": round(width, 1), "n": n})
            x += width
        bars.append({"family": m.name, "y": 8 + i * (BAR_H + 8), "parts": parts,
                     "end": round(x + 6, 1)})
    return {"w": BAR_W, "h": 16 + len(bars) * (BAR_H + 8), "bar_h": BAR_H, "bars": bars}


def news(comp: Comparison) -> list[tuple[str, str, int]]:
    """(id, label, count) of the night's news, in reading order."""
    summary = comp.summary()
    return [("new-failures", "new failures", len(summary["new_failures"])),
            ("fixed", "fixed", len(summary["fixed"])),
            ("flaky", "flaky", len(summary["flaky"])),
            ("event-changes", "event-count changes", len(summary["event_changes"])),
            ("drift-grew", "drifts that grew", len(summary["drift_grew"])),
            ("figure-changes", "figures changed", len(summary["figure_changes"])),
            ("newly-skipped", "newly skipped", len(summary["newly_skipped"])),
            ("vanished", "vanished", len(summary["vanished"])),
            ("not-run", "not run (night ended early)", len(summary["not_run"])),
            ("upstream-drift", "upstream API moved", len(summary["upstream_drift"])),
            ("release-findings", "findings about releases", len(summary["release_findings"])),
            ("harness-causes", "the harness's own causes", len(summary["harness_causes"])),
            ("unsupported-stack", "on an unsupported stack",
             len(summary["unsupported_stack"])),
            ("required-capability", "required capabilities missing",
             len(summary["required_capability"])),
            ("forward-compat", "forward-compatibility", len(summary["forward_compat"])),
            ("fixed-upstream", "fixed upstream (remove from the ledger)",
             len(summary["fixed_upstream"])),
            ("known-findings", "known findings (ledger)", len(summary["known_findings"])),
            ("still-failing", "still failing", len(summary["still_failing"]))]
