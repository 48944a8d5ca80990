"""A child's ending on the test's report: output sections and properties, and the list of
results that ``pytest_runtest_makereport`` carries to the results file. Shared by the
``run_on_npu`` fixture and whole-test isolation."""

from __future__ import annotations

import json

import pytest

from harness.isolation.result import IsolatedResult

#: every IsolatedResult a test produced, in order (for the report layer)
RESULTS_KEY = pytest.StashKey[list[IsolatedResult]]()


def attach_result(item: pytest.Item, res: IsolatedResult) -> None:
    """Put a child's output and ending on the test's report (sections and properties)."""
    results = item.stash.setdefault(RESULTS_KEY, [])
    results.append(res)
    label = f"isolated child #{len(results)} (pid {res.pid}, {res.method})"
    for name, text in (("stdout", res.stdout), ("stderr", res.stderr)):
        if text:
            item.add_report_section("call", f"{label} {name}", text)
    item.user_properties.append(("isolation", res.summary()))
    for note in res.notes:
        item.user_properties.append(("isolation_note", note))
    if res.events_counted:
        item.user_properties.append(("dispatch_events", json.dumps(res.events, sort_keys=True)))
