"""A reproducer recipe: how one finding is reproduced without the harness (the script, its
requirements, inputs, control and shrinkable sizes)."""

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
    #: pip commands after ``pip install -r requirements.txt`` (each an argument list), and
    #: why: what the release's declared install needs on this kind of machine
    after_install: tuple[tuple[str, ...], ...] = ()
    after_install_why: str = ""
    #: a recipe for a class of findings, named by a ledger entry's ``recipe`` (``finding``
    #: is then the class's name, not a ledger id)
    for_class: bool = False

    def defaults(self) -> dict[str, int]:
        return {name: values[0] for name, values in self.params.items()}
