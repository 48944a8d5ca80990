"""What the controlling pytest process does for the whole run (the xdist controller, or the
one process without xdist), registered there only, as xdist registers its ``DSession``: hand
the detected device to xdist's workers instead of probing N times, read the stack manifest
once, open the results file, and write the report header. What every process that runs
tests does is ``harness.plugin.runner``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from harness.plugin import options, pytest_private, stack_manifest
from harness.plugin.results import ResultsInUse, ResultsWriter
from harness.plugin.session import SESSION_KEY, HarnessSession
from harness.report.manifest_diff import shown


def runs_tests(config: pytest.Config) -> bool:
    """This process runs tests itself: an xdist worker, or the one process without xdist
    (``-n 0`` included); the xdist controller runs none."""
    return hasattr(config, "workerinput") or not getattr(config.option, "numprocesses", None)


@pytest.hookimpl(trylast=True)
def pytest_sessionstart(session: pytest.Session) -> None:
    # after conftests' pytest_configure (suites/conftest.py sets the results default)
    harness_session = session.config.stash[SESSION_KEY]
    _record_manifest(session.config, harness_session)
    _register_results(session.config, harness_session)


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """xdist controller: hand the detected device to the workers instead of probing N times."""
    session = node.config.stash.get(SESSION_KEY, None)
    if session is not None:
        node.workerinput["harness_device"] = session.device.to_dict()
        node.workerinput["harness_npu"] = session.npu.to_dict() if session.npu else None


def _record_manifest(config: pytest.Config, session: HarnessSession) -> None:
    """The stack manifest, where a report will read it: the results header and the JUnit
    XML's global properties (``stack.<name>``). Read once, by the controller."""
    xml = pytest_private.junit_xml(config)
    if not options.option(config, "harness_results") and xml is None:
        return
    session.manifest = stack_manifest.collect(session.npu)
    if xml is not None:
        for name, entry in session.manifest.items():
            xml.add_global_property(f"stack.{name}", shown(entry))


def _register_results(config: pytest.Config, session: HarnessSession) -> None:
    path = options.option(config, "harness_results")
    if not path:
        return
    target = Path(path)
    if not target.is_absolute():
        target = Path(str(config.invocation_params.dir)) / target
    try:
        writer = ResultsWriter(target, config, session)
    except ResultsInUse as exc:
        raise pytest.UsageError(f"--harness-results {path}: {exc}") from None
    except OSError as exc:
        raise pytest.UsageError(f"--harness-results {path}: cannot write there ({exc})") from None
    config.pluginmanager.register(writer, "npu_regress_results")


def pytest_report_header(config: pytest.Config) -> list[str]:
    session = config.stash.get(SESSION_KEY, None)
    if session is None:
        return []
    isolation = f"; isolation={session.method}, timeout {session.timeout:g} s"
    lines = [session.device.header() + isolation]
    if session.npu is not None:
        lines.append(f"npu-regress: ascend {session.npu.summary()}")
    lines.extend(_stack_header(session.stack))
    for use, problem in pytest_private.drift():
        lines.append(f"npu-regress: pytest {pytest.__version__} internals drifted: {use.name}: "
                     f"{problem} (used to {use.why}; meanwhile: {use.fallback})")
    return lines


def _stack_header(stack: dict[str, Any]) -> list[str]:
    """The stack profile and the pairing verdict, above every result they qualify."""
    profile = stack.get("profile")
    pairing = stack.get("pairing") or {}
    where = (f"stack profile {profile['name']} ({profile['kind']}): {profile['summary']}"
             if profile else "stack: as installed (no stack profile recorded)")
    lines = [f"npu-regress: {where}"]
    if profile and profile["kind"] == "forward":
        lines.append("npu-regress: forward profile: failures are forward-compatibility "
                     "(they break with the next releases), never release findings")
    for problem in pairing.get("problems", []):
        lines.append(f"npu-regress: UNSUPPORTED STACK: {problem}")
    for note in pairing.get("notes", []):
        lines.append(f"npu-regress: stack note: {note}")
    return lines
