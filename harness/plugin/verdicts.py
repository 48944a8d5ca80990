"""Cause before verdict: what a failing (or ledger-listed) case is filed as.

A failure is a **release finding** only when the stack passed the preflight's pairing, the
harness's own install is complete, and the failure is the released code doing what the
check tests. Otherwise it is filed by its cause: ``harness`` (a module the stack profile
should have installed, a build-time file, an exception raised in the harness's own code),
``stand-in-limit`` (raised by the CPU stand-in's objects), ``unsupported-stack`` (the
runner's stack is not one its releases pair), ``forward-compat`` (the ``forward`` profile:
the next releases). Known findings are a ledger (``known_findings.toml``): on an affected
release their cases are strict expected failures ("known-finding"), a case that passes is
"fixed-upstream: remove from the ledger", and a failure that is not the ledger's text
stays a failure.

The category travels in ``user_properties`` (``verdict``), so the results file, the JUnit
XML and xdist all carry it. It is data where it can be: a check states it where it decides
(``file_as``, or the properties it records: ``vacuous``, a logprob report's ``vacuous`` or
``not_comparable``, a drift record judged ``grew`` or ``unjudgeable``); the failure text is
read only for failures of code that is not ours (an import, a stand-in, an exception in the
harness), and a verdict filed from it says so (``by``: ``failure text``)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from harness.isolation.failure_text import failure_lines
from harness.stack.ledger import (  # noqa: F401 - the ledger's names, where tests read them
    LEDGER,
    LEDGER_ENV,
    Finding,
    LedgerError,
    load_ledger,
)
from harness.stack.upstream import UpstreamApiMoved
from harness.stack.upstream import version as installed_version

HARNESS_DIR = Path(__file__).resolve().parents[1]
STANDIN_FILE = HARNESS_DIR / "invariance" / "standin.py"
_LEDGER_KEY = pytest.StashKey["Finding"]()
#: the exception types a check raises on purpose: its verdict, not a harness defect
VERDICT_TYPES = ("AssertionError", "Failed", "UpstreamApiMoved", "Skipped", "XFailed",
                 "ChildCrashed", "ChildTimeout")
_FRAME = re.compile(r'^\s*File "(?P<path>[^"]+)", line \d+', re.MULTILINE)
_MISSING = re.compile(r"(?:ModuleNotFoundError|ImportError): No module named '(?P<mod>[^']+)'")
_RAISED = re.compile(r"^(?P<type>[A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt|ApiMoved))\b",
                     re.MULTILINE)


# --- a check states its category ---------------------------------------------------------

#: where a verdict's category came from: the check's own statement or recorded properties,
#: or the failure text (code that is not ours, or a check that stated nothing)
BY_CHECK, BY_RECORD, BY_TEXT = "check", "recorded properties", "failure text"


def file_as(record_property: Any, category: str, reason: str) -> None:
    """Called by a check before it fails: the failure is filed as ``category`` (one of
    ``harness.report.schema.CATEGORIES``: ``vacuous``, ``not-comparable``, ``harness``...)
    for ``reason``, whatever its text says. ``record_property``: pytest's fixture."""
    from harness.report.schema import CATEGORIES

    if category not in CATEGORIES:
        raise ValueError(f"file_as: category {category!r} is not one of "
                         f"{', '.join(CATEGORIES)}")
    record_property("verdict", {"category": category, "reason": reason, "by": BY_CHECK})


# --- what a ledger entry covers -----------------------------------------------------------

@dataclass(frozen=True)
class LedgerMatch:
    """How a failure compares with a ledger entry: ``seen`` (the entry's texts found),
    ``unseen`` (its texts no line shows: partly fixed), ``new`` (failure lines no text of
    the entry covers: a new failure)."""

    seen: tuple[str, ...]
    unseen: tuple[str, ...]
    new: tuple[str, ...]

    @property
    def known(self) -> bool:
        """The known finding is there and nothing else fails."""
        return bool(self.seen) and not self.new


def ledger_match(finding: Finding, lines: list[str]) -> LedgerMatch:
    """Which of the failure's ``lines`` the ``finding`` covers (each line must contain one
    of its texts); a known finding never hides a line it does not name."""
    seen = tuple(m for m in finding.match if any(m in line for line in lines))
    unseen = tuple(m for m in finding.match if m not in seen)
    new = tuple(line for line in lines if not any(m in line for m in finding.match))
    return LedgerMatch(seen, unseen, new)


