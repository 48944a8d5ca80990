"""Fake AscendC package: its four ops in the batch_invariant_ops namespace (a FRAGMENT, so
it coexists with the harness's reference ops), CPU implementations."""

import torch

_lib = torch.library.Library("batch_invariant_ops", "FRAGMENT")
_lib.define("npu_mm_batch_invariant(Tensor a, Tensor b) -> Tensor")
_lib.define("npu_matmul_batch_invariant(Tensor a, Tensor b) -> Tensor")
_lib.define("npu_reduce_sum_batch_invariant(Tensor x, int[]? dim=None, bool keepdim=False) "
            "-> Tensor")
_lib.define("npu_fused_infer_attention_score_batch_invariant(Tensor q, Tensor k, Tensor v) "
            "-> Tensor")


def _mm(a, b):
    return torch.ops.aten.bmm.default(a.unsqueeze(0), b.unsqueeze(0))[0]


def _matmul(a, b):
    lead = a.shape[:-1]
    return _mm(a.reshape(-1, a.shape[-1]), b).reshape(*lead, b.shape[-1])


def _reduce_sum(x, dim=None, keepdim=False):
    return torch.ops.aten.sum.dim_IntList(x.float(), dim, keepdim).to(x.dtype)


def _attention(q, k, v):
    return q


for _name, _fn in [("npu_mm_batch_invariant", _mm), ("npu_matmul_batch_invariant", _matmul),
                   ("npu_reduce_sum_batch_invariant", _reduce_sum),
                   ("npu_fused_infer_attention_score_batch_invariant", _attention)]:
    _lib.impl(_name, _fn, "CompositeExplicitAutograd")
