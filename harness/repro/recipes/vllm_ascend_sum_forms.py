"""vllm-ascend-torch-sum-forms: with the switch on, ``torch.sum`` is vllm-ascend's
``reduce_sum(x, dim=None, keepdim=False)``: a dim other than the last reaches the last-dim-only
NPU kernel, a dim tuple is refused by its schema, and ``dtype=`` is a TypeError. Needs an NPU
and vllm-ascend's AscendC ops package."""

from __future__ import annotations

from harness.repro.recipe import Recipe, template
from harness.repro.recipes.vllm_ascend_sum_dim import requirements

_SCRIPT = '''"""Reproducer: vllm-ascend's batch-invariant mode rebinds torch.sum to reduce_sum, and
torch.sum(x, 0), torch.sum(x, dim=(0, 1)) and torch.sum(x, -1, dtype=torch.float32) on an NPU
tensor then raise (or miscompute) where torch's own sum returns the sum.

Exit 1 while the bug is there, 0 when fixed, 2 when this script cannot reach the point
(the ops package missing, or the switch did not take), 77 on a machine without an NPU.

Inputs: a float32 NPU tensor of {rows} x {cols} small integers (every sum is exact, so any
other value is wrong, not rounding); the switch as vllm-ascend's init turns it on with
VLLM_BATCH_INVARIANT=1 (enable_batch_invariant_mode()); each call form against the same sum
on the CPU, computed before the switch.
"""
import os
import sys

ROWS, COLS = {rows}, {cols}


def main():
{npu_boundary}    host = (torch.arange(ROWS * COLS) % 7 - 3).reshape(ROWS, COLS).float()
    forms = {{
        "torch.sum(x, 0)": (lambda t: torch.sum(t, 0), host.sum(0)),
        "torch.sum(x, dim=0)": (lambda t: torch.sum(t, dim=0), host.sum(0)),
        "torch.sum(x, dim=(0, 1))": (lambda t: torch.sum(t, dim=(0, 1)), host.sum((0, 1))),
        "torch.sum(x, -1, dtype=torch.float32)":
            (lambda t: torch.sum(t, -1, dtype=torch.float32), host.sum(-1)),
    }}
    os.environ["VLLM_BATCH_INVARIANT"] = "1"
    try:
        import batch_invariant_ops  # noqa: F401 - vllm-ascend's AscendC ops package
        from vllm_ascend import batch_invariant
    except ImportError as exc:
        print(f"cannot run: {{exc}} (vllm-ascend and its AscendC ops package, see "
              "requirements.txt)")
        return 2
    released = torch.sum
    batch_invariant.enable_batch_invariant_mode()
    if torch.sum is released:
        print("cannot reach the finding: torch.sum was not rebound (the switch did not take)")
        return 2
    x = host.npu()
    print("expected: every form returns torch's sum, as with the switch off")
    broken = 0
    for form, (call, want) in forms.items():
        try:
            got = call(x).cpu()
        except Exception as exc:  # the finding: the form is refused
            print(f"observed: {{form}} raised {{type(exc).__name__}}: {{exc}}")
            broken += 1
            continue
        if got.shape != want.shape or not torch.equal(got, want):
            print(f"observed: {{form}} returned {{got.tolist()}}, torch's sum is "
                  f"{{want.tolist()}}")
            broken += 1
    if broken:
        return 1
    print("observed: every form returned the sum")
    return 0
'''


RECIPE = Recipe(
    finding="vllm-ascend-torch-sum-forms", script=template(_SCRIPT), requirements=requirements,
    inputs="a float32 NPU tensor of small integers (exact sums); the switch as vllm-ascend's "
           "init turns it on (enable_batch_invariant_mode); four call forms of torch.sum "
           "against torch's own sum on the CPU",
    expected="torch.sum(x, 0), dim=0, dim=(0, 1) and dtype=torch.float32 return the sum, as "
             "with the switch off",
    observed="reduce_sum takes no dtype (TypeError), and sends a dim other than the last, or "
             "a tuple, to the last-dim-only NPU kernel, which refuses it",
    params={"rows": (4, 2), "cols": (32, 8)}, needs_npu=True)
