"""Warm isolation: what one case changes, the next case (same server) never sees; and the
forkserver refuses to serve from a process with a live accelerator."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from harness import run_isolated
from harness.isolation.run import SpawnLauncher, get_launcher, isolate
from harness.isolation.server import ForkServerLauncher, ForkServerUnavailable
from tests.conftest import needs_torch


def pollute(module_dir: str) -> dict[str, object]:
    """Case 1: change every kind of global state a batch-invariance check changes."""
    import torch

    lib = torch.library.Library("aten", "IMPL")  # noqa: F841 - must stay alive to stay active
    lib.impl("mm", lambda a, b: torch.full((a.shape[0], b.shape[1]), 7.0), "CPU")
    torch.sum = lambda *a, **k: "replaced"
    os.environ["HARNESS_POLLUTED"] = "1"
    sys.path.insert(0, module_dir)
    import polluting_module  # noqa: F401

    x = torch.ones(2, 2)
    return {"mm": torch.mm(x, x).tolist(), "sum": torch.sum(x)}


def observe() -> dict[str, object]:
    """Case 2: report what it sees of case 1's changes."""
    import torch

    x = torch.ones(2, 2)
    return {
        "mm": torch.mm(x, x).tolist(),
        "sum": float(torch.sum(x)),
        "env": os.environ.get("HARNESS_POLLUTED"),
        "module": "polluting_module" in sys.modules,
    }


@needs_torch
@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_next_case_sees_nothing_of_the_last(method: str, tmp_path: Path) -> None:
    (tmp_path / "polluting_module.py").write_text("VALUE = 1\n")
    first = run_isolated(pollute, str(tmp_path), method=method)
    assert first.value == {"mm": [[7.0, 7.0], [7.0, 7.0]], "sum": "replaced"}  # it took effect
    second = run_isolated(observe, method=method)
    assert second.value == {"mm": [[2.0, 2.0], [2.0, 2.0]], "sum": 4.0, "env": None,
                            "module": False}
    assert second.method == first.method == method


def test_forkserver_children_are_forked_from_one_server() -> None:
    launcher = get_launcher("forkserver")
    pids = [isolate(os.getppid, launcher=launcher).value for _ in range(3)]
    assert pids == [launcher.proc.pid] * 3


@pytest.mark.parametrize("module, reason", [
    pytest.param("tests.fake_cuda_initialised", "CUDA is initialised in the forkserver",
                 marks=needs_torch),
    pytest.param("tests.fake_npu_initialised", "the NPU is initialised in the forkserver",
                 marks=needs_torch),
    ("no_such_module_xyz", "preloading 'no_such_module_xyz' failed: ModuleNotFoundError"),
])
def test_server_refuses_to_serve(module: str, reason: str) -> None:
    server = ForkServerLauncher(("torch", module))
    with pytest.raises(ForkServerUnavailable, match=reason):
        server.ensure_ready()
    assert not server.alive()


def test_an_optional_preload_entry_is_skipped_where_it_is_not_installed() -> None:
    """``name?``: optional (the project's ini lists transformers? and openai?); the server
    serves without it, and imports it where it is installed; a plain entry still refuses."""
    server = ForkServerLauncher(("no_such_module_xyz?", "colorsys?"))
    try:
        server.ensure_ready()
        assert server.alive()
        loaded = isolate(lambda: sorted(m for m in ("colorsys", "no_such_module_xyz")
                                        if m in sys.modules), launcher=server).value
        assert loaded == ["colorsys"]  # (no module of the server's own imports colorsys)
    finally:
        server.close()


@needs_torch
def test_auto_falls_back_to_spawn_with_one_warning(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        import os
        def test_a(run_on_npu):
            assert run_on_npu(os.getpid).method == "spawn"
        def test_b(run_on_npu):
            assert run_on_npu(os.getpid).method == "spawn"
        """
    )
    result = pytester.runpytest("--isolation-preload", "torch,tests.fake_cuda_initialised",
                                "-W", "always")
    result.assert_outcomes(passed=2)
    out = result.stdout.str()
    assert out.count("forkserver unavailable, isolating with spawn instead: CUDA is initialised") == 1


@needs_torch
def test_explicit_forkserver_fails_with_the_reason(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        import os
        def test_a(run_on_npu):
            run_on_npu(os.getpid)
        """
    )
    result = pytester.runpytest("--isolation", "forkserver",
                                "--isolation-preload", "torch,tests.fake_npu_initialised")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*--isolation forkserver: the forkserver is unavailable: "
                                 "the NPU is initialised in the forkserver*"])


def test_spawn_session_never_starts_a_server(pytester: pytest.Pytester) -> None:
    """A spawn session's children come from the spawn supervisor (a server that preloaded
    nothing, started by this pytest), never from a torch-preloading forkserver."""
    pytester.makepyfile(
        """
        import os, psutil
        def parent():
            me = psutil.Process()
            return me.parent().cmdline(), me.parent().parent().pid
        def test_a(run_on_npu):
            cmdline, grandparent = run_on_npu(parent).value
            assert grandparent == os.getpid()
            assert "serve(" in cmdline[-1] and cmdline[-1].endswith(", [])"), cmdline
        """
    )
    pytester.runpytest("--isolation", "spawn").assert_outcomes(passed=1)
    assert SpawnLauncher.name == "spawn"


