"""``npu-regress bisect`` on real releases (e2e: it downloads verl and tensordict wheels and
runs a suite case once per candidate).

The case: ``test_conformance[soc-242-verl]`` of the hardware suite. On verl 0.7.1 to 0.9.0
it fails as upstream drift (``verl.utils.device`` has no ``AscendHardwareVersion``); on verl
0.9.1, the default profile's, it passes. The good night ran verl 0.7.1 with tensordict 0.9.1,
tonight verl 0.9.1 with tensordict 0.10.0: two packages changed, one is the cause, and the
first release where the case ends as tonight is verl 0.9.1. The verl 0.8.0 wheel in the
index is damaged, so that candidate cannot be installed: a skip, stepped around."""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness.bisect.overlay import Overlays

ROOT = Path(__file__).resolve().parent.parent
CASE = "suites/test_ascend_hardware.py::test_conformance[soc-242-verl]"
WHEELS = {"verl": ["0.7.1", "0.8.0", "0.9.0", "0.9.1"], "tensordict": ["0.9.1", "0.10.0"]}


def _installed(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


pytestmark = pytest.mark.skipif(
    (_installed("verl"), _installed("tensordict")) != ("0.9.1", "0.10.0"),
    reason="needs the default stack profile (verl 0.9.1, tensordict 0.10.0): "
           "bash ci/setup.sh --upstream")


@pytest.fixture(scope="module")
def nights(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The index (real wheels, verl 0.8.0's damaged), the good night and tonight."""
    base = tmp_path_factory.mktemp("bisect")
    wheels = base / "wheels"
    for name, versions in WHEELS.items():
        for version in versions:  # one at a time: pip resolves one version per name
            subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps",
                            "--only-binary", ":all:", "-d", str(wheels), f"{name}=={version}"],
                           check=True)
    damaged = next(wheels.glob("verl-0.8.0-*.whl"))
    damaged.write_bytes(b"not a zip file: a mirror's half-written download")
    pip = ("--no-index", f"--find-links={wheels}")
    good_night = Overlays(base / "night-overlays", pip)
    path = [good_night.get("verl", "0.7.1"), good_night.get("tensordict", "0.9.1")]
    for name, extra in (("good", {"PYTHONPATH": os.pathsep.join(map(str, path))}),
                        ("tonight", {})):
        subprocess.run([sys.executable, "-m", "pytest", CASE, "-q", "-p", "no:cacheprovider",
                        f"--harness-results={base / name}.jsonl"], cwd=ROOT,
                       env={**os.environ, **extra}, capture_output=True, check=False)
    return {"base": base, "wheels": wheels, "good": base / "good.jsonl",
            "tonight": base / "tonight.jsonl"}


def _bisect(nights: dict[str, Path], state: str, *extra: str) -> tuple[int, dict, str]:
    done = subprocess.run(
        [sys.executable, "-m", "harness", "bisect", str(nights["good"]),
         str(nights["tonight"]), "--test", CASE, "--pip-option=--no-index",
         f"--pip-option=--find-links={nights['wheels']}",
         "--state", str(nights["base"] / state), *extra],
        cwd=ROOT, capture_output=True, text=True, check=False)
    out = nights["base"] / state / "bisect.json"
    return done.returncode, json.loads(out.read_text()) if out.is_file() else {}, \
        done.stdout + done.stderr


def test_the_bisect_names_the_package_and_the_release(nights: dict[str, Path]) -> None:
    for night, verl in (("good", "0.7.1"), ("tonight", "0.9.1")):
        header = json.loads(nights[night].read_text().splitlines()[0])
        assert header["manifest"]["verl"]["version"] == verl, night
    status, outcome, text = _bisect(nights, "state")
    assert status == 0, text
    assert outcome["culprits"] == ["verl"]  # tensordict changed too, and is not the cause
    assert outcome["first_bad"] == {"package": "verl", "version": "0.9.1"}
    assert outcome["last_good"] == {"package": "verl", "version": "0.9.0"}
    assert outcome["search"]["versions"] == ["0.7.1", "0.8.0", "0.9.0", "0.9.1"]
    assert outcome["search"]["tried"] == {"0.8.0": "skip", "0.9.0": "good"}
    skip = next(t for t in outcome["trials"] if t["verdict"] == "skip")
    assert "verl 0.8.0 could not be installed" in skip["why"]
    assert outcome["card"] == "first bad: verl 0.9.1 (0.9.0 good), 2 candidates tried, 1 skip"

    # resumable: the same command again reruns nothing and says the same
    status, again, text = _bisect(nights, "state")
    assert status == 0 and again["card"] == outcome["card"], text
    assert again["resumed_trials"] >= 6 and "resumed:" in text
    assert not [ln for ln in text.splitlines() if ln.endswith(" s)") or " s): " in ln], text


def test_a_spent_budget_stops_exit_2_and_says_how_to_resume(nights: dict[str, Path]) -> None:
    status, outcome, text = _bisect(nights, "budget", "--budget", "0")
    assert status == 2, text
    assert outcome["status"] == "not-found"
    assert "budget of 0 s is spent" in outcome["why"]
    assert "run the same command again to resume" in outcome["why"]
