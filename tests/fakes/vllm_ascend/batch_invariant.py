"""Fake vllm_ascend.batch_invariant, AscendC path, following the facts file. Registers on the
CPU key (the real module uses "NPU"). FAKE_BI_BROKEN=on-noop / off-leaks breaks it on purpose."""

import os

import torch
import torch_npu

from vllm_ascend.ascend_config import get_ascend_config

try:
    import batch_invariant_ops  # noqa: F401

    HAS_ASCENDC_BATCH_INVARIANT = True
except ImportError:
    HAS_ASCENDC_BATCH_INVARIANT = False

_batch_invariant_LIB = None


def reduce_sum(x, dim=None, keepdim=False, *, dtype=None):
    dims = [dim] if isinstance(dim, int) else dim
    out = torch.ops.batch_invariant_ops.npu_reduce_sum_batch_invariant(x, dims, keepdim)
    return out if dtype is None else out.to(dtype)


def _add_rms_norm(x, residual, gamma, epsilon=1e-6):
    x = torch.add(x, residual)
    return torch_npu.npu_rms_norm(x, gamma, epsilon)[0], None, x


def override_envs_for_invariance():
    config = get_ascend_config()
    config.weight_nz_mode = 0
    os.environ["HCCL_DETERMINISTIC"] = "strict"
    os.environ["LCCL_DETERMINISTIC"] = "1"
    torch.use_deterministic_algorithms(True, warn_only=True)


def enable_batch_invariant_mode():
    global _batch_invariant_LIB
    if os.environ.get("FAKE_BI_BROKEN") == "on-noop":
        return
    lib = torch.library.Library("aten", "IMPL")
    lib.impl("mm", lambda a, b: torch.ops.batch_invariant_ops.npu_mm_batch_invariant(a, b), "CPU")
    lib.impl("matmul",
             lambda a, b: torch.ops.batch_invariant_ops.npu_matmul_batch_invariant(a, b), "CPU")
    _batch_invariant_LIB = lib
    torch_npu.npu_fused_infer_attention_score = (
        torch.ops.batch_invariant_ops.npu_fused_infer_attention_score_batch_invariant)
    torch_npu.npu_add_rms_norm = _add_rms_norm
    torch.sum = reduce_sum
    torch.Tensor.sum = reduce_sum


def init_batch_invariance():
    if os.environ.get("VLLM_BATCH_INVARIANT", "0") == "1" or \
            os.environ.get("FAKE_BI_BROKEN") == "off-leaks":
        override_envs_for_invariance()
        enable_batch_invariant_mode()
