"""What the switch-off inverse control must find, per source, device, machine and dtype.

The inverse control turns the switch off and looks for a difference across batch sizes. A
difference proves the sweep can see one. Finding none means one of two things: the default
path happens to be batch-invariant here (then the control has nothing to catch: an XFAIL
that says so), or the comparison or the sweep is broken (then it must fail). Which one is
decided by measurement, kept in one table with the figures that justify each entry; where
nothing was measured, the answer is "not known" and the case stays an XFAIL.
"""

from __future__ import annotations

import platform
from dataclasses import dataclass


@dataclass(frozen=True)
class InverseExpectation:
    #: True: known batch-variant without the switch, so "no difference" is a failure;
    #: None: not known to be variant, so "no difference" is an XFAIL
    variant: bool | None
    measured: str


#: (source, device kind, machine, dtype) -> what was measured there
INVERSE: dict[tuple[str, str, str, str], InverseExpectation] = {
    ("tiny", "cpu", "x86_64", "float32"): InverseExpectation(
        True, "measured on the CI CPU (2 cores of an AMD EPYC, AVX-512; torch 2.13.0): 22 of "
        "42 cases differ with the switch off (decode from batch size 2, prefill at batch "
        "sizes 3 and 4, up to 113 ULP): fp32 mm gives rows one result for M = 1..3 and "
        "another for M >= 4"),
    ("tiny", "cpu", "x86_64", "bfloat16"): InverseExpectation(
        None, "measured on the CI CPU (AVX512_BF16; torch 2.13.0): 0 of 42 cases differ, "
        "bf16 mm gave one result for every shape tried; a CPU without AVX512_BF16 may differ"),
}


def inverse_expectation(source: str, device_kind: str, dtype: str,
                        machine: str | None = None) -> InverseExpectation:
    """The table's entry, or "not known" naming what has no measurement."""
    machine = machine or platform.machine()
    found = INVERSE.get((source, device_kind, machine, dtype))
    if found is not None:
        return found
    return InverseExpectation(None, f"no measurement for {source} {dtype} on {device_kind} "
                                    f"({machine}) says it is batch-variant")


def judge_inverse(equal: bool, cases: int, source: str, device_kind: str, dtype: str,
                  machine: str | None = None) -> tuple[str, str]:
    """("passed" | "failed" | "xfailed", why) for one switch-off run."""
    if not equal:
        return "passed", "the switch-off run differs across batch sizes, as the control needs"
    expect = inverse_expectation(source, device_kind, dtype, machine)
    if expect.variant:
        return "failed", (
            f"inverse control found no difference in {cases} cases, but {source} {dtype} on "
            f"{device_kind} is known to be batch-variant without the switch ({expect.measured})"
            ": the comparison or the batch-size sweep is broken")
    return "xfailed", (
        f"inverse control found nothing to catch: {dtype} on this {device_kind} is "
        f"batch-invariant without the switch ({cases} cases equal; {expect.measured})")
