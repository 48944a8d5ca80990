"""The figures a drift is measured in, by name: every judged figure grows with the drift
(a smaller one is never a regression), so an envelope needs only an upper bound.

Counted figures (cases, ULP) are whole numbers: their envelope keeps one unit of slack above
the measured maximum, since 1 ULP against 2 is rounding, not a regression."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

#: name -> what it is (the failure text and the docs use these words)
JUDGED: dict[str, str] = {
    "differing": "comparisons that differ",
    "max_ulp": "largest distance in ULP",
    "max_abs": "largest |diff|",
    "mean_abs": "mean |diff| over every compared value",
    "not_bit_equal": "sampled tokens whose logprob is not bit-equal",
    "kl_max": "largest KL(rollout || training) of a full next-token distribution",
    "kl_mean": "mean KL(rollout || training) of the full next-token distributions",
    "k3_kl": "verl's k3 KL estimate (rollout_corr_helper.compute_offpolicy_metrics)",
    "log_ppl_abs_diff": "verl's |log perplexity difference| (compute_offpolicy_metrics)",
    "rollout_probs_diff_max": "verl's training/rollout_probs_diff_max",
    "rollout_probs_diff_mean": "verl's training/rollout_probs_diff_mean",
    "sizes_differing": "message sizes whose row differs from the row alone",
    "tokens_changed": "comparisons whose greedy tokens changed (another continuation)",
}
COUNTS = frozenset({"differing", "max_ulp", "not_bit_equal", "sizes_differing",
                    "tokens_changed"})
#: counts with no slack above the measured maximum: another continuation is the largest
#: drift a user can see, so a row measured with none fails on the first
EXACT = frozenset({"tokens_changed"})


def unusable(name: str, value: Any) -> str:
    """Why ``value`` is no size of figure ``name`` ("" when it is one): not a number, NaN,
    infinite or negative. Such a figure is never judged within, nor adopted."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return f"{name} is not a number ({value!r})"
    if math.isnan(value):
        return f"{name} is NaN"
    if math.isinf(value):
        return f"{name} is infinite"
    if value < 0:
        return f"{name} is negative ({value:g})"
    return ""


def judged(figures: Mapping[str, Any]) -> dict[str, float]:
    """The judged figures of a record, as numbers (others, and non-numbers, left out; the
    judge and the adopter ask ``unusable`` about those first)."""
    out: dict[str, float] = {}
    for name, value in figures.items():
        if name in JUDGED and isinstance(value, (int, float)) and not isinstance(value, bool):
            out[name] = value
    return out


def describe(name: str, value: float) -> str:
    """``max_ulp 200`` / ``max_abs 0.0201``: a figure as the failure text shows it."""
    shown = f"{int(value)}" if name in COUNTS and float(value).is_integer() else f"{value:.3g}"
    return f"{name} {shown}"
