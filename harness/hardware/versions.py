"""Which Ascend hardware, driver (HDK) and CANN this is, and whether IPC may be used.

Facts file, section 2. The stacks we test get this wrong in ways that cost days, so every
rule here is a prefix or a range from torch_npu's SoC table (never a substring guess), every
value remembers where it came from, every failed source is recorded instead of raised, and
every IPC decision names its reason.

Detection never runs in the pytest process when torch_npu is installed
(``get_soc_version`` initialises the device): the plugin asks an isolated child.
"""

from __future__ import annotations

import contextlib
import os
import platform
import re
import shutil
import subprocess
from dataclasses import asdict, dataclass, field
from enum import IntEnum
from pathlib import Path
from typing import Any

from packaging.version import InvalidVersion, Version

#: replaces /usr/local/Ascend for every default path (the spoof points it at a temp dir)
ROOT_ENV = "HARNESS_ASCEND_ROOT"
DEFAULT_ROOT = "/usr/local/Ascend"
NPU_SMI_TIMEOUT_S = 20.0

#: IPC thresholds (after trimming), compared with packaging.version
IPC_MIN_DRIVER = "25.3.rc1"
IPC_MIN_CANN = "8.3.rc1"


class AscendHardwareVersion(IntEnum):
    """Ascend chip families. NONE: no NPU (or torch_npu unusable); UNKNOWN: an NPU whose SoC
    is outside torch_npu's table (verl calls this MAX_VERSION)."""

    NONE = 0
    A1 = 1  # Ascend910A class (910PremiumA, 910ProA, 910A, 910ProB, and plain "Ascend910B")
    A2 = 2  # Ascend910B1 ... Ascend910B4_1
    A3 = 3  # Ascend910_93xx
    A5 = 5  # Ascend950 (early names Ascend910_95xx)
    ASCEND310P = 310
    ASCEND310B = 311
    UNKNOWN = 999
    MAX_VERSION = 999  # verl's name for UNKNOWN (an alias)

    @classmethod
    def from_soc_version(cls, soc_version: int) -> AscendHardwareVersion:
        """torch_npu's SoC number (``torch_npu.npu.get_soc_version()``) -> family."""
        for (low, high), family in SOC_RANGES.items():
            if low <= soc_version <= high:
                return family
        return cls.UNKNOWN

    @classmethod
    def from_soc_name(cls, name: str) -> AscendHardwareVersion:
        """``torch_npu.npu.get_device_name()`` -> family, by prefix and exact-name rules."""
        name = (name or "").strip()
        for pattern, family in SOC_NAME_RULES:
            if pattern.fullmatch(name):
                return family
        return cls.UNKNOWN


#: torch_npu's SoC number ranges, inclusive
SOC_RANGES: dict[tuple[int, int], AscendHardwareVersion] = {
    (100, 104): AscendHardwareVersion.A1,
    (200, 205): AscendHardwareVersion.ASCEND310P,
    (220, 225): AscendHardwareVersion.A2,
    (240, 243): AscendHardwareVersion.ASCEND310B,
    (250, 256): AscendHardwareVersion.A3,
    (260, 260): AscendHardwareVersion.A5,
}
#: vllm-ascend's own ranges (``vllm_ascend/utils.py``): A3 stops at 255, where torch_npu
#: goes to 256
VLLM_ASCEND_SOC_RANGES: dict[tuple[int, int], str] = {
    (220, 225): "A2", (250, 255): "A3", (200, 205): "310P", (260, 260): "A5",
}

SOC_NAME_RULES: list[tuple[re.Pattern[str], AscendHardwareVersion]] = [
    (re.compile(r"Ascend950.*"), AscendHardwareVersion.A5),
    (re.compile(r"Ascend910_95.*"), AscendHardwareVersion.A5),
    (re.compile(r"Ascend910_93.*"), AscendHardwareVersion.A3),
    (re.compile(r"Ascend910B\d.*"), AscendHardwareVersion.A2),
    # plain "Ascend910B" is SoC 104, a 910A-class chip: not A2
    (re.compile(r"Ascend910(PremiumA|ProA|A|ProB|B)"), AscendHardwareVersion.A1),
    (re.compile(r"Ascend310P\d.*"), AscendHardwareVersion.ASCEND310P),
    (re.compile(r"Ascend310B\d.*"), AscendHardwareVersion.ASCEND310B),
]


