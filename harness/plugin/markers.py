"""The harness's markers (``pytest --markers``) and the skips they ask for at set-up: a
test for a device, SoC family, CANN or driver version that this runner does not have skips,
the reason naming what was detected and where it was read."""

from __future__ import annotations

import pytest

from harness.hardware import NpuVersions, parse_version
from harness.plugin.session import SESSION_KEY

MARKERS = (
    "npu: needs a real Ascend NPU; skipped elsewhere, the reason naming what is missing",
    "device(*kinds): run only when the session device is one of kinds (npu, cuda, cpu)",
    "isolation_timeout(seconds): timeout for this test's isolated children",
    "soc(*families): run only on these Ascend families (A2, A3, A5, A1, ASCEND310P, "
    "ASCEND310B); skipped elsewhere with the detected hardware",
    "min_cann(version): skip unless the detected CANN version is >= version",
    "isolated(timeout=None, env=None): run this test's call phase in a fresh process "
    "(fixture values must pickle); env sets variables in that process only",
    "min_driver(version): skip unless the detected driver (HDK) is >= version",
)


def register(config: pytest.Config) -> None:
    for line in MARKERS:
        config.addinivalue_line("markers", line)


def pytest_runtest_setup(item: pytest.Item) -> None:
    session = item.config.stash[SESSION_KEY]
    if session.npu is not None:
        item.user_properties.append(("npu_versions", session.npu.summary()))
        _skip_for_hardware(item, session.npu)
    if item.get_closest_marker("npu") and session.device.npu_missing:
        pytest.skip(f"needs a real NPU: {session.device.npu_missing}")
    marker = item.get_closest_marker("device")
    if marker and session.device.kind not in marker.args:
        pytest.skip(
            f"runs only on {', '.join(marker.args)}; the session device is "
            f"{session.device.kind} ({session.device.reason})"
        )


def _skip_for_hardware(item: pytest.Item, npu: NpuVersions) -> None:
    """soc / min_cann / min_driver markers, each skip naming the detected value."""
    marker = item.get_closest_marker("soc")
    if marker and npu.hardware.name not in {str(f).upper() for f in marker.args}:
        pytest.skip(f"needs Ascend {' or '.join(map(str, marker.args))}; detected "
                    f"{npu.hardware.name}" + (f" ({npu.reason})" if npu.reason else ""))
    for name, label, raw, source_key in (
        ("min_cann", "CANN", npu.cann_version, "cann_version"),
        ("min_driver", "driver (HDK)", npu.driver_version, "driver_version"),
    ):
        marker = item.get_closest_marker(name)
        if not marker:
            continue
        need = str(marker.args[0])
        have = parse_version(raw)
        where = npu.sources.get(source_key, "no source")
        if have is None:
            pytest.skip(f"needs {label} >= {need}; detected {raw or 'none'} ({where})")
        minimum = parse_version(need)
        if minimum is None:
            raise pytest.UsageError(f"@pytest.mark.{name}({need!r}): not a version")
        if have < minimum:
            pytest.skip(f"needs {label} >= {need}; detected {raw} ({where})")
