"""Other implementations of the hardware decisions, asked the same questions as ours.

The released code of verl (``verl/utils/device.py``: ``get_npu_versions``,
``check_ipc_version_support``) and of vllm-ascend (v0.23.0's inline mapping in
``vllm_ascend/utils.py`` ``check_ascend_device_type``; ``vllm_ascend/device/hardware.py``
in later layouts) runs in a spoofed child, and every answer is compared with
``harness.hardware``. An implementation that raises has answered ("raises
CalledProcessError: ..."). Each difference is either on the list of known disagreements,
with its reason (the case passes and records it), or a new upstream change (the case fails).

Each implementation declares the upstream symbols it relies on; a missing one is
``UpstreamApiMoved`` ("upstream API moved: vllm_ascend 0.23.0.post1 has no <name>"), never an
AttributeError.
"""

from __future__ import annotations

import dataclasses
import re
import types
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from harness.hardware import AscendHardwareVersion, NpuSpoof
from harness.stack.devices import has_module
from harness.stack.upstream import (
    UpstreamApiMoved,
    import_upstream,
    release,
    require,
    source_file,
    torch_npu_file,
)


@dataclass(frozen=True)
class Implementation:
    """One upstream layout: where it lives and which of its symbols the adapter uses."""

    name: str
    distribution: str
    module: str
    symbols: tuple[str, ...]
    skip_inits: tuple[str, ...] = ()

    def installed(self) -> str | None:
        """Parent side, without importing: None if this layout is there, else why not."""
        if not has_module(self.module.split(".")[0]):
            return f"{self.distribution} is not installed"
        if source_file(self.module) is None:
            return (f"{release(self.distribution)} has no {self.module} (this layout is "
                    f"not in that release)")
        return None

    def load(self) -> types.ModuleType:
        """Child side: the module, every declared symbol present, or ``UpstreamApiMoved``."""
        if source_file(self.module) is None:
            raise UpstreamApiMoved(f"upstream API moved: {release(self.distribution)} has no "
                                f"module {self.module}")
        module = import_upstream(self.module, skip_inits=self.skip_inits)
        require(module, self.distribution, self.symbols)
        return module


VERL = Implementation("verl", "verl", "verl.utils.device",
                      ("get_npu_versions", "check_ipc_version_support",
                       "AscendHardwareVersion"), skip_inits=("verl", "verl.utils"))
VLLM_ASCEND_UTILS = Implementation("vllm_ascend", "vllm-ascend", "vllm_ascend.utils",
                                   ("check_ascend_device_type", "AscendDeviceType",
                                    "_ascend_device_type"))
VLLM_ASCEND_HARDWARE = Implementation("vllm_ascend.device", "vllm-ascend",
                                      "vllm_ascend.device.hardware",
                                      ("device_type_from_runtime_soc",))
IMPLEMENTATIONS = {impl.name: impl for impl in (VERL, VLLM_ASCEND_UTILS, VLLM_ASCEND_HARDWARE)}


def _family(value: Any) -> str:
    """Normalise another implementation's answer (enum, str, int) to a family name."""
    if value is None:
        return "NONE"
    name = getattr(value, "name", None) or str(value)
    name = name.rsplit(".", 1)[-1].upper()
    return {"MAX_VERSION": "UNKNOWN", "_310P": "ASCEND310P", "310P": "ASCEND310P"}.get(name, name)


