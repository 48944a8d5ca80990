"""``--isolate-all`` must not change what a user sees: every file in tests/peers/ (styles
users write: unittest classes, decorator patches, module-level pool functions, warnings as
errors, caplog, capsys, yield fixtures) gives the same per-test outcomes plain and isolated
(spawn, forkserver, and forkserver under -n 2)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import defusedxml.ElementTree as ET
import pytest

PEERS = Path(__file__).parent / "peers"
#: the warning filter the peers' own style assumes (tests that fail under -W error); a test
#: stuck for 300 s dumps every thread's stack (pytest's faulthandler) before the run's limit
ARGS = ["-p", "no:cacheprovider", "-W", "error::DeprecationWarning", "-rA",
        "-o", "faulthandler_timeout=300"]
MODES = {
    "plain": [],
    "spawn": ["--isolate-all", "--isolation", "spawn"],
    "forkserver": ["--isolate-all", "--isolation", "forkserver"],
    "forkserver -n 2": ["--isolate-all", "--isolation", "forkserver", "-n", "2"],
}


def outcomes(junit: Path) -> tuple[dict[str, str], set[str]]:
    """test id -> passed / failed / error / skipped / xfailed, and the ids whose call ran in
    an isolated child (the ``isolation`` property), from a JUnit XML file."""
    found = {}
    isolated = set()
    for case in ET.parse(junit).getroot().iter("testcase"):
        name = f"{case.get('classname')}::{case.get('name')}"
        if any(p.get("name") == "isolation" for p in case.iter("property")):
            isolated.add(name)
        kinds = [child.tag for child in case if child.tag in ("failure", "error", "skipped")]
        outcome = kinds[0] if kinds else "passed"
        if outcome == "skipped" and (case.find("skipped").get("type") == "pytest.xfail"):
            outcome = "xfailed"
        found[name] = {"failure": "failed"}.get(outcome, outcome)
    return found, isolated


def run_peers(folder: Path, mode: str) -> tuple[tuple[dict[str, str], set[str]], str]:
    junit = folder / f"junit-{mode.replace(' ', '_')}.xml"
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "pytest", *ARGS, *MODES[mode], f"--junitxml={junit}", "."],
            cwd=folder, capture_output=True, text=True, timeout=600)
    except subprocess.TimeoutExpired as stuck:
        said = "".join(text.decode(errors="replace") if isinstance(text, bytes) else text
                       for text in (stuck.stdout or "", stuck.stderr or ""))
        pytest.fail(f"the {mode} run of the peers did not end in 600 s; it said (the stacks "
                    f"faulthandler dumped at 300 s, if any):\n{said[-12000:]}", pytrace=False)
    return outcomes(junit), proc.stdout


@pytest.fixture(scope="module")
def peers(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("peers")
    for path in PEERS.glob("peer_*.py"):
        shutil.copy(path, folder / path.name.replace("peer_", "test_", 1))
    return folder


@pytest.fixture(scope="module")
def plain(peers: Path) -> dict[str, str]:
    (found, isolated), _ = run_peers(peers, "plain")
    assert isolated == set()
    return found


@pytest.mark.parametrize("mode", ["spawn", "forkserver", "forkserver -n 2"])
def test_isolate_all_gives_the_same_outcomes(peers: Path, plain: dict[str, str],
                                            mode: str) -> None:
    expected = plain
    (got, isolated), out = run_peers(peers, mode)
    assert len(expected) == 36, expected  # the peers really ran
    # ...and isolated: every test whose call ran did so in a child, but the one opted out
    ran = {name for name, outcome in got.items() if outcome in ("passed", "failed")}
    assert ran - isolated == {"test_capture::test_request_stays_in_process"}
    differ = {name: (expected.get(name), got.get(name))
              for name in sorted(set(expected) | set(got))
              if expected.get(name) != got.get(name)}
    assert differ == {}, f"plain vs {mode}: {differ}\n{out[-4000:]}"
    assert "peer-warning-in-summary" in out  # warnings come back into the summary
    assert "peer-log-in-report" in out  # so do log records, in the failing test's report


def test_the_peers_fail_where_they_should(plain: dict[str, str]) -> None:
    """The negative control: the plain run has the failures the peers are written to have,
    so an isolated run that passed them all would differ."""
    expected = plain
    failed = {name.rpartition("::")[2] for name, o in expected.items() if o == "failed"}
    assert {"test_fails", "test_deprecation_is_an_error_under_W", "test_marked_error",
            "test_rewritten_assert", "test_log_then_fail", "test_param[2]"} <= failed
