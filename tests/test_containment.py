"""pytest killed by any signal, plain or under xdist (controller or a worker): nothing the
session started, directly or not, outlives it. The isolation servers read a pipe from the
process that started them and end every descendant when it closes; xdist workers exit when
their controller is gone."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

#: generous bound on "gone": a survivor sleeps for 600 s, so any finite wait tells them apart;
#: the time really taken is measured by bench/containment.py
GONE_WITHIN_S = 30.0

VICTIM = """
import os, subprocess, sys, time
import psutil

def child(pidfile):
    plain = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    own = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(601)"],
                           start_new_session=True)
    me = psutil.Process()
    server = me.parent()
    pids = [me.pid, plain.pid, own.pid, server.pid, server.parent().pid]
    open(pidfile + ".tmp", "w").write(" ".join(map(str, pids)))
    os.rename(pidfile + ".tmp", pidfile)
    time.sleep(600)

def test_long(run_on_npu):
    run_on_npu(child, {pidfile!r})
"""


def start_victim(tmp_path: Path, method: str, xdist: bool) -> tuple[subprocess.Popen[bytes],
                                                                     list[int]]:
    """A pytest session whose isolated child runs (with a grandchild in its session and one
    in a session of its own); returns the session and the pids: child, the two
    grandchildren, the isolation server, the process that started the server (pytest or the
    xdist worker)."""
    pidfile = tmp_path / "pids"
    (tmp_path / "test_victim.py").write_text(VICTIM.format(pidfile=str(pidfile)))
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--isolation", method,
           str(tmp_path / "test_victim.py")]
    if xdist:
        cmd += ["-n", "2"]
    proc = subprocess.Popen(cmd, cwd=tmp_path, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    for _ in range(1800):  # bounded: the child reports its pids once it runs
        if pidfile.exists() or proc.poll() is not None:
            break
        time.sleep(0.1)
    assert pidfile.exists(), f"the victim session never ran its child (exit {proc.poll()})"
    return proc, [int(p) for p in pidfile.read_text().split()]


def survivors(pids: list[int]) -> list[str]:
    alive = []
    for pid in pids:
        try:
            proc = psutil.Process(pid)
            if proc.status() != psutil.STATUS_ZOMBIE:
                alive.append(f"{pid} {' '.join(proc.cmdline())[:120]}")
        except psutil.NoSuchProcess:
            continue
    return alive


def wait_gone(pids: list[int]) -> list[str]:
    deadline = time.monotonic() + GONE_WITHIN_S
    while (left := survivors(pids)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


def kill_left(pids: list[int]) -> None:
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            psutil.Process(pid).kill()


def _tree(pid: int) -> list[int]:
    try:
        return [p.pid for p in psutil.Process(pid).children(recursive=True)]
    except psutil.Error:
        return []


@pytest.mark.parametrize("method", ["spawn", "forkserver"])
@pytest.mark.parametrize("target", ["plain:SIGKILL", "controller:SIGKILL",
                                    "controller:SIGTERM", "worker:SIGKILL"])
def test_a_killed_session_leaves_nothing(tmp_path: Path, method: str, target: str) -> None:
    """Before: the grandchildren (plain SIGKILL), or the busy worker, its server, child and
    grandchildren (-n 2, until the test ended: 76 s measured) survived."""
    who, signame = target.split(":")
    proc, pids = start_victim(tmp_path, method, xdist=who != "plain")
    ours = {os.getpid(), *(p.pid for p in psutil.Process().parents())}
    everything = sorted({*pids, *_tree(proc.pid)} - ours)
    try:
        victim = pids[4] if who == "worker" else proc.pid
        os.kill(victim, getattr(signal, signame))
        left = wait_gone([p for p in everything if p != proc.pid or who != "worker"])
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        kill_left(everything)  # what this test started and a failure left: ours to end
    assert left == [], f"survived {target} of pytest ({method}): {left}"


def test_end_tree_ends_a_process_and_what_it_started() -> None:
    """A rank or a server is no session leader: ``end_tree`` ends it and its descendants,
    one that ignores SIGTERM included (SIGKILL after the grace)."""
    import subprocess
    import sys

    from harness.isolation.reaper import end_tree
    from tests.process_checks import assert_gone

    code = ("import signal, subprocess, sys, time\n"
            "c = subprocess.Popen([sys.executable, '-c', 'import signal, time; "
            "signal.signal(signal.SIGTERM, signal.SIG_IGN); print(1, flush=True); "
            "time.sleep(600)'], stdout=subprocess.PIPE)\n"
            "c.stdout.readline()\n"
            "print(c.pid, flush=True)\n"
            "time.sleep(600)\n")
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    child = int(parent.stdout.readline())
    end_tree(parent.pid, grace=1.0)
    assert parent.wait(10) is not None
    assert_gone([child])


def test_a_fork_of_the_pytest_process_dies_by_sigterm_as_without_the_harness(
        pytester: pytest.Pytester) -> None:
    """A test's fork (a fork pool's worker) inherits the session's SIGTERM handler. It must
    die by SIGTERM as it would without the harness: a pool's terminate() waits for its
    workers (a peer suite's fork pool hung its run until the 600 s limit), and a fork is no
    session whose children it may end."""
    pytester.makepyfile(test_fork="""
        import os, signal

        def test_fork():
            pid = os.fork()
            if pid == 0:
                os.kill(os.getpid(), signal.SIGTERM)
                os._exit(3)  # not reached: SIGTERM ends it
            _, status = os.waitpid(pid, 0)
            assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGTERM, status
    """)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
    # the fork ran none of the session's ending (it would print it, as a second session)
    assert "the session was ended" not in result.stdout.str() + result.stderr.str()
    assert result.stdout.str().count("test session starts") == 1
