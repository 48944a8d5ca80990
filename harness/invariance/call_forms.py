"""Every call form keeps working with the switch on: a switch that routes a form to a kernel
that cannot take it breaks users' code, not only invariance.

vllm-ascend's later ``Tensor.sum`` rebinding (PR #14949) sent every NPU ``.sum()`` to the
reduce-sum kernel, which takes the last dimension only: ``.sum(dim=0)`` raised ``EZ1001``
and killed every TP worker until PR #16413. The op checks call ``.sum(-1)`` only. So for
each overridden operator, the forms users write (no dim, ``dim=0``, ``dim=-1``, a dim tuple,
``keepdim``, ``dtype=``, the method and the function, ``out=``) run with the switch off and
on, in two children, on small-integer inputs (exact in any order of reduction); "on" must
give what "off" gives, bit for bit, and raise only where "off" raises. The stand-in ops
package enforces the real kernels' documented constraints
(``harness.invariance.standin``), so a form sent where the kernel cannot go fails on CPU as
it would on the NPU.
"""

from __future__ import annotations

from typing import Any

#: value case (``harness.invariance.values.VALUE_OPS``) -> the forms, as Python expressions
#: over ``x`` (4 x 32), ``a`` (8 x 16), ``b`` (16 x 12), ``a3`` (2 x 4 x 16)
FORMS: dict[str, tuple[str, ...]] = {
    "sum": ("torch.sum(x)", "torch.sum(x, 0)", "torch.sum(x, dim=0)", "torch.sum(x, -1)",
            "torch.sum(x, dim=(0, 1))", "torch.sum(x, -1, keepdim=True)",
            "torch.sum(x, -1, dtype=torch.float32)",
            "torch.sum(x, -1, out=torch.empty(4, dtype=x.dtype, device=x.device))",
            "x.sum()", "x.sum(0)", "x.sum(dim=-1)", "x.sum((0, 1))", "x.sum(-1, keepdim=True)",
            "x.sum(-1, dtype=torch.float32)"),
    "mm": ("torch.mm(a, b)", "a.mm(b)", "a @ b",
           "torch.mm(a, b, out=torch.empty(8, 12, dtype=a.dtype, device=a.device))"),
    "matmul": ("torch.matmul(a3, b)", "a3 @ b", "a3.matmul(b)", "torch.matmul(a3[0, 0], b)"),
    "log_softmax": ("torch.log_softmax(x.float(), -1)", "x.float().log_softmax(0)",
                    "torch.nn.functional.log_softmax(x, dim=-1, dtype=torch.float32)"),
    "mean": ("x.float().mean()", "x.float().mean(0)", "x.float().mean(-1, keepdim=True)",
             "torch.mean(x.float(), (0, 1))", "x.mean(-1, dtype=torch.float32)"),
}


def inputs() -> dict[str, Any]:
    """Small integers (``harness.invariance.switch.small_ints``): exact in any order."""
    from harness.invariance.switch import small_ints

    return {"x": small_ints(4, 32), "a": small_ints(8, 16), "b": small_ints(16, 12),
            "a3": small_ints(2, 4, 16)}


def run_forms(target: Any, case: str, enabled: bool, given: dict[str, Any]) -> dict[str, Any]:
    """Child side: the switch set, then each form of ``case``: its result (fp32, CPU) or
    the error it raised (type and first line)."""
    import torch

    from harness.invariance import get_target

    tgt = get_target(target) if isinstance(target, str) else target
    dev = tgt.device()
    names = {k: v.to(dev) for k, v in given.items()}
    tgt.load()
    tgt.set_switch(enabled)
    results: dict[str, Any] = {}
    for form in FORMS[case]:
        try:
            out = eval(form, {"torch": torch}, dict(names))  # noqa: S307 - our own forms
            results[form] = out.float().cpu()
        except Exception as exc:  # noqa: BLE001 - a form that raises is the finding
            results[form] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    return {"enabled_by_identity": tgt.is_enabled(), "results": results}


def judge(target: Any, case: str, off: dict[str, Any], on: dict[str, Any]) -> list[str]:
    """Parent side: each form whose result with the switch on is not its result with it
    off (an error where off returns, other values, another shape)."""
    import torch

    problems = []
    if not on["enabled_by_identity"]:
        problems.append(f"{target.release()} is off by identity with the switch on")
    for form in FORMS[case]:
        want, got = off["results"][form], on["results"][form]
        if isinstance(want, str):
            continue  # not a form torch itself takes here
        if isinstance(got, str):
            problems.append(f"with the switch on, {target.release()}: `{form}` raised {got} "
                            f"(off, it returns a {tuple(want.shape)} tensor)")
        elif got.shape != want.shape:
            problems.append(f"with the switch on, {target.release()}: `{form}` returns shape "
                            f"{tuple(got.shape)}, off {tuple(want.shape)}")
        elif not torch.equal(got, want) and not (
                case == "log_softmax" and torch.allclose(got, want, rtol=1e-5, atol=1e-6)):
            problems.append(f"with the switch on, {target.release()}: `{form}` differs from its "
                            f"result off (max |diff| {(got - want).abs().max().item():.3g})")
    return problems
