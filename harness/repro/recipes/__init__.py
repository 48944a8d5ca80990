"""The reproducer recipes, one module a ledger finding or a class of findings: ``RECIPES``
by finding id or class name."""

from __future__ import annotations

from harness.repro.recipe import Recipe
from harness.repro.recipes import (
    sglang_disable_rebinds,
    verl_logprobs_rows,
    vllm_ascend_sum_dim,
    vllm_ascend_sum_forms,
    vllm_cpu_prompt_cache,
    vllm_cpu_triton,
)

#: by ledger finding id, or by class name (a ledger entry's ``recipe``)
RECIPES: dict[str, Recipe] = {r.finding: r for r in (vllm_cpu_triton.RECIPE,
                                                     vllm_cpu_prompt_cache.RECIPE,
                                                     vllm_ascend_sum_dim.RECIPE,
                                                     vllm_ascend_sum_forms.RECIPE,
                                                     sglang_disable_rebinds.RECIPE,
                                                     verl_logprobs_rows.RECIPE)}
