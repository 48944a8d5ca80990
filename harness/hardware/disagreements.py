"""Known disagreements between the released implementations and ``harness.hardware``.

Measured by running the conformance suite against verl 0.9.1 and vllm-ascend 0.23.0.post1
(``vllm_ascend/utils.py`` ``check_ascend_device_type``) on fully answered spoofed machines.
A conformance case whose difference is listed here, with the same answer from them, passes
and records the reason; a difference that is not listed, or a different answer, fails: new
an upstream change. A listed difference that went away fails too, so the list follows releases.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Known:
    #: their answer, or how it starts ("raises RuntimeError: Can not support")
    theirs: str
    reason: str

    def matches(self, answer: Any) -> bool:
        text = answer if isinstance(answer, str) else repr(answer)
        return text == self.theirs or (self.theirs.startswith("raises ")
                                        and text.startswith(self.theirs))


KNOWN_DISAGREEMENTS: dict[tuple[str, str], dict[str, Known]] = {}


def _known(impl: str, key: str, theirs: str, reason: str, cases: list[str]) -> None:
    for case in cases:
        KNOWN_DISAGREEMENTS.setdefault((impl, case), {})[key] = Known(theirs, reason)


UNKNOWN_SOCS = ["soc-105", "soc-199", "soc-206", "soc-219", "soc-226", "soc-239", "soc--1",
                "soc-244", "soc-0", "soc-249", "soc-99", "soc-257", "soc-259", "soc-261",
                "soc-999"]
CLASS_910A = ["soc-100", "soc-101", "soc-102", "soc-103", "soc-104", "name-Ascend910B",
              "name-Ascend910A", "name-Ascend910ProB", "name-Ascend910PremiumA",
              "ipc-910a-class", "name-and-number-disagree"]

# --- verl 0.9.1, verl/utils/device.py ------------------------------------------------------
_known("verl", "hardware", "A2",
       "verl's name rule is a substring test ('Ascend910B' in the name means A2), so plain "
       "'Ascend910B', SoC 104 of torch_npu's 910A class, reads as A2",
       ["soc-104", "name-Ascend910B", "ipc-910a-class", "name-and-number-disagree"])
_known("verl", "hardware", "UNKNOWN",
       "verl has no 910A-class family: Ascend910PremiumA/ProA/A/ProB are MAX_VERSION there",
       ["soc-100", "soc-101", "soc-102", "soc-103", "name-Ascend910A", "name-Ascend910ProB",
        "name-Ascend910PremiumA"])
_known("verl", "hardware", "UNKNOWN",
       "verl knows only A2, A3 and A5: Ascend310P chips are MAX_VERSION there",
       ["soc-200", "soc-201", "soc-202", "soc-203", "soc-204", "soc-205", "name-Ascend310P3"])
_known("verl", "hardware", "UNKNOWN",
       "verl knows only A2, A3 and A5: Ascend310B chips are MAX_VERSION there",
       ["soc-240", "soc-241", "soc-242", "soc-243", "name-Ascend310B1"])
_known("verl", "hardware", "A2",
       "verl matches names as substrings, so junk around 'Ascend910B' still reads as A2; we "
       "match from the start of the name and answer UNKNOWN",
       ["name-xAscend910B3", "name-Ascend910Bx"])
_known("verl", "hardware", "A3", "verl matches 'Ascend910_93' anywhere in the name",
       ["name-NPU-Ascend910_9391"])
_known("verl", "hardware", "A5", "verl matches 'Ascend950' anywhere in the name",
       ["name-Atlas Ascend950PR"])
_known("verl", "hardware", "NONE",
       "a SoC number outside torch_npu's table comes with no device name; verl reads only "
       "the name and answers NONE when it cannot, we answer UNKNOWN from the number",
       UNKNOWN_SOCS)
_known("verl", "hardware", "raises CalledProcessError",
       "verl reads the driver only from `npu-smi info -t board -i 1` (then "
       "ASCEND_VISIBLE_DEVICES) and raises when that query fails; we fall back to the "
       "npu-smi header, torch_npu and the driver's version.info", ["smi-header-only"])
_known("verl", "hardware", "raises RuntimeError: Could not find Software Version",
       "verl raises when the board query has no 'Software Version' line; we fall back to "
       "torch_npu and the driver's version.info",
       ["torch-npu-driver-answer", "smi-garbage-then-version-info"])
_known("verl", "hardware", "raises RuntimeError: Could not find version in CANN toolkit",
       "verl raises when the CANN install info has no version line; we answer CANN unknown",
       ["cann-file-garbage"])
_known("verl", "ipc_by_versions", "raises TypeError",
       "verl's IPC check raises TypeError on a missing CANN version; we answer no IPC",
       ["cann-file-garbage"])
_known("verl", "ipc_by_versions", "raises RuntimeError: Invalid software version format",
       "verl's IPC check raises on a driver version it cannot parse; we answer no IPC, "
       "naming the string", ["ipc-garbage-driver"])

# --- vllm-ascend 0.23.0.post1, vllm_ascend/utils.py check_ascend_device_type -----------------
_known("vllm_ascend", "hardware", "raises RuntimeError: Can not support soc_version",
       "vllm-ascend maps only 200-205, 220-225, 250-255 and 260 and raises on anything "
       "else: the 910A class (100-104) is unsupported there", CLASS_910A)
_known("vllm_ascend", "hardware", "raises RuntimeError: Can not support soc_version",
       "torch_npu has SoC 256 (Ascend910_9363, A3) since v2.12.0; vllm-ascend 0.23.0's A3 "
       "range stops at 255 and raises", ["soc-256", "soc-256-torch-npu-vs-vllm-ascend"])
_known("vllm_ascend", "hardware", "raises RuntimeError: Can not support soc_version",
       "vllm-ascend does not support Ascend310B (240-243) and raises",
       ["soc-240", "soc-241", "soc-242", "soc-243", "name-Ascend310B1"])
_known("vllm_ascend", "hardware", "raises RuntimeError: Can not support soc_version",
       "outside torch_npu's table vllm-ascend raises where we answer UNKNOWN", UNKNOWN_SOCS)
_known("vllm_ascend", "hardware", "raises AttributeError",
       "vllm-ascend reads only torch_npu.npu.get_soc_version(); a machine with no SoC number "
       "to give (a torch_npu without that function, a name outside torch_npu's table) makes "
       "it raise, while we decide by the name",
       ["name-Ascend910B4-1", "old-torch-npu-without-get-soc-version",
        "name-Ascend910_9579", "name-Ascend910", "name-Ascend910C", "name-ascend910b3",
        "name-GPU", "name-xAscend910B3", "name-Ascend910Ax", "name-Atlas Ascend950PR",
        "name-Ascend310", "name-NPU-Ascend910_9391", "name-empty", "name-Ascend910Bx"])


def judge(impl: str, case: str, ours: dict[str, Any], theirs: dict[str, Any]
          ) -> tuple[list[str], dict[str, str]]:
    """(problems, the reasons of the known disagreements seen) for one conformance case."""
    known = KNOWN_DISAGREEMENTS.get((impl, case), {})
    problems, reasons = [], {}
    for key in sorted(theirs):
        if key not in ours:
            continue
        entry = known.get(key)
        if ours[key] == theirs[key]:
            if entry is not None:
                problems.append(f"{impl} no longer disagrees on {key} (both {ours[key]!r}): "
                                f"remove the entry from KNOWN_DISAGREEMENTS ({entry.reason})")
        elif entry is not None and entry.matches(theirs[key]):
            reasons[key] = entry.reason
        else:
            expected = f"; the known disagreement was {entry.theirs!r}" if entry else ""
            problems.append(f"{key}: ours {ours[key]!r}, theirs {theirs[key]!r}: not a known "
                            f"disagreement (new upstream change){expected}")
    return problems, reasons