# --- the cause of a failure ----------------------------------------------------------------

def _innermost(text: str) -> tuple[str | None, str | None]:
    """(the innermost frame's file, the raised exception's type) of the last traceback in
    ``text`` (the child's, carried back in the failure text)."""
    start = text.rfind("Traceback (most recent call last)")
    tail = text[start:] if start >= 0 else text
    frames = _FRAME.findall(tail)
    raised = _RAISED.findall(tail)
    return (frames[-1] if frames else None), (raised[-1] if raised else None)


def cause(text: str, declared: set[str] | None = None) -> tuple[str, str] | None:
    """``(category, reason)`` when the failure text shows the harness's own cause (an
    install gap, a build-time file, a stand-in limit, the harness's code), else None (the
    check's verdict stands). ``declared``: requirement names the stack declares (a module
    of one of them missing is the profile's install gap)."""
    declared = declared or set()
    if "NotStoodIn" in text:
        return "stand-in-limit", "the CPU stand-in does not provide what the code called " \
            "(NotStoodIn): not a property of the release"
    missing = _MISSING.search(text)
    if missing:
        module = missing["mod"]
        top = module.split(".")[0]
        if module.endswith("._build_info") or module == "vllm_ascend._build_info":
            return "harness", (f"{module} is a build-time file (vllm-ascend's setup.py writes "
                               "it): the harness's sources-only install lacks it")
        if top.replace("_", "-").lower() in declared:
            return "harness", (f"No module named {module!r}: a declared requirement of the "
                               "stack that the profile did not install (bash ci/setup.sh "
                               "--upstream verifies them)")
    path, raised = _innermost(text)
    if path is not None:
        resolved = Path(path)
        if resolved.parts[-2:] == STANDIN_FILE.parts[-2:]:  # this checkout's or a copy's
            return "stand-in-limit", f"raised inside the CPU stand-in ({path})"
        inside = HARNESS_DIR in resolved.parents
        if inside and raised and raised.rsplit(".", 1)[-1] not in VERDICT_TYPES:
            return "harness", f"{raised} raised in the harness's own code ({path})"
    return None


def declared_names() -> set[str]:
    """Every distribution the installed upstream stack needs, directly or through what it
    needs (canonical names)."""
    from harness.stack import requirements

    return requirements.closure(("vllm", "vllm-ascend", "verl", "tensordict", "xgrammar"))


