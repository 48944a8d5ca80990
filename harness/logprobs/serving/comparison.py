"""One serving case's comparisons: bit for bit, with the size of a difference kept for the
figures (``harness.drift``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from harness.drift.bits import abs_sum, compare_bits
from harness.logprobs.serving.loop import Served


@dataclass
class ServingReport:
    """One serving case: the comparisons, the measured condition, the verdict inputs."""

    prop: str
    source: str
    cases: int = 0
    #: (what was compared, first differing step, max ULP, differing count)
    mismatches: list[tuple[str, int, int, int]] = field(default_factory=list)
    condition: dict[str, Any] = field(default_factory=dict)
    vacuous: str = ""
    #: what is wrong whatever the switch (not a size: an entry that names another token)
    wrong: list[str] = field(default_factory=list)
    first_divergent_op: str | None = None
    first_divergence: str = ""
    #: prompt positions compared (prefix-cache's prompt-logprob comparisons)
    prompt_positions: int = 0
    #: the largest |diff| of a differing comparison, the sum of |diff| over every compared
    #: value and how many values: the size of a difference (``figures``)
    max_abs: float = 0.0
    abs_total: float = 0.0
    values: int = 0

    @property
    def equal(self) -> bool:
        return not self.mismatches

    def compare(self, what: str, ref: Served, got: Served) -> None:
        self.cases += 1
        if ref.tokens != got.tokens:
            first = next((i for i, (a, b) in enumerate(zip(ref.tokens, got.tokens,
                                                           strict=False)) if a != b), 0)
            self.mismatches.append((f"{what}: tokens", first, -1, 1))
            return
        found = self._measure(ref.logprobs, got.logprobs)
        if found is not None:
            first, _, ulp, count = found
            self.mismatches.append((what, first, ulp, count))
        if ref.prompt_logprobs is not None and got.prompt_logprobs is not None:
            self.compare_prompt(what, ref.prompt_logprobs, got.prompt_logprobs)

    def compare_prompt(self, what: str, ref: torch.Tensor, got: torch.Tensor) -> None:
        """The positions both have (the last ones: a run that read the cache has fewer). No
        position in common is nothing compared: vacuous, never equal."""
        n = min(len(ref), len(got))
        if not n and not self.vacuous:
            self.vacuous = (f"vacuous: {what}: no prompt position to compare (the two runs "
                            f"returned {len(ref)} and {len(got)} prompt logprobs)")
        self.prompt_positions = max(self.prompt_positions, n)
        found = self._measure(ref[len(ref) - n:], got[len(got) - n:]) if n else None
        if found is not None:
            first, _, ulp, count = found
            self.mismatches.append((f"{what}: prompt logprobs", first, ulp, count))

    def _measure(self, ref: torch.Tensor, got: torch.Tensor
                 ) -> tuple[int, float, int, int] | None:
        """``compare_bits``, with the size kept for the figures."""
        total, count = abs_sum(ref, got)
        self.abs_total += total
        self.values += count
        found = compare_bits(ref, got)
        if found is not None:
            self.max_abs = max(self.max_abs, found[1])
        return found

    def figures(self) -> dict[str, Any]:
        """The size of the difference (``harness.drift.figures``): changed greedy tokens are
        a figure of their own (``tokens_changed``; the first step where they changed is
        ``first_changed_step``, recorded), never a ULP of -1 read as "within". ``totals``:
        what each count counts out of."""
        flips = [m for m in self.mismatches if m[2] < 0]
        sized = [m[2] for m in self.mismatches if m[2] >= 0]
        return {"differing": len(self.mismatches),
                "max_ulp": max(sized, default=0),
                "max_abs": self.max_abs,
                "mean_abs": self.abs_total / self.values if self.values else 0.0,
                "tokens_changed": len(flips),
                **({"first_changed_step": min(m[1] for m in flips)} if flips else {}),
                "totals": {"differing": self.cases, "tokens_changed": self.cases}}

    def summary(self) -> dict[str, Any]:
        return {"figures": self.figures(), "property": self.prop, "source": self.source,
                "cases": self.cases,
                "differ": len(self.mismatches),
                "max_ulp": max((m[2] for m in self.mismatches if m[2] >= 0), default=0),
                "condition": self.condition, "vacuous": self.vacuous, "wrong": self.wrong,
                "first_divergent_op": self.first_divergent_op}

    def table(self) -> str:
        lines = [f"{self.prop} ({self.source}): {self.cases} comparisons, "
                 f"{len(self.mismatches)} differ; condition {self.condition}"]
        lines += [f"  {what}: first at step {step}, max {ulp} ULP, {n} values"
                  for what, step, ulp, n in self.mismatches]
        if self.first_divergence:
            lines.append(f"  first divergent op: {self.first_divergence}")
        return "\n".join(lines)