def _raised(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"raises {type(exc).__name__}" + (f": {text[:200]}" if text else "")


def _answer(fn: Callable[[], Any]) -> Any:
    """What ``fn`` returned, or the exception it raised, as an answer."""
    try:
        return fn()
    except Exception as exc:  # noqa: BLE001 - an error is an answer too
        return _raised(exc)


class _BuildTimeType:
    """Stands in for vllm-ascend's build-time device type: equal to whatever the runtime
    check computed, which it keeps. Lets the real mapping run without a real build."""

    def __init__(self) -> None:
        self.seen: Any = None

    def __eq__(self, other: object) -> bool:
        self.seen = other
        return True

    __hash__ = object.__hash__


def ask(impl_name: str, soc_version: int | None, driver: str | None,
        cann: str | None) -> dict[str, Any]:
    """Child side: what ``impl_name`` decides under the active spoof."""
    impl = IMPLEMENTATIONS[impl_name]
    module = impl.load()
    answer: dict[str, Any] = {}
    if impl is VERL:
        versions = _answer(module.get_npu_versions)
        if isinstance(versions, tuple) and len(versions) == 3:
            answer["hardware"] = _family(versions[0])
        else:
            answer["hardware"] = versions
        answer["ipc_by_versions"] = _answer(
            lambda: bool(module.check_ipc_version_support(driver, cann)))
    elif impl is VLLM_ASCEND_UTILS:
        build_time = _BuildTimeType()
        module._ascend_device_type = build_time
        result = _answer(module.check_ascend_device_type)
        answer["hardware"] = result if isinstance(result, str) else _family(build_time.seen)
    else:
        answer["hardware"] = _answer(
            lambda: _family(module.device_type_from_runtime_soc(soc_version)))
    return answer


#: the device name torch_npu reports for each SoC number (its ``SocVersion`` enum, read
#: from the torch-npu 2.14.0 wheel's NpuVariables.h; 260 as a real board names itself)
SOC_NAMES: dict[int, str] = {
    100: "Ascend910PremiumA", 101: "Ascend910ProA", 102: "Ascend910A", 103: "Ascend910ProB",
    104: "Ascend910B", 200: "Ascend310P1", 201: "Ascend310P2", 202: "Ascend310P3",
    203: "Ascend310P4", 204: "Ascend310P5", 205: "Ascend310P7", 220: "Ascend910B1",
    221: "Ascend910B2", 222: "Ascend910B2C", 223: "Ascend910B3", 224: "Ascend910B4",
    225: "Ascend910B4_1", 240: "Ascend310B1", 241: "Ascend310B2", 242: "Ascend310B3",
    243: "Ascend310B4", 250: "Ascend910_9391", 251: "Ascend910_9392", 252: "Ascend910_9381",
    253: "Ascend910_9382", 254: "Ascend910_9372", 255: "Ascend910_9362", 256: "Ascend910_9363",
    260: "Ascend950PR_9599",
}
SOC_NUMBERS = {name: number for number, name in SOC_NAMES.items()}
DEFAULT_DRIVER = "25.3.rc1.2"
DEFAULT_CANN = "8.3.RC1"
BOARD = "NPU ID : {id}\n  Software Version : {version}\n  Firmware Version : 7.7.0.1.231\n"


def complete_spoof(spoof: NpuSpoof, *, soc_from_name: bool = True) -> NpuSpoof:
    """The same machine with every source an implementation may read answered: a device
    name that fits the SoC number, ``npu-smi info -t board -i <id>`` for any id, and the
    CANN install info under ``$ASCEND_HOME_PATH/<machine>-linux``, and the SoC number of
    a name that torch_npu's table has (unless ``soc_from_name`` is off: a torch_npu too old
    to have ``get_soc_version``). What the case set explicitly (a board answer for one id
    only, a name outside the table) stays as it is."""
    name, soc = spoof.device_name, spoof.soc_version
    if name is None and soc is not None:
        name = SOC_NAMES.get(soc)
    if soc_from_name and soc is None and name and "get_soc_version" not in spoof.raise_on:
        # torch_npu maps every name starting with "Ascend950" to 260
        soc = SOC_NUMBERS.get(name, 260 if name.startswith("Ascend950") else None)
    smi = spoof.npu_smi_output
    if smi is None:
        smi = BOARD.format(id=0, version=spoof.driver_version or DEFAULT_DRIVER)
    info = spoof.install_info
    if info is None:
        info = f"version={spoof.cann_version or DEFAULT_CANN}\n"
    return dataclasses.replace(spoof, device_name=name, soc_version=soc, npu_smi_output=smi,
                               install_info=info)


def our_answer(soc_version: int | None, soc_name: str | None, driver: str | None,
               cann: str | None) -> dict[str, Any]:
    """The same questions answered by ``harness.hardware``."""
    from harness.hardware import NpuVersions, ipc_support

    if soc_version is not None:
        hardware = AscendHardwareVersion.from_soc_version(soc_version)
    else:
        hardware = AscendHardwareVersion.from_soc_name(soc_name or "")
    versions = NpuVersions(AscendHardwareVersion.A2, driver_version=driver, cann_version=cann)
    return {"hardware": hardware.name, "ipc_by_versions": ipc_support(versions).supported}


#: torch_npu's SoC enum, in its package (installed, or the upstream set's unpacked wheel)
SOC_HEADER = "include/torch_npu/csrc/core/npu/NpuVariables.h"
_ENUM = re.compile(r"enum\s+class\s+SocVersion\s*\{(.*?)\}", re.DOTALL)


def parse_soc_enum(text: str) -> dict[int, str]:
    """``SocVersion``'s members by number (C++ enum rules: a member without a value is the
    previous one plus one; ``UnsupportedSocVersion = -1`` left out)."""
    body = _ENUM.search(text)
    if body is None:
        raise ValueError("no 'enum class SocVersion' in the header")
    table: dict[int, str] = {}
    value = -1
    for entry in re.sub(r"//[^\n]*", "", body.group(1)).split(","):
        name, _, number = entry.partition("=")
        if not name.strip():
            continue
        value = int(number.strip(), 0) if number.strip() else value + 1
        table[value] = name.strip()
    table.pop(-1, None)
    return table


def torch_npu_soc_table() -> tuple[dict[int, str], str] | None:
    """torch_npu's SoC table and where it was read (``torch-npu 2.14.0 (path)``), or None
    where no torch_npu sources are at hand."""
    found = torch_npu_file(SOC_HEADER)
    if found is None:
        return None
    path, release_name = found
    return parse_soc_enum(path.read_text()), f"{release_name} ({path})"


#: SoCs torch_npu added after its first release we know: {number: the torch_npu release that
#: added it} (256, Ascend910_9363: torch_npu v2.12.0, 2026-07-22; older releases raise on it)
SOC_SINCE = {256: "2.12.0"}


def soc_table_differences(table: dict[int, str], release: str | None = None) -> list[str]:
    """How torch_npu's table differs from what the spoofs and the hardware table know
    (``SOC_NAMES``, whose 260 is a board's full name, and ``hardware.SOC_RANGES``), for
    torch_npu ``release`` (``"2.10.0.post4"``; None: the newest): a SoC added after that
    release is not expected in its table."""
    from packaging.version import InvalidVersion, Version

    from harness.hardware import AscendHardwareVersion

    ours = {**SOC_NAMES, 260: "Ascend950"}
    if release is not None:
        try:
            have = Version(release)
        except InvalidVersion:
            have = None
        if have is not None:
            ours = {n: name for n, name in ours.items()
                    if n not in SOC_SINCE or have >= Version(SOC_SINCE[n])}
    problems = [f"SoC {n} ({table[n]}) is new: the spoofs and the hardware table lack it"
                for n in sorted(set(table) - set(ours))]
    problems += [f"SoC {n} ({ours[n]}) is gone from torch_npu's table"
                 for n in sorted(set(ours) - set(table))]
    problems += [f"SoC {n} is {table[n]} in torch_npu, {ours[n]} in the spoofs"
                 for n in sorted(set(ours) & set(table)) if ours[n] != table[n]]
    problems += [f"SoC {n} ({table[n]}) has no family in harness.hardware.SOC_RANGES"
                 for n in sorted(table) if n in ours
                 and AscendHardwareVersion.from_soc_version(n) is AscendHardwareVersion.UNKNOWN]
    return problems
