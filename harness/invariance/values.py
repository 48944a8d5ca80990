"""Values, not only events: with the switch on, each override gives a row the same bits
at batch size 1 and inside batches of other sizes, at any position.

The op checks (``harness.invariance.switch``) use small integers, exact in bf16 and fp32:
any reduction order gives the same bits there, so an override that splits its reduction by
batch size passes them. These cases use seeded random floats of the op's dtypes, where the
order of a reduction changes the last bits, and compare bit for bit: the probe row computed
alone (batch size 1) against the same row at the first, a middle and the last position of
batches of ``BATCHES`` rows.
"""

from __future__ import annotations

from typing import Any

#: value case -> the overridden operator it exercises (``declared.toml`` names) and the call
VALUE_OPS = {
    "mm": ("aten::mm", "torch.mm(x, w)"),
    "matmul": ("aten::matmul", "torch.matmul(x, w) with x of 3 dims"),
    "sum": ("aten::sum", "torch.sum(x, dim=-1)"),
    "log_softmax": ("aten::_log_softmax", "torch.log_softmax(x, dim=-1)"),
    "mean": ("aten::mean.dim", "x.mean(dim=-1)"),
}
BATCHES = (2, 7, 32)
DTYPES = ("float32", "bfloat16")
#: columns of a row: long enough that a split reduction rounds differently
WIDTH = 256


def applies(target: Any, case: str) -> str | None:
    """Why ``case`` does not apply to ``target`` (the skip reason), or None."""
    ops = target.declared().ops
    if ops is None:
        return f"{target.name} declares no operator set (harness/invariance/declared.toml)"
    op = VALUE_OPS[case][0]
    rebound = case == "sum" and "torch.sum" in target.declared().rebinds
    if op not in ops and not rebound:
        return f"{target.release()}'s switch does not override {op}"
    return None


def inputs(case: str, dtype: str, seed: int = 0) -> dict[str, Any]:
    """Seeded random floats (CPU, made in the parent): ``rows`` (the probe row first), and
    the weight of the matmul cases."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    kind = getattr(torch, dtype)
    rows = torch.randn(max(BATCHES), WIDTH, generator=gen)
    out = {"rows": rows.to(kind)}
    if case in ("mm", "matmul"):
        out["w"] = (torch.randn(WIDTH, 64, generator=gen) / WIDTH ** 0.5).to(kind)
    return out


def _call(case: str, x: Any, w: Any) -> Any:
    import torch

    if case == "mm":
        return torch.mm(x, w)
    if case == "matmul":
        return torch.matmul(x.unsqueeze(0), w)[0]
    if case == "sum":
        return torch.sum(x, dim=-1)
    if case == "log_softmax":
        return torch.log_softmax(x, dim=-1)
    return x.mean(dim=-1)


def _ulps(a: Any, b: Any) -> int:
    """The largest distance in units in the last place between two float tensors."""
    import torch

    view = {torch.float32: torch.int32, torch.bfloat16: torch.int16,
            torch.float16: torch.int16}[a.dtype]
    return int((a.contiguous().view(view).long() - b.contiguous().view(view).long())
               .abs().max().item())


def run_value_case(target: Any, case: str, cases: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Child side: the switch on, then for each dtype the probe row alone and inside each
    batch; the positions whose bits differ."""
    import torch

    from harness.invariance import get_target

    tgt = get_target(target) if isinstance(target, str) else target
    dev = tgt.device()
    tgt.load()
    tgt.set_switch(True)
    differs: list[dict[str, Any]] = []
    for dtype, data in cases.items():
        rows = data["rows"].to(dev)
        w = data["w"].to(dev) if "w" in data else None
        alone = _call(case, rows[:1], w).float().cpu()[0]
        for size in BATCHES:
            for pos in sorted({0, size // 2, size - 1}):
                others = rows[1:size]
                batch = torch.cat([others[:pos], rows[:1], others[pos:]])
                got = _call(case, batch, w).float().cpu()[pos]
                if not torch.equal(got, alone):
                    differs.append({"dtype": dtype, "batch": size, "position": pos,
                                    "max_abs": float((got - alone).abs().max()),
                                    "ulps": _ulps(got.to(getattr(torch, dtype)),
                                                  alone.to(getattr(torch, dtype)))})
    return {"enabled_by_identity": tgt.is_enabled(), "differs": differs}


def judge(target: Any, case: str, got: dict[str, Any]) -> list[str]:
    """Parent side: every batch that changed the probe row's bits, in one sentence each."""
    op, call = VALUE_OPS[case]
    problems = []
    if not got["enabled_by_identity"]:
        problems.append(f"{target.release()} is off by identity with the switch on")
    for d in got["differs"]:
        problems.append(
            f"with the switch on, {target.release()}'s {op} is batch-variant: {call} gives "
            f"the probe row other bits at position {d['position']} of a batch of {d['batch']} "
            f"than alone ({d['dtype']}, max |diff| {d['max_abs']:.3g}, {d['ulps']} ULP)")
    return problems
