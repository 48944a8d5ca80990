"""Required capabilities (``--harness-require``, ini ``harness_require``): what must be
present on this runner, so that a check cannot skip its way to green.

Ascend suites rot by skipping: the night the ops package fails to install, every check that
needs it skips, and nobody reads skips. On a runner that declares ``batch_invariant_ops``
required, such a skip is a failure that names the missing capability, and the session's
exit status is a failure even when no test mentions it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import pytest

from harness.plugin.results import skip_reason
from harness.plugin.verdicts import file_as
from harness.stack.devices import has_module

#: capability -> words that, in a skip reason, point to it
CAPABILITIES: dict[str, tuple[str, ...]] = {
    "npu": ("npu", "ascend", "torch_npu"),
    "torch_npu": ("torch_npu", "torch-npu"),
    "vllm": ("vllm",),
    "vllm_ascend": ("vllm_ascend", "vllm-ascend"),
    "verl": ("verl",),
    "batch_invariant_ops": ("batch_invariant_ops", "ops package", "ascendc"),
    "cann": ("cann",),
    "driver": ("driver", "hdk"),
}
#: capabilities that take a minimum version: ``cann>=8.2``, ``driver>=25.0``
VERSIONED = ("cann", "driver")
_SPEC = re.compile(r"^(?P<name>[a-z_]+)(?:\s*>=\s*(?P<minimum>[0-9][0-9A-Za-z.\-]*))?$")


@dataclass
class Requirement:
    spec: str
    name: str
    minimum: str | None = None
    #: why it is missing on this runner, or None when present
    missing: str | None = None

    def matches(self, reason: str) -> bool:
        text = reason.lower()
        return any(word in text for word in CAPABILITIES[self.name])


def parse(value: str | list[str] | None) -> list[Requirement]:
    """``npu,vllm_ascend,cann>=8.2`` (or ini lines) -> requirements; a clear error for a name
    that is not a capability."""
    items = value if isinstance(value, list) else [value or ""]
    found = []
    for item in items:
        for spec in (s.strip() for s in str(item).split(",")):
            if not spec:
                continue
            match = _SPEC.match(spec.lower())
            if not match or match["name"] not in CAPABILITIES or \
                    (match["minimum"] and match["name"] not in VERSIONED):
                raise ValueError(
                    f"--harness-require {spec!r}: not a capability. Use any of "
                    f"{', '.join(CAPABILITIES)}, comma-separated; cann and driver take a "
                    "minimum version (cann>=8.2)")
            found.append(Requirement(spec, match["name"], match["minimum"]))
    return found


def check(requirements: list[Requirement], device_kind: str, npu: Any) -> None:
    """Fill in ``missing`` for each requirement, from the session's detection."""
    from harness.hardware import parse_version

    for req in requirements:
        if req.name == "npu":
            if device_kind != "npu":
                req.missing = f"the session's device is {device_kind}, not an NPU"
        elif req.name in VERSIONED:
            have = getattr(npu, f"{req.name}_version", None) if npu is not None else None
            label = "CANN" if req.name == "cann" else "the driver (HDK)"
            if not have:
                req.missing = f"{label} version not detected"
            elif req.minimum:
                got, need = parse_version(have), parse_version(req.minimum)
                if got is None or need is None:
                    req.missing = f"{label} version {have!r} cannot be compared"
                elif got < need:
                    req.missing = f"{label} {have} is older than the required {req.minimum}"
        elif not has_module(req.name):
            req.missing = f"{req.name} is not installed (not importable)"


def missing(requirements: list[Requirement]) -> list[Requirement]:
    return [r for r in requirements if r.missing]


class RequiredCapabilities:
    """The pytest face: registered by the plugin when a runner declares requirements."""

    def __init__(self, requirements: list[Requirement]) -> None:
        self.requirements = requirements

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo[None]
                                  ) -> Any:
        report = yield
        if not report.skipped or hasattr(report, "wasxfail"):
            return report
        reason = skip_reason(report)
        for req in missing(self.requirements):
            if req.matches(reason):
                report.outcome = "failed"
                report.longrepr = (
                    f"required capability {req.spec!r} is missing on this runner: "
                    f"{req.missing}. The test skipped ({reason}); "
                    "this runner declares the capability required (--harness-require / ini "
                    "harness_require), so the skip is a failure.")
                # the runner's, never the release's: stated where it is decided
                file_as(lambda name, value: report.user_properties.append((name, value)),
                        "required-capability", f"{req.spec}: {req.missing}")
                break
        return report

    def pytest_report_header(self) -> list[str]:
        return ["npu-regress: required: " + ", ".join(
            f"{r.spec} ({'MISSING: ' + r.missing if r.missing else 'present'})"
            for r in self.requirements)]

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        """A missing required capability fails the run even if no test mentions it (the
        tests that needed it may not have been collected at all)."""
        if missing(self.requirements) and session.exitstatus in (
                pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED):
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        for req in missing(self.requirements):
            terminalreporter.write_line(
                f"npu-regress: required capability {req.spec!r} is missing on this runner: "
                f"{req.missing}", red=True, bold=True)
