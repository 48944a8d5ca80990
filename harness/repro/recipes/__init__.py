"""The reproducer recipes, one module a ledger finding or a class of findings: ``RECIPES``
by finding id or class name."""

from __future__ import annotations

from harness.repro.recipe import Recipe
from harness.repro.recipes import (
    sglang_disable_rebinds,
    verl_glm52_comment,
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
                                                     verl_glm52_comment.RECIPE,
                                                     verl_logprobs_rows.RECIPE)}

#: findings no standalone script reproduces yet, and why (``npu-regress repro`` says it)
NOT_STANDALONE: dict[str, str] = {
    "verl-glm52-ascend-text-probes":
        "the seeded change of meaning is made in vllm-ascend 0.23.0.post1's released sources, "
        "which import torch_npu and vllm-ascend's ops at module level: on a machine with an NPU "
        "a script could edit the installed files; here they import only through the harness's "
        "torch_npu stand-in",
    "verl-glm52-vllm-already-present-probes":
        "it needs verl 0.9.1 beside vLLM 0.24.0 (verl's own vllm extra), whose wheel declares "
        "torch==2.11.0: a fresh venv of those requirements cannot be made on a CPU runner "
        "(torch 2.13.0+cpu only), and the verl profile installs them only with its written "
        "deviations (ci/profiles/verl.toml); no script is written that was not run",
}
