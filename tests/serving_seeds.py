"""Regressions seeded into a running engine for the serving family's negative controls
(imported by the isolated child that built the engine: ``knobs["seed_regression"]``)."""

from __future__ import annotations

from typing import Any

_KEEP: list[Any] = []


def silu_by_rows(src: Any) -> None:
    """aten::silu on the CPU computed one way for one row and another for several: a
    request's result then depends on what else the engine schedules in its step (decode
    alone: 1 row; beside others: N), the kind of regression the concurrent case must catch
    and name by op."""
    import torch

    lib = torch.library.Library("aten", "IMPL")

    def silu(x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, x.shape[-1]).shape[0] if x.dim() else 1
        return x / (1 + torch.exp(-x)) if rows > 1 else x * torch.sigmoid(x)

    lib.impl("silu", silu, "CPU")
    _KEEP.append(lib)



def sampler_logprobs_in_bf16(src: Any) -> None:
    """A regression seeded into vLLM's own sampler (``Sampler.compute_logprobs``): the
    log-softmax of a step with several requests computed in bf16 and widened back (a memory
    saving for large batches), a request alone still in fp32. The switch-off concurrent
    case's difference grows from the measured 1 ULP to bf16 rounding."""
    import torch
    from vllm.v1.sample.sampler import Sampler

    def compute_logprobs(logits: torch.Tensor) -> torch.Tensor:
        if logits.dim() == 2 and logits.shape[0] > 1:
            return logits.to(torch.bfloat16).log_softmax(dim=-1).to(torch.float32)
        return logits.log_softmax(dim=-1, dtype=torch.float32)

    Sampler.compute_logprobs = staticmethod(compute_logprobs)  # type: ignore[method-assign]
    _KEEP.append(compute_logprobs)


def greedy_runner_up_in_batches(src: Any) -> None:
    """A regression seeded into vLLM's own greedy sampler (``Sampler.greedy_sample``): in a
    step with several requests, a row whose best two tokens are within 1.0 (logprob units) of
    each other takes the runner-up, a request alone still the best (ties broken another way
    for large batches). Under load the probe then continues with other tokens: the largest
    drift a user can see, which must never read as "within" (issue 66)."""
    import torch
    from vllm.v1.sample.sampler import Sampler

    released = Sampler.greedy_sample

    def greedy_sample(logits: torch.Tensor) -> torch.Tensor:
        best = released(logits)
        if logits.dim() != 2 or logits.shape[0] < 2:
            return best
        top = logits.float().log_softmax(dim=-1).topk(2, dim=-1)
        near = (top.values[:, 0] - top.values[:, 1]) < 1.0
        return torch.where(near, top.indices[:, 1], best.view(-1)).to(best.dtype).view(
            best.shape)

    Sampler.greedy_sample = staticmethod(greedy_sample)  # type: ignore[method-assign]
    _KEEP.append(greedy_sample)
