"""A runner's identity: what chooses its kernels, the key an envelope is measured on and
matched by, exactly.

Two runners whose kernels may take other paths (another SoC, CANN or driver; another GPU or
CUDA; a CPU with other instruction sets; another torch thread count) can give other bits
and other drift sizes with no fault of the release's. An envelope measured on one says
nothing of the other, so a row's envelope judges only a runner of the same identity, field
for field; any other is "no envelope for this runner", naming the nearest envelope's runner
and each field that differs.

- CPU: ``arch``, ``vendor``, ``features`` (those of ``CPU_FEATURES`` the CPU has: the
  instruction sets oneDNN, MKL and torch's kernels choose a path by);
- NPU: ``soc`` (name and SoC version), ``cann``, ``driver``, ``torch_npu``;
- CUDA: ``name``, ``capability``, ``cuda``;
- and ``threads``: the torch intra-op threads the figures were computed with.

The accelerator's fields are read once a session (the plugin's device detection) and
published to the session's processes through ``PUBLISHED_ENV``. ``OVERRIDE_ENV``
(``NPU_REGRESS_IDENTITY="vendor=TestVendor,threads=1"``) replaces fields: a runner measured
as another, or a test of a runner whose identity no table holds (docs/drift.md).
"""

from __future__ import annotations

import functools
import json
import os
import platform
from collections.abc import Iterable, Mapping

#: the accelerator's identity fields, published by the plugin to the session's processes
PUBLISHED_ENV = "NPU_REGRESS_ACCELERATOR"
#: field=value pairs that replace the detected ones (documented in docs/drift.md)
OVERRIDE_ENV = "NPU_REGRESS_IDENTITY"
#: CPU flags (/proc/cpuinfo) that choose a kernel's path, and so its rounding
CPU_FEATURES = ("amx_bf16", "amx_fp16", "amx_int8", "avx512_fp16", "avx512_bf16",
                "avx512_vnni", "avx512f", "avx2", "fma", "sve2", "sve", "bf16", "i8mm",
                "asimd")
#: the fields in the order they are shown
ORDER = ("device", "arch", "vendor", "features", "soc", "cann", "driver", "torch_npu", "name",
         "capability", "cuda", "threads")

Identity = dict[str, str]


@functools.cache
def cpu_fields() -> Identity:
    """The host CPU: architecture, vendor and kernel-choosing features (read once a
    process: every judged row asks)."""
    vendor, flags = "", []
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                key = line.split(":", 1)[0].strip()
                if key in ("vendor_id", "CPU implementer") and not vendor:
                    vendor = line.split(":", 1)[1].strip()
                elif key in ("flags", "Features") and not flags:
                    flags = line.split(":", 1)[1].split()
    except OSError:
        pass
    return {"arch": platform.machine() or "unknown", "vendor": vendor or "unknown",
            "features": " ".join(f for f in CPU_FEATURES if f in flags) or "none"}


def accelerator_fields(kind: str, npu: Mapping[str, object] | None = None,
                       device: Mapping[str, object] | None = None) -> Identity:
    """The accelerator's fields from what the session detected: ``npu`` (the hardware
    versions' ``to_dict``) and ``device`` (``DeviceInfo.to_dict``, with the probe's CUDA
    name, capability and version). A field the detection could not read is ``unknown``:
    an envelope never matches a runner by a field neither side knows."""
    npu, device = npu or {}, device or {}

    def read(mapping: Mapping[str, object], name: str) -> str:
        value = mapping.get(name)
        return str(value) if value not in (None, "") else "unknown"

    if kind == "npu":
        soc = read(npu, "soc_name")
        if npu.get("soc_version") is not None:
            soc = f"{soc} ({npu['soc_version']})"
        return {"soc": soc, "cann": read(npu, "cann_version"),
                "driver": read(npu, "driver_version"),
                "torch_npu": read(device, "torch_npu_version")}
    if kind == "cuda":
        accel = device.get("accelerator") if isinstance(device.get("accelerator"), Mapping) \
            else {}
        return {"name": read(accel, "name"), "capability": read(accel, "capability"),
                "cuda": read(accel, "cuda")}
    return {}


