"""Which device a session runs its children on, found without touching an accelerator here.

Initialising an NPU or a GPU in the pytest process would break every later fork ("Cannot
re-initialize NPU in forked subprocess"), so accelerators are only ever probed in a short
subprocess, and not at all on a CPU-only torch build without torch_npu.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from typing import Any

KINDS = ("npu", "cuda", "cpu")
#: visible-devices variable per accelerator kind
VISIBLE_ENV = {"npu": "ASCEND_RT_VISIBLE_DEVICES", "cuda": "CUDA_VISIBLE_DEVICES"}
PROBE_TIMEOUT_S = 120.0

_PROBE = r"""
import json, sys
out = {}
try:
    import torch
except Exception as exc:
    out["torch_error"] = f"{type(exc).__name__}: {exc}"
    print(json.dumps(out)); sys.exit(0)
try:
    import torch_npu  # noqa: F401
    out["npu_count"] = int(torch_npu.npu.device_count())
except ModuleNotFoundError as exc:
    if exc.name != "torch_npu":
        out["npu_error"] = f"{type(exc).__name__}: {exc}"
except Exception as exc:
    out["npu_error"] = f"{type(exc).__name__}: {exc}"
try:
    out["cuda_count"] = int(torch.cuda.device_count()) if torch.version.cuda else 0
    if out["cuda_count"]:
        major, minor = torch.cuda.get_device_capability(0)
        out["cuda_identity"] = {"name": torch.cuda.get_device_name(0),
                                "capability": f"{major}.{minor}",
                                "cuda": str(torch.version.cuda)}
except Exception as exc:
    out["cuda_error"] = f"{type(exc).__name__}: {exc}"
