"""Ascend hardware versions on spoofed machines: the SoC table and its edges, device names,
npu-smi outputs, version strings, the IPC decision and failing sources; then the same table
against other implementations (verl, vllm-ascend) where installed. Every case runs in its
own child with an ``NpuSpoof``; the parent never sees the fake machine."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import pytest

from harness.hardware import NpuSpoof, get_npu_versions, ipc_support
from harness.hardware.conformance import (
    IMPLEMENTATIONS,
    UpstreamApiMoved,
    ask,
    complete_spoof,
    our_answer,
    soc_table_differences,
    torch_npu_soc_table,
)
from harness.hardware.disagreements import judge as judge_conformance


@dataclass(frozen=True)
class Case:
    id: str
    spoof: NpuSpoof
    #: expected NpuVersions fields (hardware by name)
    expect: dict[str, Any] = field(default_factory=dict)
    ipc: bool | None = None
    #: substrings the IPC reason / NONE reason / errors / disagreements must contain
    ipc_reason: str = ""
    reason: str = ""
    error: str = ""
    disagreement: str = ""
    device_id: int = 0
    #: conformance: the machine has no SoC number to ask for (an old torch_npu)
    no_soc_number: bool = False


def ipc_case(case_id: str, name: str, soc: int, hdk: str | None, cann: str, hardware: str,
             ipc: bool, reason: str = "") -> Case:
    """An IPC case: the HDK from the npu-smi board query, CANN from the install info."""
    spoof = NpuSpoof(device_name=name, soc_version=soc,
                     npu_smi_output=BOARD.format(hdk) if hdk else None,
                     install_info=f"version={cann}\n")
    return Case(case_id, spoof, {"hardware": hardware}, ipc=ipc, ipc_reason=reason)


def _soc_cases() -> list[Case]:
    table = {  # written out from torch_npu's SoC table (NpuVariables.h), not from ours
        "A1": [100, 101, 102, 103, 104], "ASCEND310P": [200, 201, 202, 203, 204, 205],
        "A2": [220, 221, 222, 223, 224, 225], "ASCEND310B": [240, 241, 242, 243],
        "A3": [250, 251, 252, 253, 254, 255, 256], "A5": [260],
        "UNKNOWN": [-1, 0, 99, 105, 199, 206, 219, 226, 239, 244, 249, 257, 259, 261, 999],
    }
    return [Case(f"soc-{n}", NpuSpoof(soc_version=n), {"hardware": family, "soc_version": n})
            for family, numbers in table.items() for n in numbers]


NAMES = {
    "Ascend910B1": "A2", "Ascend910B2C": "A2", "Ascend910B3": "A2", "Ascend910B4-1": "A2",
    "Ascend910B4_1": "A2", "Ascend910B": "A1", "Ascend910A": "A1", "Ascend910ProB": "A1",
    "Ascend910PremiumA": "A1", "Ascend910_9391": "A3", "Ascend910_9362": "A3",
    "Ascend950DT_958x": "A5", "Ascend950PR_9599": "A5", "Ascend910_9579": "A5",
    "Ascend310P3": "ASCEND310P", "Ascend310B1": "ASCEND310B", "Ascend910": "UNKNOWN",
    "Ascend910C": "UNKNOWN", "ascend910b3": "UNKNOWN", "GPU": "UNKNOWN",
    # a name rule is a prefix (or exact) rule, never a substring one: junk before a known
    # name, or after an exact one, is no chip we know
    "xAscend910B3": "UNKNOWN", "Atlas Ascend950PR": "UNKNOWN", "NPU-Ascend910_9391": "UNKNOWN",
    "Ascend910Bx": "UNKNOWN", "Ascend910Ax": "UNKNOWN", "Ascend310": "UNKNOWN",
    "": "NONE",  # an empty name is no answer: nothing identifies the chip
}

BOARD = "NPU ID : 0\n  Software Version : {}\n  Firmware Version : 7.7.0.1.231\n"
HEADER = ("+--------------------------------------------------------------+\n"
          "| npu-smi 26.0.rc1                 Version: 26.0.rc1             |\n")

CASES: list[Case] = [
    *_soc_cases(),
    *[Case(f"name-{n or 'empty'}", NpuSpoof(device_name=n), {"hardware": fam})
      for n, fam in NAMES.items()],
    # where the driver version comes from
    Case("smi-board", NpuSpoof(soc_version=223, npu_smi_output=BOARD.format("25.3.rc1.2")),
         {"driver_version": "25.3.rc1.2", "sources": {"soc_version":
          "torch_npu.npu.get_soc_version()", "driver_version": "npu-smi info -t board -i 0"}}),
    Case("smi-a3-die-fallback", NpuSpoof(
        soc_version=250, npu_smi_output={"info -t board -i 1": BOARD.format("25.5.0")}),
         {"driver_version": "25.5.0"}, device_id=3, error="npu-smi info -t board -i 3"),
    Case("smi-header-only", NpuSpoof(soc_version=223, npu_smi_output={"info": HEADER}),
         {"driver_version": "26.0.rc1"}),
    Case("smi-garbage-then-version-info", NpuSpoof(
        soc_version=223, npu_smi_output="segmentation fault (core dumped)\n",
        version_info="Version=24.1.rc1\nversion_dir=24.1.rc1\n"),
         {"driver_version": "24.1.rc1"}, error="npu-smi info (header): no value"),
    Case("smi-needs-privileges", NpuSpoof(soc_version=223, raise_on=("npu-smi",),
                                          version_info="Version=25.2.rc1\n"),
         {"driver_version": "25.2.rc1"}, error="Permission denied"),
    Case("no-driver-source", NpuSpoof(soc_version=223), {"driver_version": None}),
    Case("torch-npu-driver-answer", NpuSpoof(soc_version=223, driver_version="25.3.0",
                                             npu_smi_output=HEADER),
         {"driver_version": "25.3.0"}),
    # where the CANN version comes from
    Case("cann-from-torch-npu", NpuSpoof(soc_version=223, cann_version="8.5.0",
                                         install_info="version=8.1.RC1\n"),
         {"cann_version": "8.5.0"}),
    Case("cann-empty-below-8.1-falls-to-file", NpuSpoof(soc_version=223, cann_version="",
                                                         install_info="version=8.0.RC2\n"),
         {"cann_version": "8.0.RC2"}),
    Case("cann-file-garbage", NpuSpoof(soc_version=223, install_info="nothing here\n"),
         {"cann_version": None}),
    # the IPC decision
    ipc_case("ipc-a5-pod-hdk-25.1", "Ascend950PR_9599", 260, "25.1.rc1", "9.0.0", "A5", True,
             "A5"),
    Case("ipc-a5-950dt", NpuSpoof(device_name="Ascend950DT_958x", soc_version=260,
                                  version_info="Version=25.7.0\n"),
         {"hardware": "A5"}, ipc=False, ipc_reason="950DT does not support IPC yet"),
    ipc_case("ipc-a2-hdk-25.2", "Ascend910B3", 223, "25.2.rc1", "8.3.rc1", "A2", False,
             "below 25.3.rc1"),
    ipc_case("ipc-a2-rc-build", "Ascend910B3", 223, "25.3.rc1.2", "8.3.RC1", "A2", True,
             "A2: driver 25.3.rc1.2 >= 25.3.rc1"),
    ipc_case("ipc-a3-t-build", "Ascend910_9391", 250, "25.5.t3.b001", "8.5.0", "A3", True),
    ipc_case("ipc-a3-old-cann", "Ascend910_9391", 250, "25.5.0", "8.2.rc1", "A3", False,
             "CANN 8.2.rc1"),
    ipc_case("ipc-garbage-driver", "Ascend910B3", 223, "unknown-build", "8.5.0", "A2", False,
             "'unknown-build' cannot be parsed"),
    ipc_case("ipc-unknown-driver", "Ascend910B3", 223, None, "8.5.0", "A2", False,
             "version is unknown"),
    Case("ipc-910a-class", NpuSpoof(device_name="Ascend910B", soc_version=104),
         {"hardware": "A1"}, ipc=False, ipc_reason="defined only for A2, A3 and A5"),
    # the 255/256 disagreement, made explicit
    Case("soc-256-torch-npu-vs-vllm-ascend", NpuSpoof(soc_version=256),
         {"hardware": "A3"}, disagreement="vllm-ascend's says unsupported (raises)"),
    Case("soc-255-all-agree", NpuSpoof(soc_version=255), {"hardware": "A3", "disagreements": []}),
    Case("name-and-number-disagree", NpuSpoof(device_name="Ascend910B3", soc_version=104),
         {"hardware": "A1"}, disagreement="the name 'Ascend910B3' means A2"),
    # failing sources
    Case("torch-npu-import-fails", NpuSpoof(raise_on=("import",)), {"hardware": "NONE"},
         ipc=False, reason="libascendcl.so", ipc_reason="no NPU"),
    Case("soc-query-raises-name-decides", NpuSpoof(device_name="Ascend910B3", soc_version=223,
                                                   raise_on=("get_soc_version",)),
         {"hardware": "A2", "soc_version": None}, reason="decided by the device name",
         error="get_soc_version failed"),
    Case("all-device-queries-raise", NpuSpoof(device_name="Ascend910B3", soc_version=223,
                                              raise_on=("get_soc_version", "get_device_name")),
         {"hardware": "NONE"}, ipc=False, reason="neither the SoC number nor the device name"),
    Case("old-torch-npu-without-get-soc-version", NpuSpoof(device_name="Ascend910_9391"),
         {"hardware": "A3"}, error="AttributeError", no_soc_number=True),
]


def probe(device_id: int) -> tuple[dict[str, Any], dict[str, Any]]:
    versions = get_npu_versions(device_id)
    return versions.to_dict(), asdict(ipc_support(versions))


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_hardware(case: Case, run_on_npu, record_property) -> None:  # type: ignore[no-untyped-def]
    versions, decision = run_on_npu(probe, case.device_id, spoof=case.spoof).value
    record_property("npu_versions", versions)
    record_property("ipc_decision", decision)
    for key, want in case.expect.items():
        have = versions[key] if key != "disagreements" else list(versions[key])
        if key == "sources":
            have = {k: v for k, v in have.items() if k in want}
        assert have == want, f"{key}: got {have!r}, expected {want!r}\n{versions}"
    if case.ipc is not None:
        assert decision["supported"] is case.ipc, decision
    assert case.ipc_reason in decision["reason"], decision
    assert case.reason in versions["reason"], versions
    assert not case.error or any(case.error in e for e in versions["errors"]), versions["errors"]
    assert not case.disagreement or any(case.disagreement in d for d in
                                        versions["disagreements"]), versions["disagreements"]


CONFORMANCE = [c for c in CASES if c.spoof.raise_on == ()]


def conform(impl: str, device_id: int, soc_version: int | None,
            soc_name: str | None) -> dict[str, Any]:
    """Child side, under the completed spoof: our detection, then theirs on the same machine."""
    versions = get_npu_versions(device_id)
    driver, cann = versions.driver_version, versions.cann_version
    return {"ours": our_answer(soc_version, soc_name, driver, cann),
            "theirs": ask(impl, soc_version, driver, cann)}


@pytest.mark.parametrize("impl", sorted(IMPLEMENTATIONS))
@pytest.mark.parametrize("case", CONFORMANCE, ids=[c.id for c in CONFORMANCE])
def test_conformance(case: Case, impl: str, run_on_npu, record_property) -> None:  # type: ignore[no-untyped-def]
    """The released implementation against ours on the same (fully answered) machine: each
    difference must be a known disagreement, whose reason is recorded; any other fails."""
    missing = IMPLEMENTATIONS[impl].installed()
    if missing:
        pytest.skip(f"conformance with {impl}: {missing}")
    spoof = complete_spoof(case.spoof, soc_from_name=not case.no_soc_number)
    try:
        answers = run_on_npu(conform, impl, case.device_id, spoof.soc_version,
                             spoof.device_name, spoof=spoof).value
    except UpstreamApiMoved as drift:
        record_property("upstream_drift", drift.args[0])
        pytest.fail(drift.args[0], pytrace=False)
    ours, theirs = answers["ours"], answers["theirs"]
    problems, reasons = judge_conformance(impl, case.id, ours, theirs)
    record_property("conformance", {"impl": impl, "ours": ours, "theirs": theirs,
                                    "known_disagreements": reasons})
    assert not problems, f"{impl} on {case.id}:\n- " + "\n- ".join(problems)


def test_torch_npu_soc_table(record_property) -> None:  # type: ignore[no-untyped-def]
    """torch_npu's own SoC enum (NpuVariables.h of the installed torch_npu, or of the
    upstream set's torch-npu wheel) is the table the spoofs and the hardware table know: a
    SoC that torch_npu adds or renames fails here, naming it, before a board shows it."""
    found = torch_npu_soc_table()
    if found is None:
        pytest.skip("no torch_npu sources: install torch_npu, or bash ci/setup.sh --upstream "
                    "(unpacks the torch-npu wheel's headers)")
    table, source = found
    record_property("torch_npu_soc_table", {"source": source, "socs": len(table)})
    release = source.split(" (", 1)[0].removeprefix("torch-npu ")
    problems = soc_table_differences(table, release)
    assert not problems, f"torch_npu's SocVersion ({source}):\n- " + "\n- ".join(problems)
