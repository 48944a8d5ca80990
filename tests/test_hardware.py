"""Hardware versions: pure rules, detection on this machine, spoof containment, and
negative controls that break each guarded rule and show the suite catching it."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from harness import run_isolated
from harness.hardware import (
    AscendHardwareVersion as HW,
)
from harness.hardware import (
    NpuSpoof,
    NpuVersions,
    get_npu_versions,
    ipc_support,
    parse_version,
    trim_version,
)

SUITE = Path(__file__).parent.parent / "suites" / "test_ascend_hardware.py"


def test_this_machine_is_none_with_the_reason() -> None:
    versions = get_npu_versions()
    assert versions.hardware is HW.NONE
    assert versions.reason == ("torch_npu is not usable: import torch_npu: ModuleNotFoundError: "
                               "No module named 'torch_npu'")
    assert ipc_support(versions).supported is False


@pytest.mark.parametrize("raw, trimmed", [
    ("25.3.rc1.2", "25.3.rc1"), ("25.5.t3.b001", "25.5"), ("8.3.RC1", "8.3.rc1"),
    ("8.5.0", "8.5.0"), ("26.0.rc1", "26.0.rc1"), ("garbage", ""), ("", ""), ("rc1", ""),
])
def test_trim(raw: str, trimmed: str) -> None:
    assert trim_version(raw) == trimmed


def test_parse_never_raises() -> None:
    assert parse_version("25.3.rc1.2") == parse_version("25.3.rc1")
    assert parse_version("25.3.0") > parse_version("25.3.rc1")
    assert parse_version("garbage") is None
    assert parse_version(None) is None


def test_enum_contract() -> None:
    assert (HW.NONE, HW.A2, HW.A3, HW.A5) == (0, 2, 3, 5)
    assert HW.MAX_VERSION is HW.UNKNOWN
    assert HW.from_soc_version(104) is HW.A1
    assert HW.from_soc_name("Ascend910B") is HW.A1
    assert HW.from_soc_name("Ascend910B3") is HW.A2


@pytest.mark.parametrize("name", ["xAscend910B3", "Atlas Ascend950PR", "NPU-Ascend910_9391",
                                  "Ascend910Bx", "Ascend910Ax", "Ascend310"])
def test_names_match_from_the_start_not_anywhere(name: str) -> None:
    assert HW.from_soc_name(name) is HW.UNKNOWN


def test_a5_is_ipc_capable_below_the_a2_a3_hdk_threshold() -> None:
    """A5 HDKs are numbered on their own (Pod 25.1, Server 25.6, PCIe 25.7): the A2/A3
    threshold (25.3.rc1) must not deny them, while 950DT has no IPC at all."""
    pod = NpuVersions(HW.A5, soc_version=260, soc_name="Ascend950PR_9599",
                      driver_version="25.1.rc1", cann_version="9.0.0")
    assert ipc_support(pod).supported is True
    assert "without the HDK check" in ipc_support(pod).reason
    a2_same_hdk = NpuVersions(HW.A2, soc_version=223, soc_name="Ascend910B3",
                              driver_version="25.1.rc1", cann_version="9.0.0")
    assert ipc_support(a2_same_hdk).supported is False
    dt = NpuVersions(HW.A5, soc_version=260, soc_name="Ascend950DT_958x",
                     driver_version="25.7.0", cann_version="9.0.0")
    assert ipc_support(dt).supported is False
    assert "950DT" in ipc_support(dt).reason


def test_a3_driver_comes_from_the_card_of_a_die() -> None:
    """On A3 one card holds two dies: device 3's board query is card 1 (3 // 2)."""
    board = "NPU ID : 1\n  Software Version : 25.5.0\n"

    def detect() -> NpuVersions:
        return get_npu_versions(3)

    spoof = NpuSpoof(soc_version=250, npu_smi_output={"info -t board -i 1": board})
    found = run_isolated(detect, spoof=spoof, method="forkserver").value
    assert (found.hardware, found.driver_version) == (HW.A3, "25.5.0")
    assert found.sources["driver_version"] == "npu-smi info -t board -i 1"
    assert any(e.startswith("npu-smi info -t board -i 3") for e in found.errors), found.errors


def test_ipc_garbage_names_the_string() -> None:
    d = ipc_support(NpuVersions(HW.A2, driver_version="v???", cann_version="8.5.0"))
    assert (d.supported, d.reason) == (False, "A2: the driver (HDK) version 'v???' cannot be parsed")


def test_spoof_never_reaches_the_parent() -> None:
    before_path = os.environ.get("PATH")

    def inside() -> tuple[str, str]:
        import torch_npu

        return torch_npu.npu.get_device_name(), os.environ["HARNESS_ASCEND_ROOT"]

    name, root = run_isolated(inside, spoof=NpuSpoof(device_name="Ascend910B3"),
                              method="forkserver").value
    assert name == "Ascend910B3"
    assert not Path(root).exists()  # the child cleaned up after itself
    assert "torch_npu" not in sys.modules
    assert os.environ.get("PATH") == before_path
    assert "HARNESS_ASCEND_ROOT" not in os.environ


def test_spoof_rejects_unknown_raise_on() -> None:
    with pytest.raises(ValueError, match=r"raise_on=\['get_everything'\]\): unknown"):
        NpuSpoof(raise_on=("get_everything",))


