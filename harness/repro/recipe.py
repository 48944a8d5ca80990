"""A reproducer recipe: how one finding is reproduced without the harness (the script, its
requirements, inputs, control and shrinkable sizes)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

#: the last lines of every script: its exit status is its verdict
ENTRY = '\n\nif __name__ == "__main__":\n    sys.exit(main())\n'
#: the device boundary of a script that needs an NPU: 77 ("needs an NPU") only where no NPU
#: is there (torch_npu not installed, or no device); a torch_npu that is installed but fails
#: to import is the environment's error, said as such (2), never "needs an NPU"; never 0 or 1
NPU_BOUNDARY = """    import importlib.util
    if importlib.util.find_spec("torch_npu") is None:
        print("needs an NPU: torch_npu is not installed here")
        return 77
    try:
        import torch
        import torch_npu  # noqa: F401
    except Exception as exc:  # installed, and broken: CANN, the driver, a mismatched torch
        print("the environment's error: torch_npu is installed but it (or torch) fails to "
              f"import: {type(exc).__name__}: {exc}")
        return 2
    if not torch.npu.is_available():
        print("needs an NPU: torch_npu imports, and torch.npu.is_available() is False")
        return 77
"""


def template(text: str) -> Callable[[Mapping[str, int]], str]:
    """A recipe's ``script`` from a template: its parameters filled in, ``{npu_boundary}``
    replaced by ``NPU_BOUNDARY``, ``ENTRY`` at the end."""
    def script(params: Mapping[str, int]) -> str:
        return text.format(npu_boundary=NPU_BOUNDARY, **params) + ENTRY

    return script


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