def vllm_ascend_family(soc_version: int) -> str | None:
    """What vllm-ascend's ``device_type_from_soc_version`` would say; None where it raises."""
    for (low, high), family in VLLM_ASCEND_SOC_RANGES.items():
        if low <= soc_version <= high:
            return family
    return None


# --- versions ---------------------------------------------------------------------------

_RC = re.compile(r"rc\d+", re.IGNORECASE)


def trim_version(raw: str) -> str:
    """``25.3.rc1.2`` -> ``25.3.rc1``; ``25.5.t3.b001`` -> ``25.5``; ``8.3.RC1`` -> ``8.3.rc1``.

    Keep leading numeric parts and at most one ``rcN`` part; stop at anything else.
    """
    kept: list[str] = []
    for part in raw.strip().split("."):
        if part.isdigit():
            kept.append(part)
        elif _RC.fullmatch(part) and kept:
            kept.append(part.lower())
            break
        else:
            break
    return ".".join(kept)


def parse_version(raw: str | None) -> Version | None:
    """Trimmed and parsed; None for missing or unparseable (never raises)."""
    if not raw:
        return None
    trimmed = trim_version(raw)
    if not trimmed:
        return None
    try:
        return Version(trimmed)
    except InvalidVersion:
        return None


# --- detection --------------------------------------------------------------------------

@dataclass(frozen=True)
class NpuVersions:
    """What this machine is. ``sources`` says where each value came from; ``errors`` holds
    every source that failed ("source: what happened"); ``reason`` explains NONE/UNKNOWN."""

    hardware: AscendHardwareVersion
    soc_name: str | None = None
    soc_version: int | None = None
    driver_version: str | None = None
    cann_version: str | None = None
    sources: dict[str, str] = field(default_factory=dict)
    errors: tuple[str, ...] = ()
    reason: str = ""
    #: the sources disagreeing with each other (SoC number vs name...)
    disagreements: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["hardware"] = self.hardware.name
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> NpuVersions:
        fields = dict(data)
        fields["hardware"] = AscendHardwareVersion[fields["hardware"]]
        fields["errors"] = tuple(fields.get("errors", ()))
        fields["disagreements"] = tuple(fields.get("disagreements", ()))
        return cls(**fields)

    def summary(self) -> str:
        hw = self.hardware.name
        soc = f" {self.soc_name or '?'} (SoC {self.soc_version})" if self.soc_version or \
            self.soc_name else ""
        text = (f"hardware={hw}{soc}; driver={self.driver_version or 'unknown'}; "
                f"CANN={self.cann_version or 'unknown'}")
        return text + (f" ({self.reason})" if self.reason else "")


def ascend_root() -> Path:
    return Path(os.environ.get(ROOT_ENV) or DEFAULT_ROOT)


def _read_key(path: Path, key: str) -> str | None:
    """``key=value`` (or ``key: value``) from a small text file; None if absent."""
    text = path.read_text(errors="replace")
    for line in text.splitlines():
        k, sep, v = line.partition("=")
        if not sep:
            k, sep, v = line.partition(":")
        if sep and k.strip().lower() == key.lower() and v.strip():
            return v.strip()
    return None


_SOFTWARE_VERSION = re.compile(r"Software\s+Version\s*:\s*(\S+)", re.IGNORECASE)
_HEADER_VERSION = re.compile(r"npu-smi\s+\S+\s+Version:\s*(\S+)", re.IGNORECASE)


def parse_npu_smi_board(text: str) -> str | None:
    m = _SOFTWARE_VERSION.search(text)
    return m.group(1) if m else None


def parse_npu_smi_header(text: str) -> str | None:
    m = _HEADER_VERSION.search(text)
    return m.group(1).rstrip("|") if m else None


def _npu_smi(*args: str) -> str:
    exe = shutil.which("npu-smi")
    if exe is None:
        raise FileNotFoundError("npu-smi is not on PATH")
    proc = subprocess.run([exe, *args], capture_output=True, text=True,
                          timeout=NPU_SMI_TIMEOUT_S, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"`npu-smi {' '.join(args)}` exited {proc.returncode}: "
                           f"{(proc.stderr or proc.stdout).strip()[:200]}")
    return proc.stdout


