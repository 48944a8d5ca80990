"""The reproducer recipes, one module a ledger finding: ``RECIPES`` by finding id."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Recipe:
    """How to reproduce one finding without the harness."""

    finding: str
    #: the script's text for these parameter values (``params``' first values: the case's)
    script: Callable[[Mapping[str, int]], str]
    #: requirement lines from the stack manifest's versions ({distribution: version})
    requirements: Callable[[Mapping[str, str]], list[str]]
    #: what the script feeds the stack, a sentence for the issue
    inputs: str
    expected: str
    observed: str
    #: shrinkable parameters, each with its values from the case's down to the smallest
    #: worth trying (``npu-regress repro --shrink`` keeps the smallest that still fails)
    params: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    #: the script needs an NPU: without one it exits ``NEEDS_NPU``
    needs_npu: bool = False
    #: the arguments that run the script's control (the same stack and inputs, the switch
    #: off), which must exit ``FIXED``: a script that cannot pass proves nothing
    control: tuple[str, ...] = ()

    def defaults(self) -> dict[str, int]:
        return {name: values[0] for name, values in self.params.items()}


def _load() -> dict[str, Recipe]:
    from harness.repro.recipes import vllm_ascend_sum_dim, vllm_cpu_triton

    return {r.finding: r for r in (vllm_cpu_triton.RECIPE, vllm_ascend_sum_dim.RECIPE)}


RECIPES: dict[str, Recipe] = _load()