class Verdicts:
    """The verdict layer: registered by the plugin for every session."""

    def __init__(self, stack: dict[str, Any]) -> None:
        self.stack = stack
        self.ledger = load_ledger()
        self._declared: set[str] | None = None

    @property
    def kind(self) -> str:
        return (self.stack.get("profile") or {}).get("kind", "release")

    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        by_case = {case: f for f in self.ledger for case in f.cases}
        for item in items:
            finding = by_case.get(item.nodeid)
            if finding is not None and finding.applies(installed_version(finding.distribution)):
                item.stash[_LEDGER_KEY] = finding

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
        report = yield
        finding = item.stash.get(_LEDGER_KEY, None)
        if finding is not None and call.when == "call":
            self._ledger(report, finding, call)
        if report.failed and not any(k == "verdict" for k, _ in report.user_properties):
            self._file(report)
        moved = getattr(call.excinfo, "value", None)
        if report.failed and isinstance(moved, UpstreamApiMoved) and not any(
                k == "upstream_drift" for k, _ in report.user_properties):
            # a check that lets the adapter's UpstreamApiMoved through is filed as one too
            report.user_properties.append(("upstream_drift", str(moved)))
        if report.failed:
            # the failure's whole statement, read from the exception while the hook has it
            # (the results file's text alone keeps only a tail): a bisect's signature
            report.harness_problems = failure_lines(report.longrepr, call.excinfo)
        return report

    def _ledger(self, report: pytest.TestReport, finding: Finding,
                call: pytest.CallInfo[None]) -> None:
        version = installed_version(finding.distribution)
        text = str(report.longrepr or "")
        if report.passed:
            report.outcome = "failed"
            report.longrepr = (
                f"fixed upstream: {finding.id} ({finding.title}) no longer shows on "
                f"{finding.distribution} {version}, inside the ledger's range "
                f"{finding.affected}: remove it from the ledger (harness/plugin/"
                f"known_findings.toml), or narrow its range. Evidence it was filed on: "
                f"{finding.evidence}")
            self._set(report, "fixed-upstream", finding.id)
        elif report.failed:
            found = ledger_match(finding, failure_lines(report.longrepr, call.excinfo))
            if found.known:
                report.outcome = "skipped"
                partly = (f"; partly fixed: no line shows {', '.join(map(repr, found.unseen))}"
                          if found.unseen else "")
                report.wasxfail = finding.reason(version) + partly  # type: ignore[attr-defined]
                self._set(report, "known-finding", finding.id)
            elif found.seen:
                report.sections.append(("npu-regress ledger", (
                    f"NEW FAILURE beside the known finding {finding.id} (still there: "
                    f"{', '.join(map(repr, found.seen))}): the ledger does not cover "
                    + "; ".join(map(repr, found.new))
                    + ". It is reported as a failure; the known finding alone would be "
                    "an expected failure.")))
            else:
                report.sections.append(("npu-regress ledger", (
                    f"the ledger's {finding.id} expects failure lines containing "
                    f"{', '.join(map(repr, finding.match))}; this failure is something "
                    f"else ({'; '.join(map(repr, found.new)) or repr(text[:200])}), so it "
                    "is reported as a failure")))

    def _file(self, report: pytest.TestReport) -> None:
        if self._declared is None:
            self._declared = declared_names()
        found = cause(str(report.longrepr or ""), self._declared)
        pairing = self.stack.get("pairing") or {}
        if found is not None:
            self._set(report, *found, by=BY_TEXT)
        elif self.kind == "forward":
            # the forward profile pairs releases that do not declare each other: every
            # failure of it (the pairing's own included) is about the next releases
            problems = "; ".join(pairing.get("problems", []))
            self._set(report, "forward-compat", "breaks with the next releases (profile "
                      f"{(self.stack.get('profile') or {}).get('name')})"
                      + (f"; the stack is not one its releases pair: {problems}"
                         if problems else ""))
        elif not pairing.get("supported", True):
            self._set(report, "unsupported-stack",
                      "on an unsupported stack: " + "; ".join(pairing.get("problems", [])))
        elif unproven := _unproven(report):
            self._set(report, *unproven, by=BY_RECORD)
        elif lost := _drift_records(report, "unjudgeable", "unjudgeable"):
            # a figure the judge needs went missing in our code: ours, never a pass
            self._set(report, "harness", "a judged figure could not be read: "
                      + "; ".join(lost), by=BY_RECORD)
        else:
            grew = _drift_records(report, "grew", "grew")
            if grew:  # a release finding whose evidence is a size: apart on the cards
                self._set(report, "drift-grew", "drift grew: " + "; ".join(grew),
                          by=BY_RECORD)

    @staticmethod
    def _set(report: pytest.TestReport, category: str, reason: str, by: str = "") -> None:
        verdict = {"category": category, "reason": reason}
        if by:
            verdict["by"] = by
        report.user_properties.append(("verdict", verdict))


def _drift_records(report: pytest.TestReport, judged: str, field: str) -> list[str]:
    """``row key: figures`` for each of the check's drift records judged ``judged``, its
    figures read from the record's ``field``."""
    return [f"{'/'.join(map(str, (r.get('key') or {}).values()))}: "
            f"{', '.join(r.get(field) or [])}"
            for key, records in report.user_properties if key == "drift"
            for r in (records or []) if isinstance(r, dict) and r.get("judged") == judged]


def _unproven(report: pytest.TestReport) -> tuple[str, str] | None:
    """("vacuous", why) when the condition the property needs did not happen (the check's
    ``vacuous`` property, or its logprob report's), ("not-comparable", why) when the two
    sides ran other weights or tokens: never a pass, never a finding."""
    props = dict(report.user_properties)
    found = props.get("logprob_report")
    found = found if isinstance(found, dict) else {}
    vacuous = props.get("vacuous") or found.get("vacuous")
    if vacuous:
        text = str(vacuous)
        return "vacuous", text if text.startswith("vacuous:") else f"vacuous: {text}"
    if found.get("not_comparable"):
        return "not-comparable", "not comparable: " + "; ".join(map(str,
                                                                     found["not_comparable"]))
    return None


def stack_facts() -> dict[str, Any]:
    """The session's stack facts: the active profile and the pairing verdict."""
    from harness.stack import pairing, profile

    active = profile.active()
    return {"profile": ({"name": active.name, "kind": active.kind, "summary": active.summary,
                         "deviations": active.deviations} if active else None),
            "pairing": pairing.for_this_runner().to_dict()}