class _Collector:
    """Values with their sources, and every failure, in the order the sources are tried."""

    def __init__(self) -> None:
        self.values: dict[str, Any] = {}
        self.sources: dict[str, str] = {}
        self.errors: list[str] = []

    def attempt(self, key: str, source: str, fn: Any) -> None:
        if self.values.get(key) not in (None, ""):
            return
        try:
            value = fn()
        except Exception as exc:  # noqa: BLE001 - every failure is recorded, never raised
            self.errors.append(f"{source}: {type(exc).__name__}: {exc}")
            return
        if value in (None, ""):
            self.errors.append(f"{source}: no value")
            return
        self.values[key] = value
        self.sources[key] = source


def _toolkit_info_paths() -> list[Path]:
    arch = f"{platform.machine()}-linux"
    bases = [os.environ.get("ASCEND_HOME_PATH")] if os.environ.get("ASCEND_HOME_PATH") else []
    bases += [str(ascend_root() / "ascend-toolkit" / "latest"), str(ascend_root() / "cann")]
    paths: list[Path] = []
    for base in bases:
        paths.append(Path(base) / arch / "ascend_toolkit_install.info")
        paths.extend(sorted(Path(base).glob("*-linux/ascend_toolkit_install.info")))
    return list(dict.fromkeys(paths))