def publish(kind: str, fields: Mapping[str, str]) -> None:
    """Tell this process and its children the accelerator's identity (the plugin, once a
    session)."""
    os.environ[PUBLISHED_ENV] = json.dumps({"device": kind, **fields})


def _published(kind: str) -> Identity:
    try:
        data = json.loads(os.environ.get(PUBLISHED_ENV) or "{}")
    except json.JSONDecodeError:
        data = {}
    if not isinstance(data, dict) or data.get("device") != kind:
        return accelerator_fields(kind)  # not published: every field unknown
    return {str(k): str(v) for k, v in data.items() if k != "device"}


def overrides() -> Identity:
    """``OVERRIDE_ENV``'s fields; a pair without ``=`` raises ``ValueError`` naming it."""
    found = {}
    for pair in filter(None, (p.strip() for p in os.environ.get(OVERRIDE_ENV, "").split(","))):
        name, sep, value = pair.partition("=")
        if not sep or not name.strip():
            raise ValueError(f"{OVERRIDE_ENV}={os.environ[OVERRIDE_ENV]!r}: {pair!r} is not "
                             "field=value; give comma-separated pairs, such as "
                             "'vendor=TestVendor,threads=1'")
        found[name.strip()] = value.strip()
    return found


def child_threads() -> int:
    """The torch intra-op threads the session's children are given: the xdist share of the
    CPUs, else ``OMP_NUM_THREADS``, else one a usable CPU (torch's default)."""
    from harness.stack.devices import THREADS_ENV, thread_budget_env

    budget = thread_budget_env(os.environ).get(THREADS_ENV) or os.environ.get("OMP_NUM_THREADS")
    if budget and budget.isdigit():
        return int(budget)
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") \
        else (os.cpu_count() or 1)


def runner(kind: str, threads: int = 0) -> Identity:
    """This runner's identity for a row of device ``kind`` computed with ``threads`` torch
    threads (0: not recorded by the check: the threads its children are given)."""
    fields: Identity = {"device": kind}
    fields.update(dict(cpu_fields()) if kind == "cpu" else _published(kind))
    fields["threads"] = str(threads or child_threads())
    fields.update(overrides())
    return fields


def label(identity: Mapping[str, str]) -> str:
    """``cpu x86_64 AuthenticAMD [avx2 avx512_bf16] 2 threads``: one line for a message."""
    if not identity:
        return "no runner named (measured before envelopes were keyed by their runner)"
    shown = []
    for name in sorted(identity, key=lambda n: (ORDER.index(n) if n in ORDER else len(ORDER),
                                                n)):
        value = identity[name]
        shown.append(f"[{value}]" if name == "features" else
                     f"{value} threads" if name == "threads" else
                     value if name in ("device", "arch", "vendor", "name", "soc") else
                     f"{name} {value}")
    return " ".join(shown)


def differences(row: Mapping[str, str], here: Mapping[str, str]) -> list[str]:
    """Each field that differs, as ``threads 2 (the envelope's) vs 1 (this runner's)``; a
    field one side lacks reads ``unset``, and ``unknown`` never equals anything."""
    return [f"{name} {row.get(name, 'unset')} (the envelope's) vs {here.get(name, 'unset')} "
            "(this runner's)"
            for name in sorted(set(row) | set(here),
                               key=lambda n: ORDER.index(n) if n in ORDER else len(ORDER))
            if row.get(name) != here.get(name) or row.get(name) == "unknown"]


def matches(row: Mapping[str, str], here: Mapping[str, str]) -> bool:
    """Exact: every field equal, none unknown, and a row that names no runner matches none."""
    return bool(row) and not differences(row, here)


def nearest(rows: Iterable[Mapping[str, str]], here: Mapping[str, str]
            ) -> Mapping[str, str] | None:
    """The runner among ``rows`` with the fewest fields unlike ``here``'s."""
    return min(rows, key=lambda row: len(differences(row, here)), default=None)
