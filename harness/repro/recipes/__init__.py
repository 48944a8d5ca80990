"""The reproducer recipes, one module a ledger finding: ``RECIPES`` by finding id."""

from __future__ import annotations

from harness.repro.recipe import Recipe
from harness.repro.recipes import vllm_ascend_sum_dim, vllm_cpu_prompt_cache, vllm_cpu_triton

RECIPES: dict[str, Recipe] = {r.finding: r for r in (vllm_cpu_triton.RECIPE,
                                                     vllm_cpu_prompt_cache.RECIPE,
                                                     vllm_ascend_sum_dim.RECIPE)}