def get_npu_versions(device_id: int = 0) -> NpuVersions:
    """Detect hardware, driver and CANN versions from every source, recording failures.

    Sources, in order: torch_npu (``get_soc_version``, ``get_device_name``,
    ``utils.get_cann_version``); ``npu-smi info -t board -i <id>`` (then ``id // 2``, one
    card holding two dies on A3), then the ``npu-smi info`` header; the driver's
    ``version.info``; ``ascend_toolkit_install.info`` under ``$ASCEND_HOME_PATH`` and both
    default install bases. Never raises.
    """
    c = _Collector()
    torch_npu: Any = None
    try:
        import torch_npu  # noqa: F811
    except Exception as exc:  # noqa: BLE001
        c.errors.append(f"import torch_npu: {type(exc).__name__}: {exc}")
    if torch_npu is not None:
        c.attempt("soc_version", "torch_npu.npu.get_soc_version()",
                  lambda: int(torch_npu.npu.get_soc_version()))
        c.attempt("soc_name", "torch_npu.npu.get_device_name()",
                  lambda: str(torch_npu.npu.get_device_name(device_id)))
        c.attempt("cann_version", 'torch_npu.utils.get_cann_version(module="CANN")',
                  lambda: torch_npu.utils.get_cann_version(module="CANN"))
        c.attempt("driver_version", 'torch_npu.utils.get_cann_version(module="DRIVER")',
                  lambda: torch_npu.utils.get_cann_version(module="DRIVER"))
    for board_id in dict.fromkeys([device_id, device_id // 2]):
        args = ("info", "-t", "board", "-i", str(board_id))
        c.attempt("driver_version", f"npu-smi {' '.join(args)}",
                  lambda a=args: parse_npu_smi_board(_npu_smi(*a)))
    c.attempt("driver_version", "npu-smi info (header)",
              lambda: parse_npu_smi_header(_npu_smi("info")))
    info = ascend_root() / "driver" / "version.info"
    c.attempt("driver_version", str(info), lambda: _read_key(info, "Version"))
    for path in _toolkit_info_paths():
        c.attempt("cann_version", str(path), lambda p=path: _read_key(p, "version"))
    return _decide(c, torch_npu is not None)


def _decide(c: _Collector, have_torch_npu: bool) -> NpuVersions:
    soc_version = c.values.get("soc_version")
    soc_name = c.values.get("soc_name")
    disagreements: list[str] = []
    by_number = AscendHardwareVersion.from_soc_version(soc_version) if soc_version is not None \
        else None
    by_name = AscendHardwareVersion.from_soc_name(soc_name) if soc_name else None
    if by_number is not None and by_name is not None and by_number != by_name:
        disagreements.append(f"SoC {soc_version} means {by_number.name} but the name "
                             f"{soc_name!r} means {by_name.name}")
    if soc_version is not None and by_number is not None:
        theirs = vllm_ascend_family(soc_version)
        ours = by_number.name.removeprefix("ASCEND")
        if by_number in (AscendHardwareVersion.A2, AscendHardwareVersion.A3,
                         AscendHardwareVersion.A5, AscendHardwareVersion.ASCEND310P) \
                and theirs != ours:
            disagreements.append(f"SoC {soc_version}: torch_npu's table says {by_number.name}, "
                                 f"vllm-ascend's says {theirs or 'unsupported (raises)'}")
    if not have_torch_npu:
        hardware, reason = AscendHardwareVersion.NONE, "torch_npu is not usable: " + \
            next((e for e in c.errors if e.startswith("import torch_npu")), "not installed")
    elif by_number is not None:
        hardware, reason = by_number, ("" if by_number != AscendHardwareVersion.UNKNOWN
                                       else f"SoC {soc_version} is not in torch_npu's table")
    elif by_name is not None:
        hardware, reason = by_name, ("SoC number unavailable; decided by the device name"
                                     if by_name != AscendHardwareVersion.UNKNOWN
                                     else f"device name {soc_name!r} matches no known family")
    else:
        hardware, reason = AscendHardwareVersion.NONE, \
            "torch_npu imported but neither the SoC number nor the device name could be read"
    return NpuVersions(
        hardware=hardware, soc_name=soc_name, soc_version=soc_version,
        driver_version=c.values.get("driver_version"), cann_version=c.values.get("cann_version"),
        sources=dict(c.sources), errors=tuple(c.errors), reason=reason,
        disagreements=tuple(disagreements),
    )


# --- the IPC decision ---------------------------------------------------------------------

@dataclass(frozen=True)
class Decision:
    supported: bool
    reason: str


def ipc_support(versions: NpuVersions) -> Decision:
    """May NPU memory be shared between processes (IPC)? Every branch names its reason."""
    hw = versions.hardware
    if hw == AscendHardwareVersion.NONE:
        return Decision(False, f"no NPU: {versions.reason or 'hardware NONE'}")
    if hw == AscendHardwareVersion.A5:
        name = versions.soc_name or ""
        if name.startswith("Ascend950DT"):
            return Decision(False, f"{name}: torch_npu's memory-sharing notes say Ascend 950DT "
                                   "does not support IPC yet")
        return Decision(True, f"A5 ({name or 'SoC ' + str(versions.soc_version)}) is IPC-capable "
                              f"without the HDK check: A5 HDKs are numbered on their own (PCIe "
                              f"card 25.7, Pod 25.1, Server 25.6), so the A2/A3 threshold "
                              f"{IPC_MIN_DRIVER} does not apply (driver here: "
                              f"{versions.driver_version or 'unknown'})")
    if hw not in (AscendHardwareVersion.A2, AscendHardwareVersion.A3):
        return Decision(False, f"{hw.name}: the IPC rule is defined only for A2, A3 and A5")
    checks = (("driver (HDK)", versions.driver_version, IPC_MIN_DRIVER),
              ("CANN", versions.cann_version, IPC_MIN_CANN))
    for label, raw, minimum in checks:
        if not raw:
            return Decision(False, f"{hw.name}: the {label} version is unknown, so IPC "
                                   f"(needs >= {minimum}) cannot be confirmed")
        parsed = parse_version(raw)
        if parsed is None:
            return Decision(False, f"{hw.name}: the {label} version {raw!r} cannot be parsed")
        if parsed < Version(minimum):
            return Decision(False, f"{hw.name}: {label} {raw} (read as {trim_version(raw)}) is "
                                   f"below {minimum}")
    return Decision(True, f"{hw.name}: driver {versions.driver_version} >= {IPC_MIN_DRIVER} "
                          f"and CANN {versions.cann_version} >= {IPC_MIN_CANN}")


def detect_in_child(timeout: float = 120.0) -> NpuVersions:
    """``get_npu_versions()`` without touching the NPU here: in this process when torch_npu
    is not installed, else in an isolated spawn child. Never raises."""
    from harness.stack.devices import has_module

    if not has_module("torch_npu"):
        return get_npu_versions()
    from harness.isolation.run import isolate

    res = isolate(get_npu_versions, timeout=timeout, method="spawn")
    if res.outcome == "returned":
        value: NpuVersions = res.value
        return value
    with contextlib.suppress(Exception):
        res.raise_for_outcome()
    return NpuVersions(AscendHardwareVersion.NONE,
                       reason=f"version detection in a child failed: {res.summary()} "
                              f"{res.message}".strip())


from harness.hardware.spoof import NpuSpoof  # noqa: E402 - re-exported: harness.hardware.NpuSpoof

__all__ = [
    "AscendHardwareVersion", "Decision", "NpuSpoof", "NpuVersions", "get_npu_versions",
    "ipc_support", "parse_version", "trim_version",
]
