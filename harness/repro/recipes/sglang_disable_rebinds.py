"""sglang-disable-keeps-npu-rebinds: SGLang's ``disable_batch_invariant_mode()`` restores the
aten kernels and ``torch.bmm`` but not the four torch_npu functions its enable rebound on an
NPU. Needs an NPU (SGLang takes its NPU branch only there)."""

from __future__ import annotations

from collections.abc import Mapping

from harness.repro.recipe import Recipe, template

_SCRIPT = '''"""Reproducer: on an NPU, SGLang's disable_batch_invariant_mode() leaves torch_npu's
fused infer attention, its workspace helper and npu_add_rms_norm bound to the
batch-invariant versions that enable_batch_invariant_mode() put there.

Exit 1 while the bug is there, 0 when fixed, 2 when this script cannot reach the point
(SGLang missing, or enable rebound nothing), 77 on a machine without an NPU.

Inputs: none but the switch: the four functions' objects before enable, after enable, and
after disable, in one process (what a server that turns batch invariance off again has).
"""
import sys

NAMES = (
    "torch.ops.npu.npu_fused_infer_attention_score",
    "torch_npu.npu_fused_infer_attention_score",
    "torch_npu._npu_fused_infer_attention_score_get_max_workspace",
    "torch_npu.npu_add_rms_norm",
)


def bound(modules):
    found = {{}}
    for name in NAMES:
        head, _, attr = name.rpartition(".")
        found[name] = getattr(modules[head], attr)
    return found


def main():
{npu_boundary}    try:
        from sglang.srt.batch_invariant_ops import batch_invariant_ops as bio
    except ImportError as exc:
        print(f"cannot run: {{exc}} (see requirements.txt)")
        return 2
    modules = {{"torch.ops.npu": torch.ops.npu, "torch_npu": torch_npu}}
    before = bound(modules)
    bio.enable_batch_invariant_mode()
    rebound = [n for n, f in bound(modules).items() if f is not before[n]]
    bio.disable_batch_invariant_mode()
    after = bound(modules)
    print(f"sglang: enable_batch_invariant_mode() rebound {{len(rebound)}} of the "
          f"{{len(NAMES)}}: {{', '.join(rebound) or 'none'}}")
    if not rebound:
        print("cannot reach the finding: enable rebound none of them on this machine")
        return 2
    print("expected: after disable_batch_invariant_mode() each is torch_npu's own again")
    still = [n for n in rebound if after[n] is not before[n]]
    if still:
        for name in still:
            what = getattr(after[name], "__qualname__", after[name])
            print(f"observed: {{name}} is still {{what}}")
        return 1
    print("observed: every one is torch_npu's own again")
    return 0
'''


def requirements(versions: Mapping[str, str]) -> list[str]:
    """SGLang as the manifest has it; torch and torch_npu as the Ascend image ships them."""
    lines = [f"sglang=={versions.get('sglang', '0.5.23')}"]
    for name in ("torch", "torch-npu"):
        if versions.get(name):
            lines.append(f"# {name}=={versions[name]}: as the Ascend image ships it")
    return lines


RECIPE = Recipe(
    finding="sglang-disable-keeps-npu-rebinds", script=template(_SCRIPT), requirements=requirements,
    inputs="no tensors: the four torch_npu functions' objects before "
           "enable_batch_invariant_mode(), after it, and after disable_batch_invariant_mode(), "
           "in one process",
    expected="after disable_batch_invariant_mode() each function is torch_npu's own again",
    observed="torch.ops.npu.npu_fused_infer_attention_score, torch_npu's FIA, its workspace "
             "helper and npu_add_rms_norm stay the batch-invariant versions",
    needs_npu=True)
