"""Does pytest-forked work in this pytest? One probe per session, only when a test forks.

pytest-forked runs each test in a fork and carries its reports back with ``marshal``; a
pytest release that adds an unmarshallable field to ``TestReport`` (pytest 9.2.0 did, with
``NodeId``) makes every forked test read "running the test EXITED with status 3", which says
nothing about why. Instead of guessing from version numbers, the probe sends one no-op item
through pytest-forked's own ``forked_run_report`` (one fork): if no setup report comes back,
pytest-forked cannot carry reports in this pytest, and the fork guard fails each forked test
in setup with a message that names the versions and the ways out.
"""

from __future__ import annotations

import importlib.metadata
import time
from typing import Any

import pytest

from harness.plugin import pytest_private

PROBE_KEY = pytest.StashKey["ProbeVerdict"]()


class ProbeVerdict:
    """The probe's answer: ``broken`` is None when pytest-forked works (or cannot be probed)."""

    def __init__(self, broken: str | None, seconds: float) -> None:
        self.broken = broken
        self.seconds = seconds


class _ForkProbeItem(pytest.Item):
    """A test that does nothing: it exercises only pytest-forked's fork and report transport."""

    def runtest(self) -> None:
        return None

    def reportinfo(self) -> tuple[Any, int | None, str]:
        return self.path, None, "npu-regress pytest-forked probe"


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def _crash_text(reports: list[Any]) -> str:
    """pytest-forked's own words, without the location prefix (the probe has no file)."""
    for rep in reports:
        text = str(getattr(rep, "longrepr", "") or "").strip()
        if text:
            last = text.splitlines()[-1]
            return last[last.find("running the test"):] if "running the test" in last else last
    return "no report came back"


def probe(session: pytest.Session) -> ProbeVerdict:
    """Fork one no-op item through pytest-forked; cached on the config for the session."""
    config = session.config
    cached = config.stash.get(PROBE_KEY, None)
    if cached is not None:
        return cached
    start = time.perf_counter()
    plugin = config.pluginmanager.get_plugin("pytest_forked")
    run = getattr(plugin, "forked_run_report", None)
    broken: str | None = None
    fresh = pytest_private.fresh_setup_state()
    if callable(run) and fresh is not None and hasattr(session, "_setupstate"):
        item = _ForkProbeItem.from_parent(session, name="npu-regress-forked-probe")
        # A fresh setup state: the probe's fork sets up and tears down only itself, never the
        # session's fixtures (their finalizers stay registered in the real state).
        saved, session._setupstate = session._setupstate, fresh
        try:
            reports = list(run(item))
        except Exception as exc:  # noqa: BLE001 - a probe that raises is a broken plugin
            reports = []
            crash = f"{type(exc).__name__}: {exc}"
        else:
            crash = _crash_text(reports)
        finally:
            session._setupstate = saved
        if not any(getattr(rep, "when", None) == "setup" for rep in reports):
            broken = (
                f"pytest-forked {_version('pytest-forked')} cannot run tests under pytest "
                f"{pytest.__version__}: a no-op test forked through it came back as "
                f"\"{crash}\" (its fork cannot hand the test's reports back to this pytest)")
    verdict = ProbeVerdict(broken, time.perf_counter() - start)
    config.stash[PROBE_KEY] = verdict
    return verdict