print(json.dumps(out))
"""


class DeviceError(Exception):
    """The requested device cannot be used; the message says why and what to do."""


@dataclass(frozen=True)
class DeviceInfo:
    kind: str
    count: int
    #: why this kind was chosen (shown in the report header)
    reason: str
    #: why no real NPU is used by this session, or None when one is
    npu_missing: str | None
    torch_version: str | None
    torch_npu_version: str | None
    #: a CUDA device's name, compute capability and CUDA (the probe's; the runner's
    #: identity, ``harness.stack.identity``)
    accelerator: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, object]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, object]) -> DeviceInfo:
        return cls(**data)  # type: ignore[arg-type]

    def visible(self, worker_id: str | None) -> int:
        """How many devices a case's child sees: one under xdist's pinning
        (``pinning_env``), else every one the session detected."""
        return 1 if pinning_env(self.kind, self.count, worker_id) else self.count

    def header(self) -> str:
        return (
            f"npu-regress: device={self.kind} x{self.count} ({self.reason}); "
            f"torch={self.torch_version or 'absent'}; "
            f"torch_npu={self.torch_npu_version or 'absent'}"
        )


def package_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def probe() -> dict[str, object]:
    """Ask a throwaway interpreter what accelerators torch (and torch_npu) can see."""
    try:
        proc = subprocess.run(
            [sys.executable, "-c", _PROBE], capture_output=True, text=True,
            timeout=PROBE_TIMEOUT_S, check=False,
        )
    except subprocess.TimeoutExpired:
        return {"torch_error": f"the device probe did not finish in {PROBE_TIMEOUT_S:g} s"}
    try:
        return json.loads(proc.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        return {"torch_error": f"the device probe failed (exit {proc.returncode}): "
                               f"{proc.stderr.strip()[-800:]}"}


def has_module(name: str) -> bool:
    """Whether ``name`` is installed, without importing it (a broken install still counts:
    it must fail in the child, not skip)."""
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def _needs_probe(torch_version: str | None) -> bool:
    """A CPU build of torch without torch_npu cannot see an accelerator: skip the probe."""
    if has_module("torch_npu"):
        return True
    return torch_version is not None and "+cpu" not in torch_version


def detect(requested: str = "auto", count_override: int | None = None) -> DeviceInfo:
    """Pick the session's device. ``auto``: NPU if torch_npu imports and sees one, else CUDA,
    else CPU. An installed torch_npu that fails to import is an error, never a silent CPU run.
    ``count_override`` (``--device-count``) replaces the detected count and, for an explicit
    kind, the availability check."""
    if requested not in (*KINDS, "auto"):
        raise DeviceError(f"--device {requested!r} is not one of auto, {', '.join(KINDS)}")
    torch_version = package_version("torch")
    npu_version = package_version("torch_npu")
    info = {"npu_count": 0, "cuda_count": 0}
    if requested != "cpu" and count_override is None and _needs_probe(torch_version):
        info.update(probe())
    if "npu_error" in info:
        raise DeviceError(
            f"torch_npu is installed but failed to import: {info['npu_error']}. Fix the "
            "torch/torch_npu install (they must be a matched pair), or pass --device cpu or "
            "--device cuda to run without it."
        )
    npu_count, cuda_count = int(info["npu_count"]), int(info["cuda_count"])  # type: ignore[call-overload]
    if npu_version is None:
        npu_missing = "torch_npu is not installed"
    elif npu_count == 0 and count_override is None:
        npu_missing = "torch_npu is installed but reports no NPU"
    else:
        npu_missing = None
    if requested == "auto":
        if npu_count:
            kind, count, reason = "npu", npu_count, "auto: torch_npu sees NPUs"
        elif cuda_count:
            kind, count, reason = "cuda", cuda_count, f"auto: CUDA devices found; {npu_missing}"
        else:
            kind, count, reason = "cpu", 1, f"auto: {npu_missing}; no CUDA device"
    else:
        kind, reason = requested, f"--device {requested}"
        count = {"npu": npu_count, "cuda": cuda_count, "cpu": 1}[kind]
        if count_override is None and count == 0:
            why = (npu_missing if kind == "npu"
                   else info.get("cuda_error", "torch sees no CUDA device"))
            raise DeviceError(f"--device {kind} was requested but {why}; use --device auto or cpu")
    if count_override is not None:
        count = count_override
        reason += f"; --device-count {count_override}"
    if kind == "npu":
        npu_missing = None
    elif npu_missing is None:
        npu_missing = f"the session device is {kind} ({reason})"
    accelerator = info.get("cuda_identity") if kind == "cuda" else None
    return DeviceInfo(kind, count, reason, npu_missing, torch_version, npu_version,
                      dict(accelerator) if isinstance(accelerator, dict) else {})


def worker_index(worker_id: str | None) -> int | None:
    """``gw3`` -> 3; None outside pytest-xdist."""
    if not worker_id or not worker_id.startswith("gw"):
        return None
    try:
        return int(worker_id[2:])
    except ValueError:
        return None


def pinning_env(kind: str, count: int, worker_id: str | None,
                environ: dict[str, str] | None = None) -> dict[str, str]:
    """Variables that pin xdist worker k's children to device k mod count.

    When the runner already narrowed the visible devices (``ASCEND_RT_VISIBLE_DEVICES=4,5``),
    worker k gets the (k mod count)-th of those, not physical device k.
    """
    var = VISIBLE_ENV.get(kind)
    index = worker_index(worker_id)
    if var is None or index is None or count <= 1:
        return {}
    environ = os.environ if environ is None else environ
    visible = [v.strip() for v in environ.get(var, "").split(",") if v.strip()]
    slot = index % count
    return {var: visible[slot] if slot < len(visible) else str(slot)}


#: tells a forkserver child (torch already imported) how many intra-op threads to use
THREADS_ENV = "HARNESS_TORCH_THREADS"


def thread_budget_env(environ: dict[str, str] | os._Environ[str]) -> dict[str, str]:
    """Under pytest-xdist, share the CPUs among the workers' children: N workers each running
    a torch child with every core's worth of OpenMP threads oversubscribe the machine, and
    spinning OpenMP threads then slow some checks a hundredfold (measured: a bf16 logprob case
    3 s alone, 255 s under -n 2 on 2 cores). An OMP_NUM_THREADS the user set is respected."""
    try:
        workers = int(environ.get("PYTEST_XDIST_WORKER_COUNT", "0") or 0)
    except ValueError:
        workers = 0
    if workers <= 1:
        return {}
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    threads = str(max(1, (cpus or 1) // workers))
    if environ.get("OMP_NUM_THREADS"):
        threads = environ["OMP_NUM_THREADS"]
    return {THREADS_ENV: threads, "OMP_NUM_THREADS": threads}


#: environment variable through which the plugin tells a child its device kind
DEVICE_ENV = "HARNESS_DEVICE"


def device() -> Any:
    """The ``torch.device`` this child was given by the session (``--device``); CPU outside one.

    Accelerators are pinned per xdist worker through the visible-devices variable, so the
    child always uses index 0 of what it can see.
    """
    import torch

    kind = device_kind()
    return torch.device("cpu") if kind == "cpu" else torch.device(kind, 0)


def device_count(kind: str) -> int:
    """How many devices of ``kind`` this process sees (1 on CPU). Under pytest-xdist each
    worker's children see one device (``pinning_env``)."""
    if kind == "cpu":
        return 1
    import torch

    if kind == "npu":
        import torch_npu  # noqa: F401 - adds torch.npu

    return int(getattr(torch, kind).device_count())


def device_kind() -> str:
    """``npu``, ``cuda`` or ``cpu``: the kind the session gave this child."""
    return os.environ.get(DEVICE_ENV, "cpu")


def cpu_model() -> str:
    """The CPU as /proc/cpuinfo names it, with its architecture and the flags that change a
    kernel's rounding (AMX-BF16, AVX512_BF16): where a measured envelope came from."""
    import platform

    name, flags = "", []
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                if line.startswith("model name") and not name:
                    name = line.split(":", 1)[1].strip()
                elif line.startswith("flags") and not flags:
                    flags = line.split(":", 1)[1].split()
    except OSError:
        pass
    shown = [f for f in ("amx_bf16", "avx512_bf16") if f in flags]
    return f"{name or 'unknown CPU'} ({', '.join([platform.machine(), *shown])})"
