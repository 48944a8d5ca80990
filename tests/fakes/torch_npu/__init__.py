"""Fake torch_npu: the functions the batch-invariance adapter touches, as CPU ops in the
``npu`` namespace so they show up as ``npu::...`` profiler events like the real ones."""

import torch

_lib = torch.library.Library("npu", "FRAGMENT")
_lib.define("npu_rms_norm(Tensor x, Tensor gamma, float epsilon=1e-6) -> (Tensor, Tensor)")
_lib.define("npu_add_rms_norm(Tensor x1, Tensor x2, Tensor gamma, float epsilon=1e-6) "
            "-> (Tensor, Tensor, Tensor)")


def _rms(x, gamma, epsilon=1e-6):
    xf = x.float()
    rstd = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + epsilon)
    return (xf * rstd * gamma.float()).to(x.dtype), rstd


def _add_rms(x1, x2, gamma, epsilon=1e-6):
    added = x1 + x2
    y, rstd = _rms(added, gamma, epsilon)
    return y, rstd, added


_lib.impl("npu_rms_norm", _rms, "CompositeExplicitAutograd")
_lib.impl("npu_add_rms_norm", _add_rms, "CompositeExplicitAutograd")


def npu_rms_norm(x, gamma, epsilon=1e-6):
    return torch.ops.npu.npu_rms_norm(x, gamma, epsilon)


def npu_add_rms_norm(x1, x2, gamma, epsilon=1e-6):
    return torch.ops.npu.npu_add_rms_norm(x1, x2, gamma, epsilon)


def npu_fused_infer_attention_score(q, k, v, **kwargs):
    scores = torch.matmul(q, k.transpose(-1, -2)) / q.shape[-1] ** 0.5
    return torch.matmul(torch.softmax(scores, -1), v), None


class npu:  # noqa: N801 - mirrors torch_npu.npu
    @staticmethod
    def device_count():
        return 0

    @staticmethod
    def synchronize():
        return None
