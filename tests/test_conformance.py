"""Conformance adapters against fake verl / vllm-ascend modules built from the facts file:
their known differences from our decisions must be reported, their agreements not."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from harness import run_isolated
from harness.conformance import VERL, VLLM_ASCEND, ask, differences, our_answer
from harness.hardware import NpuSpoof

FAKES = str(Path(__file__).parent / "fakes")


def ask_with_fakes(impl: str, soc: int | None, driver: str | None, cann: str | None):  # type: ignore[no-untyped-def]
    sys.path.insert(0, FAKES)
    return ask(impl, soc, driver, cann)


def compare(impl: str, spoof: NpuSpoof, driver: str | None = None,
            cann: str | None = None) -> list[str]:
    theirs = run_isolated(ask_with_fakes, impl, spoof.soc_version, driver, cann, spoof=spoof,
                          method="forkserver").value
    return differences(our_answer(spoof.soc_version, spoof.device_name, driver, cann), theirs)


def test_vllm_ascend_256_difference_is_reported() -> None:
    assert compare("vllm_ascend", NpuSpoof(soc_version=256)) == [
        "hardware: ours 'A3', theirs 'raises RuntimeError'"]
    assert compare("vllm_ascend", NpuSpoof(soc_version=255)) == []
    assert compare("vllm_ascend", NpuSpoof(soc_version=203)) == []


def test_verl_substring_guess_is_reported() -> None:
    spoof = NpuSpoof(device_name="Ascend910B")
    assert compare("verl", spoof, "25.3.rc1", "8.3.rc1") == [
        "hardware: ours 'A1', theirs 'A2'"]
    assert compare("verl", NpuSpoof(device_name="Ascend910B3"), "25.3.rc1.2", "8.3.rc1") == []


def test_verl_ipc_disagreements_by_version() -> None:
    spoof = NpuSpoof(device_name="Ascend910B3")
    assert compare("verl", spoof, "25.5.t3.b001", "8.5.0") == []
    diffs = compare("verl", spoof, "garbage", "8.5.0")
    assert diffs == ["ipc_by_versions: ours False, theirs \"raises RuntimeError: cannot parse "
                     "version 'garbage'\""]


def test_absent_implementations_name_the_package() -> None:
    assert VERL.installed() == "verl is not installed"
    assert VLLM_ASCEND.installed() == "vllm_ascend is not installed"


def test_locate_names_the_candidates() -> None:
    def locate():  # type: ignore[no-untyped-def]
        return VERL.locate()[1]

    assert run_isolated(locate).value == ("verl: none of verl.utils.device, verl.utils.npu_utils "
                                          "provides get_npu_versions, check_ipc_version_support")


@pytest.mark.parametrize("impl", ["verl", "vllm_ascend"])
def test_adapters_find_the_fakes(impl: str) -> None:
    assert compare(impl, NpuSpoof(device_name="Ascend910_9391", soc_version=250),
                   "25.5.0", "8.5.0") == []
