"""Conformance against the released verl and vllm-ascend code (the upstream set that
``bash ci/setup.sh --upstream`` installs): raising implementations give answers, known
disagreements pass with their reason, new ones fail, and a renamed upstream symbol is named
as an upstream change. The broken implementations here are negative controls."""

from __future__ import annotations

import pytest

from harness import run_isolated
from harness.hardware import NpuSpoof
from harness.hardware.conformance import (
    IMPLEMENTATIONS,
    VERL,
    VLLM_ASCEND_HARDWARE,
    VLLM_ASCEND_UTILS,
    UpstreamApiMoved,
    ask,
    complete_spoof,
    our_answer,
    release,
)
from harness.hardware.disagreements import judge


def _needs(*impls: str) -> None:
    for name in impls:
        missing = IMPLEMENTATIONS[name].installed()
        if missing:
            pytest.skip(f"{missing} (bash ci/setup.sh --upstream installs the upstream set)")


def _conform(impl: str, spoof: NpuSpoof) -> tuple[dict, dict]:  # type: ignore[type-arg]
    def both(impl: str, soc: int | None, name: str | None) -> tuple[dict, dict]:  # type: ignore[type-arg]
        from harness.hardware import get_npu_versions

        v = get_npu_versions(0)
        return (our_answer(soc, name, v.driver_version, v.cann_version),
                ask(impl, soc, v.driver_version, v.cann_version))

    full = complete_spoof(spoof)
    return run_isolated(both, impl, full.soc_version, full.device_name, spoof=full,
                        method="forkserver").value


def test_the_upstream_set_is_the_pinned_one() -> None:
    _needs("verl", "vllm_ascend")
    assert release("verl") == "verl 0.9.1"
    assert release("vllm-ascend") == "vllm-ascend 0.23.0.post1"
    assert release("vllm") == "vllm 0.23.0"  # vllm-ascend 0.23.0.post1's own pairing
    # the later layout is not in 0.23.0.post1: its cases skip naming the release
    assert VLLM_ASCEND_HARDWARE.installed() == (
        "vllm-ascend 0.23.0.post1 has no vllm_ascend.device.hardware (this layout is not in "
        "that release)")


def test_real_implementations_agree_where_they_should() -> None:
    _needs("verl", "vllm_ascend")
    ours, theirs = _conform("verl", NpuSpoof(soc_version=223))
    assert theirs == {"hardware": "A2", "ipc_by_versions": True} and ours == theirs
    ours, theirs = _conform("vllm_ascend", NpuSpoof(soc_version=260))
    assert theirs == {"hardware": "A5"}


def test_a_raising_implementation_gives_an_answer() -> None:
    """verl raises where npu-smi's board query fails: that is its answer, never a crash."""
    _needs("verl")
    header = "| npu-smi 26.0.rc1                 Version: 26.0.rc1             |\n"
    spoof = NpuSpoof(soc_version=223, npu_smi_output={"info": header})
    ours, theirs = _conform("verl", spoof)
    assert theirs["hardware"].startswith(
        "raises CalledProcessError: Command '['npu-smi', 'info', '-t', 'board', '-i', '1']'")
    problems, reasons = judge("verl", "smi-header-only", ours, theirs)
    assert problems == [] and "board -i 1" in reasons["hardware"]


def test_known_disagreement_passes_with_its_reason_and_a_new_one_fails() -> None:
    _needs("vllm_ascend")
    ours, theirs = _conform("vllm_ascend", NpuSpoof(soc_version=256))
    assert theirs == {"hardware": "raises RuntimeError: Can not support soc_version: 256."}
    problems, reasons = judge("vllm_ascend", "soc-256", ours, theirs)
    assert problems == [] and "stops at 255" in reasons["hardware"]
    # the same answer on a case where nobody listed it: new drift
    problems, _ = judge("vllm_ascend", "soc-223", {"hardware": "A2"}, theirs)
    assert problems == ["hardware: ours 'A2', theirs 'raises RuntimeError: Can not support "
                        "soc_version: 256.': not a known disagreement (new upstream change)"]


def test_a_listed_disagreement_that_went_away_fails() -> None:
    problems, _ = judge("vllm_ascend", "soc-256", {"hardware": "A3"}, {"hardware": "A3"})
    assert problems and problems[0].startswith("vllm_ascend no longer disagrees on hardware")


def _broken_vllm_ascend(soc: int) -> dict:  # type: ignore[type-arg]
    """Negative control: the real module, with its mapping changed for SoC 223 only."""
    import vllm_ascend.utils as utils

    real = utils.check_ascend_device_type

    def drifted() -> None:
        import torch_npu

        if torch_npu.npu.get_soc_version() == 223:
            utils._ascend_device_type == utils.AscendDeviceType.A3  # noqa: B015 - the capture
            return None
        return real()

    utils.check_ascend_device_type = drifted
    return ask("vllm_ascend", soc, None, None)


def test_an_implementation_that_starts_disagreeing_on_one_soc_fails() -> None:
    _needs("vllm_ascend")
    spoof = complete_spoof(NpuSpoof(soc_version=223))
    theirs = run_isolated(_broken_vllm_ascend, 223, spoof=spoof, method="forkserver").value
    assert theirs == {"hardware": "A3"}
    problems, _ = judge("vllm_ascend", "soc-223", {"hardware": "A2"}, theirs)
    assert problems == ["hardware: ours 'A2', theirs 'A3': not a known disagreement (new "
                        "upstream change)"]
    other = run_isolated(_broken_vllm_ascend, 224, spoof=complete_spoof(NpuSpoof(soc_version=224)),
                         method="forkserver").value
    assert judge("vllm_ascend", "soc-224", {"hardware": "A2"}, other) == ([], {})


