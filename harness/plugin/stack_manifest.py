"""The stack manifest: the versions of everything under test on this runner, each with where
it was read, so that the report can answer "what changed since the last green night?".

Package versions are read in an isolated child (a fresh interpreter, nothing imported:
package metadata and ``direct_url.json`` only, so nothing here can initialise a device or
be skewed by what the pytest process imported); a package installed from a checkout also
gets that checkout's git revision. The NPU entries (SoC, family, driver, CANN) come from the
session's hardware detection, itself run in an isolated child.
"""

from __future__ import annotations

from typing import Any

from harness.stack.installed import Manifest, read_packages


def hardware_entries(npu: Any) -> Manifest:
    """The NPU entries from the session's detection (``harness.hardware.NpuVersions``)."""
    if npu is None:
        return {}
    where = dict(getattr(npu, "sources", {}) or {})
    soc = f"{npu.soc_name or '?'} ({npu.soc_version})" if npu.soc_name or npu.soc_version \
        else None
    return {
        "soc": {"version": soc or "not detected",
                "source": where.get("soc_version") or where.get("soc_name") or "-"},
        "family": {"version": npu.hardware.name, "source": "harness.hardware (from the SoC)"},
        "driver": {"version": npu.driver_version or "not detected",
                   "source": where.get("driver_version") or "-"},
        "cann": {"version": npu.cann_version or "not detected",
                 "source": where.get("cann_version") or "-"},
    }


def collect(npu: Any = None, timeout: float = 60.0) -> Manifest:
    """The whole manifest: packages read in an isolated child, then the NPU entries. Never
    raises: a child that fails leaves one entry saying so."""
    from harness.isolation.run import isolate

    res = isolate(read_packages, timeout=timeout, method="spawn")
    if res.outcome == "returned":
        entries: Manifest = dict(res.value)
    else:
        entries = {"packages": {"version": None,
                                "source": f"the manifest child failed: {res.summary()}"}}
    entries.update(hardware_entries(npu))
    return entries
