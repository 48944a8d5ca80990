"""vllm-ascend-tensor-sum-dim: with the switch on, ``x.sum(dim=-1)`` on an NPU tensor does not
reach the batch-invariant reduce (only ``torch.sum`` was rebound, and only the default
``aten::sum`` overload registered). Needs an NPU and vllm-ascend's AscendC ops package."""

from __future__ import annotations

from collections.abc import Mapping

from harness.repro.recipe import Recipe, template

KERNEL = "batch_invariant_ops::npu_reduce_sum_batch_invariant"

_SCRIPT = '''"""Reproducer: vllm-ascend's batch-invariant mode, Tensor.sum(dim=-1) on an NPU
does not run npu_reduce_sum_batch_invariant (torch.sum(x, -1) does).

Exit 1 while the bug is there, 0 when fixed, 2 when this script cannot reach the point
(the ops package missing, or the switch did not take), 77 on a machine without an NPU.

Inputs: a float32 NPU tensor of {rows} x {cols} small integers; the switch as vllm-ascend's
init turns it on with VLLM_BATCH_INVARIANT=1 (enable_batch_invariant_mode(), its config
overrides aside); the ops each call runs, read with torch.profiler (nested calls included).
"""
import os
import sys

KERNEL = {kernel!r}
ROWS, COLS = {rows}, {cols}


def ran(torch, call):
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        call()
    return sum(1 for e in prof.events() if e.name == KERNEL)


def main():
{npu_boundary}    os.environ["VLLM_BATCH_INVARIANT"] = "1"
    try:
        import batch_invariant_ops  # noqa: F401 - vllm-ascend's AscendC ops package
        from vllm_ascend import batch_invariant
    except ImportError as exc:
        print(f"cannot run: {{exc}} (vllm-ascend and its AscendC ops package, see "
              "requirements.txt)")
        return 2
    batch_invariant.enable_batch_invariant_mode()
    x = (torch.arange(ROWS * COLS) % 7 - 3).reshape(ROWS, COLS).float().npu()
    via_function = ran(torch, lambda: torch.sum(x, -1))
    via_method = ran(torch, lambda: x.sum(dim=-1))
    print(f"vllm-ascend batch-invariant mode on; {{KERNEL}} ran {{via_function}} time(s) for "
          f"torch.sum(x, -1) and {{via_method}} time(s) for x.sum(dim=-1)")
    print("expected: both forms run the batch-invariant reduce")
    if via_function == 0:
        print("cannot reach the finding: torch.sum(x, -1) does not run it either (the switch "
              "did not take)")
        return 2
    if via_method == 0:
        print("observed: x.sum(dim=-1) runs the NPU's own reduce (aten::sum.dim_IntList)")
        return 1
    print("observed: both forms run it")
    return 0
'''


def script(params: Mapping[str, int]) -> str:
    return template(_SCRIPT)({**params, "kernel": KERNEL})


def requirements(versions: Mapping[str, str]) -> list[str]:
    """The release and its pairing, as the results file's manifest has them; torch and
    torch_npu as the Ascend image ships them (never replaced)."""
    lines = [f"vllm-ascend=={versions.get('vllm-ascend', '0.23.0.post1')}",
             f"vllm=={versions.get('vllm', '0.23.0')}"]
    for name in ("torch", "torch-npu"):
        if versions.get(name):
            lines.append(f"# {name}=={versions[name]}: as the Ascend image ships it")
    lines.append("# batch_invariant_ops: vllm-ascend's AscendC ops package, built outside "
                 "the wheel (csrc/build_batch_invariant_ops.sh; 910B and A3)")
    return lines


RECIPE = Recipe(
    finding="vllm-ascend-tensor-sum-dim", script=script, requirements=requirements,
    inputs="a float32 NPU tensor of small integers; the switch as vllm-ascend's init turns it "
           "on (enable_batch_invariant_mode); the ops each form runs, from torch.profiler",
    expected="x.sum(dim=-1) runs batch_invariant_ops::npu_reduce_sum_batch_invariant, as "
             "torch.sum(x, -1) does",
    observed="x.sum(dim=-1) dispatches aten::sum.dim_IntList to the NPU's own reduce",
    params={"rows": (4, 1), "cols": (32,)}, needs_npu=True)