BREAKERS = {
    # a substring guess (verl-style): plain "Ascend910B" (910A class) read as A2
    "substring-names": (
        "import re, harness.hardware.versions as h\n"
        "h.SOC_NAME_RULES.insert(0, (re.compile(r'.*Ascend910B.*'), h.AscendHardwareVersion.A2))\n"
    ),
    # every name rule searched as a substring instead of matched from the start
    "substring-everywhere": (
        "import harness.hardware.versions as h\n"
        "def by_search(cls, name):\n"
        "    for pattern, family in h.SOC_NAME_RULES:\n"
        "        if pattern.search((name or '').strip()):\n"
        "            return family\n"
        "    return cls.UNKNOWN\n"
        "h.AscendHardwareVersion.from_soc_name = classmethod(by_search)\n"
    ),
    # A5 without its exemption: the Pod at HDK 25.1 loses IPC
    "no-a5-exemption": (
        "import harness.hardware.versions as h\n"
        "orig = h.ipc_support\n"
        "def no_a5(v):\n"
        "    if v.hardware == h.AscendHardwareVersion.A5:\n"
        "        v = h.NpuVersions(h.AscendHardwareVersion.A2, driver_version=v.driver_version,"
        " cann_version=v.cann_version)\n"
        "    return orig(v)\n"
        "fn.__globals__['ipc_support'] = no_a5  # the suite imported it by name\n"
    ),
    # no trimming: '25.5.t3.b001' no longer parses
    "no-trimming": "import harness.hardware.versions as h\nh.trim_version = lambda raw: raw.strip()\n",
    # vllm-ascend's A3 range (to 255) in place of torch_npu's (to 256)
    "a3-ends-at-255": (
        "import harness.hardware.versions as h\n"
        "h.SOC_RANGES.pop((250, 256)); h.SOC_RANGES[(250, 255)] = h.AscendHardwareVersion.A3\n"
    ),
}
CAUGHT_BY = {
    "substring-names": ["name-Ascend910B]"],
    "substring-everywhere": ["name-xAscend910B3]", "name-Atlas Ascend950PR]",
                             "name-NPU-Ascend910_9391]", "name-Ascend910Bx]", "name-Ascend910Ax]"],
    "no-a5-exemption": ["ipc-a5-pod-hdk-25.1"],
    "no-trimming": ["ipc-a3-t-build", "ipc-a2-rc-build"],
    "a3-ends-at-255": ["soc-256]", "soc-256-torch-npu-vs-vllm-ascend"],
}


@pytest.mark.parametrize("breaker", sorted(BREAKERS))
def test_suite_catches_a_broken_rule(pytester: pytest.Pytester, breaker: str) -> None:
    """Break one rule inside every child, run the real suite's cases that guard it, and see
    them fail. (The other 90-odd cases of the suite are deselected: what is asserted is
    that these fail, and each case is a child of its own, ~0.1 s of CPU: the whole suite
    five times was 60 s of CI's CPU.)"""
    pytester.makepyfile(test_hw_copy=SUITE.read_text())
    body = "\n".join("            " + line for line in BREAKERS[breaker].splitlines())
    guards = CAUGHT_BY[breaker]
    pytester.makeconftest(
        "import pytest\n"
        "def pytest_collection_modifyitems(config, items):\n"
        f"    guards = {guards!r}\n"
        "    kept = [i for i in items if any(g in i.nodeid for g in guards)]\n"
        "    config.hook.pytest_deselected(items=[i for i in items if i not in kept])\n"
        "    items[:] = kept\n"
        "@pytest.fixture\n"
        "def run_on_npu(run_on_npu):\n"
        "    def broken(fn, *args, **kwargs):\n"
        "        def wrapped(*a):\n"
        f"{body}\n"
        "            return fn(*a)\n"
        "        return run_on_npu(wrapped, *args, **kwargs)\n"
        "    return broken\n"
    )
    result = pytester.runpytest("-k", "test_hardware", "-q", "-p", "no:cacheprovider")
    failed = [line for line in result.outlines if line.startswith("FAILED")]
    for case_id in guards:
        assert any(case_id in line for line in failed), (case_id, failed)
    # each guard was run: a fragment that matched no case would have passed nothing
    assert len(failed) >= len(guards), result.outlines[-5:]


def test_markers_skip_with_the_detected_values(pytester: pytest.Pytester, tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    import platform

    info = tmp_path / "ascend" / "cann" / f"{platform.machine()}-linux"
    info.mkdir(parents=True)
    (info / "ascend_toolkit_install.info").write_text("version=8.5.0\n")
    monkeypatch.setenv("HARNESS_ASCEND_ROOT", str(tmp_path / "ascend"))
    monkeypatch.delenv("ASCEND_HOME_PATH", raising=False)
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.soc("A3", "A5")
        def test_a3_a5():
            pass

        @pytest.mark.min_cann("8.3.rc1")
        def test_new_enough_cann():
            pass

        @pytest.mark.min_cann("9.0")
        def test_cann_9():
            pass

        @pytest.mark.min_driver("25.3.rc1")
        def test_driver():
            pass

        def test_properties(record_property, request):
            assert any(k == "npu_versions" for k, _ in request.node.user_properties)
        """
    )
    result = pytester.runpytest("-rs", "--strict-markers")
    result.assert_outcomes(passed=2, skipped=3)
    result.stdout.fnmatch_lines([
        "npu-regress: ascend hardware=NONE; driver=unknown; CANN=8.5.0 (torch_npu is not usable*",
        "*needs Ascend A3 or A5; detected NONE (torch_npu is not usable: import torch_npu: *",
        "*needs CANN >= 9.0; detected 8.5.0 (*ascend_toolkit_install.info)",
        "*needs driver (HDK) >= 25.3.rc1; detected none (no source)",
    ], consecutive=False)
