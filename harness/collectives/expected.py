"""What each collective is expected to show on the size property, per backend and settings.

Repeat, rank agreement and gather exactness must always hold. The size property (a row's
result the same in a 1-row and an n-row message) is claimed by a switch for the collectives
its settings pin (HCCL_DETERMINISTIC=strict, NCCL's algorithm, protocol and channels): with
the switch's settings it must hold on HCCL and NCCL; without them it is recorded (the inverse
control). gloo reads none of those settings: its rows are what was measured here, so a
change either way is seen ("differ" that came out equal fails too: update the table)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

#: the measured gloo table (torch 2.13.0+cpu, 4 ranks, 2-core runner, 2026-12-05)
GLOO_MEASURED = {
    "all_reduce": ("differ", "torch 2.13.0+cpu gloo, 4 ranks: a row's all-reduced bits differ "
                   "between the row alone and every message of 2 to 512 rows, fp32 and bf16 "
                   "(measured 11 of 11 sizes; the row's summation order follows the message "
                   "size); on 2 ranks none differ (a 2-rank sum has one order)"),
    "reduce_scatter": ("equal", "torch 2.13.0+cpu gloo, 4 ranks: 0 of 11 sizes differ"),
}


@dataclass(frozen=True)
class Expectation:
    """``sizes``: "equal" (must hold), "differ" (must differ: a known property or the negative
    control) or "record" (no claim: measured and reported)."""

    sizes: str
    why: str


def expect(backend: str, collective: str, settings: str, world: int = 4) -> Expectation:
    if collective == "order_varying_all_reduce":
        return Expectation("differ", "the negative control: ranks summed in an order that "
                           "rotates with the message size")
    if collective in ("fixed_order_all_reduce", "all_gather"):
        return Expectation("equal", f"{collective} fixes every element's order (or moves bits "
                           "only), whatever the backend")
    if backend == "gloo" and collective in GLOO_MEASURED:
        if world != 4:
            return Expectation("record", f"gloo on {world} ranks: not measured (the table "
                               "holds 4 ranks); recorded")
        return Expectation(*GLOO_MEASURED[collective])
    if settings == "switch":
        return Expectation("equal", f"{backend} with the switch's collective settings: the "
                           "switch promises batch-invariant collectives")
    return Expectation("record", f"{backend} without the switch's settings: no claim (the "
                       "inverse control, recorded)")


def judge_sizes(reading: Any, expectation: Expectation) -> tuple[str, str]:
    """The size property's outcome ("pass", "fail", "xfail" or "record") and its message,
    from a ``properties.Reading`` (vacuity is judged before: see ``vacuous``)."""
    collective = reading.collective
    differing = reading.of("sizes")
    rows = "; ".join(reading.row(d) for d in reading.dtypes)
    if expectation.sizes == "equal" and differing:
        shown = [m.sentence(collective) for m in differing[:6]]
        more = [f"... {len(differing) - 6} more"] if len(differing) > 6 else []
        return "fail", (f"{collective} on {reading.world} ranks is not batch invariant "
                        f"({expectation.why}):\n- " + "\n- ".join(shown + more))
    if expectation.sizes == "differ":
        if not differing:
            return "fail", (f"{collective}: expected to differ across message sizes "
                            f"({expectation.why}), but every size gave the row's bits alone: "
                            "the table in harness/collectives/expected.py is out of date")
        return "xfail", f"{expectation.why}; here: {rows}"
    return ("record" if expectation.sizes == "record" else "pass"), rows


def vacuous(reading: Any, backend: str) -> str | None:
    """Why the size property proves nothing here (too few ranks to show order), or None."""
    from harness.collectives import ops

    if reading.collective not in ops.REDUCING or all(reading.order_shows.values()):
        return None
    return (f"vacuous: {reading.world} {backend} rank(s) cannot show summation order (a "
            "2-rank sum is the same in either order); the size property needs 3 or more "
            "ranks (NPU_REGRESS_COLLECTIVE_RANKS; without -n on an accelerator runner): "
            "not a pass")
