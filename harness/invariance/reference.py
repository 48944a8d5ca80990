"""Our own batch-invariant op set: the embedded default target, on CPU and any torch device.

Modelled on vLLM's ``vllm/model_executor/layers/batch_invariant.py`` and vllm-ascend's
``vllm_ascend/batch_invariant.py`` (``docs/switch.md``): the ops live in the
``batch_invariant_ops`` torch.library namespace (defined as a FRAGMENT, so other libraries
can add theirs), and ``init_batch_invariance()`` installs them over the aten ops when
``VLLM_BATCH_INVARIANT=1``. There is no disable path, on purpose, like the real ones:
each case runs in its own process.

Why the results are batch-invariant: a row's matmul result may depend on how many rows the
product has (on the CI CPU, fp32 ``mm`` gives one result for M = 1..3 and another for
M >= 4). We pad the rows to blocks of ``BLOCK_ROWS`` and multiply every block with the same
fixed-shape kernel (one ``bmm`` over the blocks), so each row meets the same kernel whatever
the batch. Floating-point reductions (sum, mean, rms_norm, log_softmax) run as contiguous
last-dimension reductions in fp32, one per output element. ``silu`` is replaced by
``x / (1 + exp(-x))`` in fp32: measured on the CI CPU (2 threads), aten's fp32 ``silu`` and
``sigmoid`` give a row a different result depending on the tensor's size (rows of 688), while
``exp``, ``add`` and ``div`` do not (``bench/``-style sweep: widths 7..4099, 1..79 rows).

Re-entrance: the overrides of ``aten::mm`` / ``aten::matmul`` and of ``torch.sum`` call
only ``aten::bmm`` and ``torch.ops.aten.*`` overloads directly, never what they override.
"""

from __future__ import annotations

import os
from typing import Any

import torch

NAMESPACE = "batch_invariant_ops"
#: rows per fixed-shape matmul block, by dtype (fixed per dtype: that is what invariance
#: needs). Measured by bench/invariance.py on the CI CPU over 16, 32 and 64 rows: fp32 is
#: best at 32 (decode pads fewer rows), bf16 at 64 (bf16 bmm is slow on small blocks)
BLOCK_ROWS = 64
BLOCK_ROWS_BY_DTYPE = {torch.float32: 32}
SWITCH_ENV = "VLLM_BATCH_INVARIANT"

#: the aten override library: None until enabled (vLLM's ``_batch_invariant_LIB``)
_batch_invariant_LIB: torch.library.Library | None = None
#: originals, kept so the "off" path can be told apart by identity
ORIGINAL_TORCH_SUM = torch.sum
ORIGINAL_TENSOR_SUM = torch.Tensor.sum

# The libraries hang off the torch module, not this one: a re-import (importlib.reload,
# pytester's sys.modules restore) must reuse them. A second Library defining the same ops, or
# the first one collected while its Python kernels are still registered, corrupts the process.
_LIBS: dict[str, torch.library.Library] = torch.__dict__.setdefault("_npu_regress_libs", {})
if NAMESPACE not in _LIBS:
    _LIBS[NAMESPACE] = torch.library.Library(NAMESPACE, "FRAGMENT")
    _LIBS["harness_ref"] = torch.library.Library("harness_ref", "FRAGMENT")
_ops_lib = _LIBS[NAMESPACE]
_fused_lib = _LIBS["harness_ref"]
_DEFS = {
    "mm": "mm(Tensor a, Tensor b) -> Tensor",
    "matmul": "matmul(Tensor a, Tensor b) -> Tensor",
    "reduce_sum": "reduce_sum(Tensor x, int[]? dim=None, bool keepdim=False, "
                  "ScalarType? dtype=None) -> Tensor",
    "rms_norm": "rms_norm(Tensor x, Tensor weight, float eps) -> Tensor",
    "add_rms_norm": "add_rms_norm(Tensor x, Tensor residual, Tensor weight, float eps) "
                    "-> (Tensor, Tensor)",
    "log_softmax": "log_softmax(Tensor x, int dim) -> Tensor",
    "mean": "mean(Tensor x, int[]? dim=None, bool keepdim=False, ScalarType? dtype=None) "
            "-> Tensor",
    # the "vendor" fused kernel that the switch replaces (torch_npu.npu_add_rms_norm's role)
}
FUSED_ADD_RMS_NORM = "harness_ref::fused_add_rms_norm"  # also in adapters (parent side)


