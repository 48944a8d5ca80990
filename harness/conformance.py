"""Other implementations of the hardware decisions, asked the same questions as ours.

verl (``get_npu_versions`` / ``check_ipc_version_support``) and vllm-ascend
(``device_type_from_soc_version``) each decide the chip family and IPC support their own
way (facts file, section 2). The conformance suite runs each case against them in a
spoofed child and reports every difference from ``harness.hardware``, case by case.
Module locations differ between releases, so each adapter tries a list of candidates and
its skip reason names them.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

from harness.devices import has_module
from harness.hardware import AscendHardwareVersion


@dataclass(frozen=True)
class Implementation:
    name: str
    modules: tuple[str, ...]
    functions: tuple[str, ...]

    def locate(self) -> tuple[Any, str | None]:
        """(module, None) or (None, why it is unavailable). Imports: call in a child."""
        for candidate in filter(has_module, self.modules):
            module = importlib.import_module(candidate)
            if all(hasattr(module, f) for f in self.functions):
                return module, None
        return None, (f"{self.name}: none of {', '.join(self.modules)} provides "
                      f"{', '.join(self.functions)}")

    def installed(self) -> str | None:
        """Parent side, without importing: None if the top package exists, else why not."""
        top = self.modules[0].split(".")[0]
        return None if has_module(top) else f"{top} is not installed"


VERL = Implementation("verl", ("verl.utils.device", "verl.utils.npu_utils"),
                      ("get_npu_versions", "check_ipc_version_support"))
VLLM_ASCEND = Implementation("vllm_ascend", ("vllm_ascend.utils", "vllm_ascend.platform"),
                             ("device_type_from_soc_version",))
IMPLEMENTATIONS = {impl.name: impl for impl in (VERL, VLLM_ASCEND)}


def _family(value: Any) -> str:
    """Normalise another implementation's answer (enum, str, int) to a family name."""
    if value is None:
        return "NONE"
    name = getattr(value, "name", None) or str(value)
    name = name.rsplit(".", 1)[-1].upper()
    return {"MAX_VERSION": "UNKNOWN", "_310P": "ASCEND310P", "310P": "ASCEND310P"}.get(name, name)


def ask(impl_name: str, soc_version: int | None, driver: str | None,
        cann: str | None) -> dict[str, Any]:
    """Child side: what ``impl_name`` decides under the active spoof."""
    impl = IMPLEMENTATIONS[impl_name]
    module, why = impl.locate()
    if module is None:
        raise ModuleNotFoundError(why)
    answer: dict[str, Any] = {}
    if impl is VERL:
        versions = module.get_npu_versions()
        if isinstance(versions, tuple) and len(versions) == 3:
            answer["hardware"] = _family(versions[0])
        try:
            answer["ipc_by_versions"] = bool(module.check_ipc_version_support(driver, cann))
        except Exception as exc:  # noqa: BLE001 - an error is an answer too
            answer["ipc_by_versions"] = f"raises {type(exc).__name__}: {exc}"
    else:
        try:
            answer["hardware"] = _family(module.device_type_from_soc_version(soc_version))
        except Exception as exc:  # noqa: BLE001
            answer["hardware"] = f"raises {type(exc).__name__}"
    return answer


def differences(ours: dict[str, Any], theirs: dict[str, Any]) -> list[str]:
    """Every key both answered where the answers differ, as sentences."""
    return [f"{key}: ours {ours[key]!r}, theirs {theirs[key]!r}"
            for key in sorted(theirs) if key in ours and ours[key] != theirs[key]]


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