def _renamed() -> None:
    import vllm_ascend.utils as utils

    utils._ascend_device_type_v2 = utils.__dict__.pop("_ascend_device_type")
    VLLM_ASCEND_UTILS.load()


def test_a_renamed_private_symbol_is_upstream_drift() -> None:
    _needs("vllm_ascend")
    with pytest.raises(UpstreamApiMoved) as caught:
        run_isolated(_renamed, spoof=complete_spoof(NpuSpoof(soc_version=223)),
                     method="forkserver")
    assert caught.value.args[0] == ("upstream API moved: vllm-ascend 0.23.0.post1 has no "
                                    "vllm_ascend.utils._ascend_device_type")


def test_verl_loads_without_its_package_init() -> None:
    """verl/__init__ imports ray and tensordict; verl.utils.device needs neither."""
    _needs("verl")

    def load() -> tuple[bool, bool]:
        import sys

        VERL.load()
        return "ray" in sys.modules, "verl.utils.device" in sys.modules

    assert run_isolated(load, method="forkserver").value == (False, True)


def test_complete_spoof_answers_every_source() -> None:
    full = complete_spoof(NpuSpoof(soc_version=223))
    assert (full.device_name, full.soc_version) == ("Ascend910B3", 223)
    assert "Software Version : 25.3.rc1.2" in full.npu_smi_output
    assert full.install_info == "version=8.3.RC1\n"
    assert complete_spoof(NpuSpoof(device_name="Ascend950DT_958x")).soc_version == 260
    assert complete_spoof(NpuSpoof(device_name="Ascend910_9391"),
                          soc_from_name=False).soc_version is None
    board_one = {"info -t board -i 1": "x"}
    assert complete_spoof(NpuSpoof(npu_smi_output=board_one)).npu_smi_output == board_one


def test_the_results_header_names_the_upstream_set(pytester: pytest.Pytester) -> None:
    """vllm-ascend's sources carry no dist-info: the header reads their _version.py."""
    import json

    _needs("verl", "vllm_ascend")
    pytester.makepyfile("def test_x():\n    pass\n")
    out = pytester.path / "r.jsonl"
    pytester.runpytest("--harness-results", str(out)).assert_outcomes(passed=1)
    header = json.loads(out.read_text().splitlines()[0])
    assert {k: header["packages"][k] for k in ("vllm", "vllm_ascend", "verl", "torch_npu")} == {
        "vllm": "0.23.0", "vllm_ascend": "0.23.0.post1", "verl": "0.9.1", "torch_npu": None}
    assert header["stack"]["profile"]["name"] == "default"
    assert header["stack"]["pairing"]["supported"] is True


HEADER = """namespace c10_npu {
enum class SocVersion {
  UnsupportedSocVersion = -1,
  Ascend910PremiumA = 100,
  Ascend910ProA,  // a comment
  Ascend950 = 0x104
};
}"""


def test_soc_enum_follows_cpp_rules() -> None:
    from harness.hardware.conformance import parse_soc_enum

    assert parse_soc_enum(HEADER) == {100: "Ascend910PremiumA", 101: "Ascend910ProA",
                                      260: "Ascend950"}
    with pytest.raises(ValueError, match="no 'enum class SocVersion'"):
        parse_soc_enum("enum Other { A = 1 };")


def test_a_soc_that_torch_npu_adds_or_renames_is_named() -> None:
    """Negative control for the suite's torch_npu table check."""
    from harness.hardware.conformance import SOC_NAMES, soc_table_differences

    table = {**SOC_NAMES, 260: "Ascend950"}
    assert soc_table_differences(table) == []
    table[257] = "Ascend910_9364"
    table[225] = "Ascend910B4_2"
    del table[104]
    assert soc_table_differences(table) == [
        "SoC 257 (Ascend910_9364) is new: the spoofs and the hardware table lack it",
        "SoC 104 (Ascend910B) is gone from torch_npu's table",
        "SoC 225 is Ascend910B4_2 in torch_npu, Ascend910B4_1 in the spoofs"]


def test_the_upstream_torch_npu_table_is_read_from_its_header() -> None:
    from harness.hardware.conformance import soc_table_differences, torch_npu_soc_table

    found = torch_npu_soc_table()
    if found is None:
        pytest.skip("no torch_npu sources (bash ci/setup.sh --upstream)")
    table, source = found
    # the default profile's torch-npu (vllm-ascend 0.23.0.post1's matrix): 2.10.0.post4,
    # which predates SoC 256 (Ascend910_9363, torch_npu v2.12.0)
    assert source.startswith("torch-npu 2.10.0.post4 (") and source.endswith("NpuVariables.h)")
    assert 256 not in table and table[260] == "Ascend950" and table[255] == "Ascend910_9362"
    assert soc_table_differences(table, "2.10.0.post4") == []
    assert soc_table_differences(table) == [
        "SoC 256 (Ascend910_9363) is gone from torch_npu's table"]
