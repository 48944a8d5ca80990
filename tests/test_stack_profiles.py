"""Stack profiles (ci/profiles), the declared-requirements check, and the pairing preflight:
each with a negative control that breaks the thing it guards."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

from harness.hardware import preflight
from harness.stack import pairing, profile, requirements

ROOT = Path(__file__).resolve().parent.parent


def _fake_dist(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, version: str,
               requires: list[str]) -> None:
    """An installed distribution of our own making (a .dist-info on sys.path)."""
    info = tmp_path / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    lines = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}"]
    lines += [f"Requires-Dist: {r}" for r in requires]
    (info / "METADATA").write_text("\n".join(lines) + "\n")
    monkeypatch.syspath_prepend(str(tmp_path))


def test_the_three_profiles_load_and_say_what_they_are() -> None:
    got = {name: profile.load(name) for name in ("default", "verl", "forward")}
    assert got["default"].wheels["vllm"] == "0.23.0"
    assert got["default"].sources["vllm-ascend"] == "0.23.0.post1"
    assert got["verl"].wheels["vllm"] == "0.24.0" and got["verl"].pins["transformers"] == "5.9.0"
    assert got["forward"].kind == "forward" and got["forward"].verify == "report"
    assert all(p.kind == "release" for n, p in got.items() if n != "forward")
    # where a CPU machine cannot follow the matrix, it is written down, with the reason:
    # torch everywhere, and SGLang's sources without the CUDA wheel's requirements
    assert got["default"].sources["sglang"] == "0.5.23"
    for name, p in got.items():
        assert [d["package"] for d in p.deviations] == (
            ["torch", "sglang"] if name == "default" else ["torch"])
        assert all(d["reason"] for d in p.deviations)
        assert all(why for reasons in p.not_installed.values() for why in reasons.values())


def test_a_bad_profile_is_named_with_the_fix(tmp_path: Path) -> None:
    with pytest.raises(profile.ProfileError, match="no stack profile 'nosuch'.*known: default"):
        profile.load("nosuch")
    bad = tmp_path / "bad.toml"
    bad.write_text('name = "x"\nkind = "sideways"\nsummary = "s"\n')
    with pytest.raises(profile.ProfileError, match="kind = 'sideways'; use one of release"):
        profile.load(bad)
    bad.write_text("name = [\n")
    with pytest.raises(profile.ProfileError, match="not valid TOML"):
        profile.load(bad)


def test_the_profile_pins_agree_with_every_declared_range() -> None:
    """The default profile's pins sit inside each release's declared range (read from the
    installed metadata); a pin outside one would be reported by verify."""
    default = profile.load("default")
    if requirements.declared("vllm") is None:
        pytest.skip("the default profile is not installed (bash ci/setup.sh --upstream)")
    assert [str(u) for u in profile.unmet(default)] == []


def test_unmet_names_a_missing_and_an_out_of_range_requirement(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_dist(tmp_path, monkeypatch, "npu-regress-fake", "1.0",
               ["packaging>=99", "no-such-package-xyz", "pytest", "torch==1.0.0",
                "cudaonly-xyz; extra == 'gpu'"])
    found = [str(u) for u in requirements.unmet(
        ["npu-regress-fake"], {"npu-regress-fake": {"torch": "a CPU machine"}})]
    assert any("requires packaging>=99" in f and "is installed" in f for f in found), found
    assert "npu-regress-fake requires no-such-package-xyz: not installed" in found
    assert not any("pytest" in f or "torch" in f or "cudaonly" in f for f in found), found
    lines = requirements.install_lines(["npu-regress-fake"], {"*": {"torch": "x"}},
                                       {"packaging": "26.0"})
    assert "torch==1.0.0" not in lines and "packaging==26.0" in lines
    assert not any(line.startswith("packaging>=") for line in lines)  # the pin stands for it


def test_a_pin_keeps_the_extras_the_declarations_ask_for(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """fastapi[standard] pinned as plain fastapi==X lost uvloop, which vLLM 0.23.0 imports:
    the patch guard then filed 'No module named uvloop' against the release."""
    _fake_dist(tmp_path, monkeypatch, "npu-regress-fake2", "1.0", ["requests[socks]>=2"])
    assert requirements.install_lines(["npu-regress-fake2"], {}, {"requests": "2.34.2"}) \
        == ["requests[socks]==2.34.2"]
    # and the check follows the extra: requests[socks] needs PySocks (not installed here)
    found = [str(u) for u in requirements.unmet(["npu-regress-fake2"])]
    assert any("through requests[socks]" in f and "not installed" in f for f in found), found


def test_the_mixed_stack_fails_the_pairing_naming_both() -> None:
    """vllm 0.33.0 + vllm-ascend 0.23.0.post1 + torch_npu 2.14.0 + CANN 9.1.0 passed the old
    preflight clean."""
    mixed = {"vllm-ascend": "0.23.0.post1", "vllm": "0.33.0", "torch": "2.14.0",
             "torch-npu": "2.14.0", "verl": None}
    found = pairing.check(mixed.get, requires=False)
    assert not found.supported
    text = "\n".join(found.problems)
    assert "vllm-ascend 0.23.0.post1 pairs with vllm 0.23.0" in text
    assert "this runner has 0.33.0" in text
    assert "torch-npu 2.10.0.post4" in text and "torch 2.10.0" in text


def test_the_default_stack_pairs_and_its_torch_is_a_note() -> None:
    default = {"vllm-ascend": "0.23.0.post1", "vllm": "0.23.0+empty", "torch": "2.13.0+cpu",
               "verl": "0.9.1", "transformers": "5.5.4"}
    found = pairing.check(default.get, {"torch": "the only CPU build"}, requires=False)
    assert found.supported, found.problems
    assert any("torch 2.13.0+cpu" in n and "the only CPU build" in n for n in found.notes)
    assert any("verl 0.9.1's `vllm` extra pins vllm==0.24.0" in n for n in found.notes)
    # the same versions on an NPU stack: the torch pairing binds
    npu = dict(default, **{"torch-npu": "2.10.0.post4"})
    assert any("torch 2.10.0" in p for p in pairing.check(npu.get, requires=False).problems)


def test_a_release_missing_from_the_table_is_our_gap() -> None:
    found = pairing.check({"vllm-ascend": "9.9.9", "vllm": "9.9.9"}.get, requires=False)
    assert found.problems and "no row in the harness's pairing table" in found.problems[0]
    assert "a harness gap" in found.problems[0]


def test_the_pairing_table_equals_the_real_matrix() -> None:
    matrix = preflight.installed_matrix()
    if matrix is None:
        pytest.skip("vllm-ascend's matrix is not installed (bash ci/setup.sh --upstream)")
    import re

    real = {}
    for line in matrix.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 6 and re.match(r"v?\d", cells[0]):
            torch, npu = (c.strip() for c in cells[4].split("/"))
            real.setdefault(cells[0].lstrip("v"), (cells[1].lstrip("v"), torch, npu, cells[3]))
    rows = pairing.table()["vllm_ascend"]
    assert len(rows) == 17
    for release, row in rows.items():
        assert real[release] == (row["vllm"], row["torch"], row["torch_npu"], row["cann"])
        assert row["source"] and row["read"]
        # the CANN column agrees with the preflight's own copy
        assert preflight.STATED_CANN[release] == row["cann"]


def test_setup_rejects_an_unknown_profile() -> None:
    import subprocess

    proc = subprocess.run(["bash", "ci/setup.sh", "--profile", "nosuch"], cwd=ROOT,
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 2
    assert "no stack profile 'nosuch'" in proc.stderr and "default" in proc.stderr


def test_verify_fails_naming_the_package(tmp_path: Path) -> None:
    """``python -m harness.stack.profile verify`` on a profile whose wheel declares what is
    not installed: exit 1, the package named."""
    import subprocess

    site = tmp_path / "site"
    info = site / "npu_regress_fake3-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: npu-regress-fake3\n"
                                   "Version: 1.0\nRequires-Dist: gguf-not-here>=0.17\n")
    prof = tmp_path / "p.toml"
    prof.write_text(textwrap.dedent("""\
        name = "p"
        kind = "release"
        summary = "a test"
        [wheels]
        npu-regress-fake3 = "1.0"
        """))
    env = {"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"}
    proc = subprocess.run([sys.executable, "-m", "harness.stack.profile", "verify", str(prof)],
                          cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    assert proc.returncode == 1, proc.stderr
    assert "npu-regress-fake3 requires gguf-not-here>=0.17: not installed" in proc.stderr
