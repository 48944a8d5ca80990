"""The Ascend hardware family: which chip, driver (HDK) and CANN a runner has, from which
source (``versions``); fake machines for the checks (``spoof``); the released
implementations compared with ours (``conformance``, with the known ``disagreements``);
and the stack preflight (``preflight``: torch / torch_npu pair, ops package, CANN for the
installed vllm-ascend).

Layer: a check family. May import the isolation core and the stack layer, never the pytest
face (``harness.plugin``) or the report. ``harness.hardware.X`` is ``versions.X``.
"""

from __future__ import annotations

from harness.hardware.spoof import NpuSpoof
from harness.hardware.versions import (
    DEFAULT_ROOT,
    IPC_MIN_CANN,
    IPC_MIN_DRIVER,
    NPU_SMI_TIMEOUT_S,
    ROOT_ENV,
    SOC_NAME_RULES,
    SOC_RANGES,
    VLLM_ASCEND_SOC_RANGES,
    AscendHardwareVersion,
    Decision,
    NpuVersions,
    ascend_root,
    detect_in_child,
    get_npu_versions,
    ipc_support,
    parse_npu_smi_board,
    parse_npu_smi_header,
    parse_version,
    trim_version,
    vllm_ascend_family,
)

__all__ = [
    "ascend_root",
    "AscendHardwareVersion",
    "Decision",
    "DEFAULT_ROOT",
    "detect_in_child",
    "get_npu_versions",
    "IPC_MIN_CANN",
    "IPC_MIN_DRIVER",
    "ipc_support",
    "NPU_SMI_TIMEOUT_S",
    "NpuSpoof",
    "NpuVersions",
    "parse_npu_smi_board",
    "parse_npu_smi_header",
    "parse_version",
    "ROOT_ENV",
    "SOC_NAME_RULES",
    "SOC_RANGES",
    "trim_version",
    "vllm_ascend_family",
    "VLLM_ASCEND_SOC_RANGES",
]