#: fp16 inputs are multiplied in fp32 (the final rounding to the input dtype is elementwise,
#: so invariance is kept). bf16 runs natively: with blocks of 64 rows a bf16 bmm is within
#: 1.3x of bf16 mm on the CI CPU (2-4x slower with blocks of 16), and a row's bits were the
#: same at every position in the block and for any number of blocks (measured, fp32 and bf16)
_UPCAST = (torch.float16,)


def _mm_impl(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    dtype = a.dtype
    if dtype in _UPCAST:
        a, b = a.float(), b.float()
    m, k = a.shape
    rows = BLOCK_ROWS_BY_DTYPE.get(a.dtype, BLOCK_ROWS)
    pad = (-m) % rows
    if pad:
        padded = a.new_zeros(m + pad, k)
        padded[:m] = a
        a = padded
    blocks = a.reshape(-1, rows, k)
    out = torch.ops.aten.bmm.default(blocks, b.expand(blocks.shape[0], *b.shape))
    out = out.reshape(-1, b.shape[1])[:m]
    return out.to(dtype) if dtype in _UPCAST else out


def _matmul_impl(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    if a.dim() >= 2 and b.dim() == 2:
        lead = a.shape[:-1]
        return _BI_MM(a.reshape(-1, a.shape[-1]), b).reshape(*lead, b.shape[-1])
    return _matmul_general(a, b)


def _matmul_general(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Batched or vector operands: broadcast to (batch, m, k) x (batch, k, n) and use bmm."""
    if a.dim() == 3 and b.dim() == 3 and a.shape[0] == b.shape[0]:
        return torch.ops.aten.bmm.default(a, b)
    a2 = a.unsqueeze(0) if a.dim() == 1 else a
    b2 = b.unsqueeze(-1) if b.dim() == 1 else b
    shape = torch.broadcast_shapes(a2.shape[:-2], b2.shape[:-2])
    a3 = a2.expand(*shape, *a2.shape[-2:]).reshape(-1, *a2.shape[-2:])
    b3 = b2.expand(*shape, *b2.shape[-2:]).reshape(-1, *b2.shape[-2:])
    out = torch.ops.aten.bmm.default(a3, b3).reshape(*shape, a2.shape[-2], b2.shape[-1])
    if a.dim() == 1:
        out = out.squeeze(-2)
    if b.dim() == 1:
        out = out.squeeze(-1)
    return out


def _pairwise_last(flat: torch.Tensor) -> torch.Tensor:
    """The last dimension summed by halving: zero-padded to a power of two, then the upper
    half added to the lower until one column is left. Each step is an elementwise add, so a
    row's sum is the same ops on the same operands whatever the number of rows. On CUDA the
    reduction kernel picks its strategy by the number of rows: measured on an H200,
    ``torch.sum(x, -1)`` of a 32-row batch gave rows 0, 16 and 31 other bits (1 ULP) than
    each row alone."""
    n = flat.shape[-1]
    width = 1 << max(n - 1, 0).bit_length()
    if width != n:
        pad = flat.new_zeros(*flat.shape[:-1], width - n)
        flat = torch.ops.aten.cat.default([flat, pad], -1)
    while flat.shape[-1] > 1:
        half = flat.shape[-1] // 2
        flat = torch.ops.aten.add.Tensor(flat[..., :half], flat[..., half:])
    return flat[..., 0]


def _invariant_sum(x: torch.Tensor, dims: list[int] | None, keepdim: bool) -> torch.Tensor:
    """Sum over ``dims`` (all if None) as one contiguous last-dimension reduction per output
    element: measured on the CI CPU, a row's last-dimension sum does not depend on how many
    rows there are (unlike a matmul with a ones column, which takes a gemv path that does)."""
    nd = x.dim()
    if nd == 0:
        return x.clone()
    dims = sorted({d % nd for d in dims}) if dims else list(range(nd))
    keep = [d for d in range(nd) if d not in dims]
    moved = x.permute(*keep, *dims).contiguous()
    flat = moved.reshape(*moved.shape[: len(keep)], -1)
    out = (torch.ops.aten.sum.dim_IntList(flat, [-1], False) if flat.device.type == "cpu"
           else _pairwise_last(flat))
    if keepdim:
        for d in dims:
            out = out.unsqueeze(d)
    return out


def _reduce_sum_impl(x: torch.Tensor, dim: list[int] | None = None, keepdim: bool = False,
                     dtype: torch.dtype | None = None) -> torch.Tensor:
    if not x.is_floating_point():
        return torch.ops.aten.sum.dim_IntList(x, dim if dim else None, keepdim, dtype=dtype)
    acc = torch.float64 if x.dtype == torch.float64 else torch.float32
    out = _invariant_sum(x.to(acc), list(dim) if dim else None, keepdim)
    return out.to(dtype or x.dtype)


def _mean_impl(x: torch.Tensor, dim: list[int] | None = None, keepdim: bool = False,
               dtype: torch.dtype | None = None) -> torch.Tensor:
    src = x.to(dtype) if dtype is not None else x
    nd = max(src.dim(), 1)
    dims = sorted({d % nd for d in dim}) if dim else list(range(src.dim()))
    count = 1
    for d in dims:
        count *= src.shape[d]
    acc = torch.float64 if src.dtype == torch.float64 else torch.float32
    return (_invariant_sum(src.to(acc), dims, keepdim) / count).to(src.dtype)


def _rms_norm_impl(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    var = _mean_impl(xf * xf, [-1], True)
    return (xf * torch.rsqrt(var + eps) * weight.float()).to(x.dtype)


def _add_rms_norm_impl(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                       eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    added = x + residual
    return _rms_norm_impl(added, weight, eps), added


def _log_softmax_impl(x: torch.Tensor, dim: int) -> torch.Tensor:
    xf = x.float()
    shifted = xf - torch.ops.aten.amax.default(xf, [dim], True)  # max is order-free: exact
    lse = torch.log(_invariant_sum(torch.exp(shifted), [dim], True))
    return (shifted - lse).to(x.dtype)


_IMPLS = {
    "mm": _mm_impl,
    "matmul": _matmul_impl,
    "reduce_sum": _reduce_sum_impl,
    "rms_norm": _rms_norm_impl,
    "add_rms_norm": _add_rms_norm_impl,
    "log_softmax": _log_softmax_impl,
    "mean": _mean_impl,
}


def _define_ops() -> None:
    """Define our ops once per process, whatever re-imports this module."""
    if torch.__dict__.get("_npu_regress_ops_defined"):
        return
    torch._npu_regress_ops_defined = True  # type: ignore[attr-defined]
    for name, schema in _DEFS.items():
        if not hasattr(torch.ops.batch_invariant_ops, name):
            _ops_lib.define(schema)
            _ops_lib.impl(name, _IMPLS[name], "CompositeExplicitAutograd")
    if not hasattr(torch.ops.harness_ref, "fused_add_rms_norm"):
        _fused_lib.define("fused_add_rms_norm(Tensor x, Tensor residual, Tensor weight, "
                          "float eps) -> (Tensor, Tensor, Tensor)")
        _fused_lib.impl("fused_add_rms_norm", _fused_add_rms_norm_impl,
                        "CompositeExplicitAutograd")


def _fused_add_rms_norm_impl(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                             eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    added = x + residual
    xf = added.float()
    rstd = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (xf * rstd * weight.float()).to(x.dtype), rstd, added


_define_ops()
_BI_MM = torch.ops.batch_invariant_ops.mm.default


# --- the functions the switch rebinds (the roles torch_npu's functions play on NPU) -------

def reduce_sum(x: torch.Tensor, dim: Any = None, keepdim: bool = False, *,
               dtype: torch.dtype | None = None, out: torch.Tensor | None = None
               ) -> torch.Tensor:
    """What ``torch.sum`` and ``Tensor.sum`` become when the switch is on: every form of
    theirs (``harness.invariance.call_forms``), ``out=`` included."""
    dims = [dim] if isinstance(dim, int) else (list(dim) if dim is not None else None)
    if x.is_nested:  # a jagged tensor (verl's engine sums its nested loss mask): our op
        # takes dense tensors only, and aten's nested sum has no batch to vary with
        result = (torch.ops.aten.sum.default(x, dtype=dtype) if dims is None else
                  torch.ops.aten.sum.dim_IntList(x, dims, keepdim, dtype=dtype))
    else:
        result = torch.ops.batch_invariant_ops.reduce_sum(x, dims, keepdim, dtype)
    if out is None:
        return result
    if out.shape != result.shape:
        out.resize_(result.shape)
    return out.copy_(result)


def _fused_add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                        eps: float = 1e-6) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Off: one fused kernel returning (out, rstd, residual_out), like npu_add_rms_norm."""
    return torch.ops.harness_ref.fused_add_rms_norm(x, residual, weight, eps)


def _decomposed_add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                             eps: float = 1e-6) -> tuple[torch.Tensor, None, torch.Tensor]:
    """On: a plain add, then the invariant rms_norm; rstd is None (vllm-ascend's shape)."""
    added = torch.add(x, residual)
    return torch.ops.batch_invariant_ops.rms_norm(added, weight, eps), None, added


def _attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    scores = torch.matmul(q, k.transpose(-1, -2)) / (q.shape[-1] ** 0.5)
    return torch.matmul(torch.softmax(scores, dim=-1), v)


def batch_invariant_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    scores = _matmul_general(q, k.transpose(-1, -2)) / (q.shape[-1] ** 0.5)
    probs = torch.exp(torch.ops.batch_invariant_ops.log_softmax(scores.float(), -1))
    return _matmul_general(probs.to(v.dtype), v)


#: rebindable entry points, like torch_npu.npu_add_rms_norm / npu_fused_infer_attention_score
add_rms_norm = _fused_add_rms_norm
fused_infer_attention_score = _attention


def _dispatch_key() -> str:
    from harness.stack.devices import device_kind

    return {"cpu": "CPU", "cuda": "CUDA", "npu": "PrivateUse1"}.get(device_kind(), "CPU")


def _log_softmax_override(x: torch.Tensor, dim: int, half_to_float: bool) -> torch.Tensor:
    out = torch.ops.batch_invariant_ops.log_softmax(x, dim)
    return out.float() if half_to_float else out


def _silu_override(x: torch.Tensor) -> torch.Tensor:
    xf = x.float()
    return (xf / (1 + torch.exp(-xf))).to(x.dtype)


def _mean_override(x: torch.Tensor, dim: list[int] | None = None, keepdim: bool = False,
                   dtype: torch.dtype | None = None) -> torch.Tensor:
    return torch.ops.batch_invariant_ops.mean(x, dim, keepdim, dtype)


def enable_batch_invariant_mode() -> None:
    """Install the invariant ops over aten and rebind the module-level entry points.

    No idempotence guard and no disable path, like the real modules.
    """
    global _batch_invariant_LIB, add_rms_norm, fused_infer_attention_score
    lib = torch.library.Library("aten", "IMPL")
    key = _dispatch_key()
    lib.impl("mm", _BI_MM, key)
    # 2-D weights (every linear layer) go straight to the invariant mm: one custom-op hop
    # (its profiler event is the evidence), not two
    lib.impl("matmul", _matmul_impl, key)
    lib.impl("_log_softmax", _log_softmax_override, key)
    lib.impl("mean.dim", _mean_override, key)
    lib.impl("silu", _silu_override, key)
    _batch_invariant_LIB = lib
    torch.sum = reduce_sum
    torch.Tensor.sum = reduce_sum
    add_rms_norm = _decomposed_add_rms_norm
    fused_infer_attention_score = batch_invariant_attention


def init_batch_invariance() -> None:
    """Enable when ``VLLM_BATCH_INVARIANT=1`` (any non-zero integer); otherwise do nothing."""
    value = os.environ.get(SWITCH_ENV, "0").strip() or "0"
    try:
        enabled = int(value) != 0
    except ValueError:
        raise ValueError(f"{SWITCH_ENV}={value!r} is not an integer; use 1 (on) or 0 (off)") \
            from None
    if enabled:
        override_envs_for_invariance()
        enable_batch_invariant_mode()


def override_envs_for_invariance() -> None:
    """What "on" sets besides kernels, as vllm-ascend's does (declared in
    ``harness/invariance/declared.toml``): deterministic collectives and algorithms."""
    os.environ["HCCL_DETERMINISTIC"] = "strict"
    # torch's own setting, as torch.use_deterministic_algorithms(True, warn_only=True) makes
    # it, without that function's import of torch._inductor (1.5-1.8 s in every case's child,
    # and about 70 operators it defines would read as the switch's footprint)
    torch._C._set_deterministic_algorithms(True, warn_only=True)


def is_enabled() -> bool:
    """On by identity, not by the environment: the library exists and torch.sum is ours."""
    return _batch_invariant_LIB is not None and torch.sum is reduce_sum