def test_a_status_read_with_the_pid_is_not_lost() -> None:
    """A child that ends at once: the server's pid and status lines can arrive in one read."""
    import socket

    from harness.isolation.messages import Ended, encode
    from harness.isolation.server import _ForkedHandle

    ours, theirs = socket.socketpair()
    try:
        handle = _ForkedHandle(ours, 1234, encode(Ended(3)))
        assert handle.wait(0) == 3
    finally:
        theirs.close()


@pytest.mark.parametrize("isolation", ["forkserver", "spawn"])
def test_a_tmpdir_too_deep_for_a_unix_socket_path_still_serves(
        pytester: pytest.Pytester, tmp_path: Path, isolation: str) -> None:
    """The server's socket lives under TMPDIR; sockaddr_un holds 108 bytes. Before, a
    deeper TMPDIR failed every check: "OSError: AF_UNIX path too long"."""
    import os
    import subprocess
    import sys

    deep = tmp_path / ("d" * 60) / ("e" * 60)
    deep.mkdir(parents=True)
    pytester.makepyfile(test_deep="def test_one(run_on_npu):\n"
                        "    assert run_on_npu(int, '7').value == 7\n")
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider",
                           "--isolation", isolation, "test_deep.py"], cwd=pytester.path,
                          env={**os.environ, "TMPDIR": str(deep)}, capture_output=True,
                          text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "AF_UNIX path too long" not in proc.stdout + proc.stderr


def test_a_server_whose_forks_torch_has_poisoned_refuses() -> None:
    """On a CUDA build, a device count asked in the server (``torch.cuda.is_available()``
    in a collected module's ``skipif``) makes every forked child fail with "Cannot
    re-initialize CUDA in forked subprocess" without CUDA being initialised: seen on an
    H200 (issue 48), 44 cases of one run. The server now says so and is not used."""
    import os
    import types

    from harness.isolation import server

    parent = os.getpid()
    fake = types.SimpleNamespace(
        version=types.SimpleNamespace(cuda="13.0"),
        cuda=types.SimpleNamespace(_is_in_bad_fork=lambda: os.getpid() != parent))
    assert "torch poisons forks" in str(server._forks_poisoned(fake))
    fake.cuda._is_in_bad_fork = lambda: False
    assert server._forks_poisoned(fake) is None
    fake.version.cuda = None  # a CPU build: no fork poison, no probe
    assert server._forks_poisoned(fake) is None


def test_messages_round_trip_and_refuse_what_is_out_of_place() -> None:
    """The server's contract: every message decodes to what was encoded; a message of
    another kind, or a line that is no message, is a ``ProtocolError`` naming it."""
    from harness.isolation import messages as m

    for message in (m.Fork("/w", {"A": "1"}, "/c"), m.Exec("/w", {}, "/c", ["python", "-c", ""]),
                    m.WarmUp("pkg.mod:fn", "arg"), m.Branch({"A": "1"}, ["vllm"], "/s"),
                    m.Ready(12, {"modules": 3}),
                    m.Unavailable("why", refused="why"), m.Warmed([1]), m.Refused("no"),
                    m.Started(7), m.NotStarted("full"), m.Ended(-9)):
        assert m.decode(m.encode(message), (type(message),)) == message
    with pytest.raises(m.ProtocolError, match="expected fork or exec or warm_up or branch, got ended"):
        m.decode(m.encode(m.Ended(0)), m.REQUESTS)
    with pytest.raises(m.ProtocolError, match="not an isolation-server message"):
        m.decode(b'{"status": 3}', (m.Ended,))


PRELOADED = """
import sys

def loaded():
    return "colorsys" in sys.modules

def test_a(run_on_npu, record_property):
    record_property("preloaded", run_on_npu(loaded).value)
"""


@needs_torch
@pytest.mark.parametrize(("tests", "flag", "preloaded"), [
    (1, False, False),  # one child: torch, pytest and harness only
    (2, False, True),   # the ini's list pays for itself across children
    (1, True, True),    # a list given on the command line is kept
])
def test_the_ini_preload_applies_from_its_minimum_of_tests(
        pytester: pytest.Pytester, tests: int, flag: bool, preloaded: bool) -> None:
    pytester.makeini("[pytest]\nharness_isolation_preload = torch,pytest,harness,colorsys\n")
    pytester.makepyfile(PRELOADED + ("test_b = test_a\n" if tests == 2 else ""))
    results = pytester.path / "results.jsonl"
    args = ["--isolation", "forkserver", f"--harness-results={results}", "-p", "no:randomly"]
    if flag:
        args.append("--isolation-preload=torch,pytest,harness,colorsys")
    pytester.runpytest_subprocess(*args).assert_outcomes(passed=tests)
    seen = {r["id"]: r["properties"]["preloaded"] for r in map(
        json.loads, results.read_text().splitlines()) if r["type"] == "test"}
    assert set(seen.values()) == {preloaded}, seen


def test_a_preload_minimum_that_is_no_whole_number_is_a_usage_error(
        pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\nharness_isolation_preload_min = two\n")
    pytester.makepyfile("def test_a():\n    pass\n")
    result = pytester.runpytest_subprocess()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "harness_isolation_preload_min = 'two': give a whole number >= 0" in result.stderr.str()
