"""Every way an isolated child can end, asserted exactly, under every isolation method."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import harness
from harness import ChildCrashed, ChildError, ChildTimeout, IsolationError, run_isolated
from harness.isolation.run import OUTPUT_LIMIT, isolate
from tests.process_checks import assert_gone, read_pids, start_grandchild


@pytest.fixture(params=["spawn", "forkserver"])
def method(request: pytest.FixtureRequest) -> str:
    return request.param


def double(x: int) -> int:
    return 2 * x


class Unpicklable(Exception):
    def __init__(self, msg: str) -> None:
        super().__init__(msg)
        self.lock = threading.Lock()


# --- values -----------------------------------------------------------------------------

def test_module_function_value(method: str) -> None:
    res = run_isolated(double, 21, method=method)
    assert res.value == 42
    assert res.outcome == "returned"
    assert res.exitcode == 0
    assert res.pid != os.getpid()
    assert res.duration > 0
    assert res.events == {}


def test_closure_and_lambda_and_kwargs(method: str) -> None:
    offset = 5

    def add(a: int, *, b: int) -> int:
        return a + b + offset

    assert run_isolated(add, 1, b=2, method=method).value == 8
    assert run_isolated(lambda: [os.getpid()], method=method).value[0] != os.getpid()


def test_fn_runs_exactly_once_in_the_child(method: str, tmp_path: Path) -> None:
    marker = tmp_path / "ran"

    def touch() -> int:
        with open(marker, "a") as fh:
            fh.write(f"{os.getpid()}\n")
        return os.getpid()

    res = run_isolated(touch, method=method)
    assert marker.read_text().split() == [str(res.value)]
    assert res.value == res.pid


def test_stdout_and_stderr_captured(method: str) -> None:
    def talk() -> None:
        print("to stdout")
        print("to stderr", file=sys.stderr)

    res = run_isolated(talk, method=method)
    assert res.stdout == "to stdout\n"
    assert "to stderr\n" in res.stderr


def test_100mb_of_output_is_bounded(method: str) -> None:
    def flood() -> str:
        chunk = "x" * (1 << 20) + "\n"
        for _ in range(100):
            sys.stdout.write(chunk)
        sys.stdout.write("THE END\n")
        return "done"

    res = run_isolated(flood, method=method)
    assert res.value == "done"
    assert res.stdout.endswith("THE END\n")
    assert "earlier bytes dropped" in res.stdout
    assert len(res.stdout) < OUTPUT_LIMIT + 200


def test_unpicklable_return_value_names_the_type(method: str) -> None:
    with pytest.raises(ChildError, match=r"value of type _thread\.lock.*cannot be sent back"):
        run_isolated(threading.Lock, method=method)


# --- exceptions -------------------------------------------------------------------------

def test_exception_is_rebuilt_with_child_traceback(method: str) -> None:
    def boom() -> None:
        raise KeyError("missing-key")

    with pytest.raises(KeyError, match="missing-key") as info:
        run_isolated(boom, method=method)
    note = "\n".join(info.value.__notes__)
    assert "traceback in isolated child" in note
    assert 'raise KeyError("missing-key")' in note
    assert "test_isolation.py" in note


def test_unpicklable_exception_becomes_child_error(method: str) -> None:
    def boom() -> None:
        raise Unpicklable("cannot travel")

    with pytest.raises(ChildError) as info:
        run_isolated(boom, method=method)
    err = info.value
    assert isinstance(err, IsolationError)
    assert err.type_name.endswith("Unpicklable")
    assert "cannot travel" in str(err)
    assert 'raise Unpicklable("cannot travel")' in err.traceback_text


def test_pytest_outcomes_keep_their_kind(method: str) -> None:
    with pytest.raises(pytest.skip.Exception, match="not here"):
        run_isolated(lambda: pytest.skip("not here"), method=method)
    with pytest.raises(pytest.xfail.Exception, match="known bug"):
        run_isolated(lambda: pytest.xfail("known bug"), method=method)
    with pytest.raises(pytest.fail.Exception, match="plain failure"):
        run_isolated(lambda: pytest.fail("plain failure"), method=method)


# --- crashes ----------------------------------------------------------------------------

@pytest.mark.parametrize("sig", [signal.SIGSEGV, signal.SIGABRT, signal.SIGKILL])
def test_signal_is_named(method: str, sig: signal.Signals) -> None:
    def die() -> None:
        print("last words", file=sys.stderr, flush=True)
        os.kill(os.getpid(), sig)

    with pytest.raises(ChildCrashed) as info:
        run_isolated(die, method=method)
    err = info.value
    assert err.signal == sig
    assert err.signame == sig.name
    assert err.exitcode == -sig
    assert sig.name in str(err)
    assert "last words" in str(err)
    if sig != signal.SIGKILL:  # faulthandler cannot run on SIGKILL
        assert "in die" in err.result.stack
        assert "test_isolation.py" in str(err)


@pytest.mark.parametrize("how, code", [("os._exit", 3), ("sys.exit", 2), ("sys.exit", 0)])
def test_early_exit_is_a_crash_with_the_code(method: str, how: str, code: int) -> None:
    def leave() -> None:
        if how == "os._exit":
            os._exit(code)
        sys.exit(code)

    with pytest.raises(ChildCrashed, match=f"exited with code {code} before returning") as info:
        run_isolated(leave, method=method)
    assert info.value.exitcode == code
    assert info.value.signal is None


# --- timeouts and leftovers -------------------------------------------------------------

def test_timeout_takes_all_stacks_then_ends_the_group(method: str, tmp_path: Path) -> None:
    pidfile = tmp_path / "pids"

    def hang() -> None:
        start_grandchild(str(pidfile))
        threading.Thread(target=time.sleep, args=(600,), name="side", daemon=True).start()
        time.sleep(600)

    with pytest.raises(ChildTimeout) as info:
        run_isolated(hang, timeout=3, method=method)
    err = info.value
    assert err.timeout == 3
    assert "in hang" in err.stack
    assert err.stack.lower().count("thread 0x") >= 2  # both threads' stacks
    assert "in hang" in str(err)
    assert_gone(read_pids(pidfile))


@pytest.mark.parametrize("ending", ["return", "crash", "raise"])
def test_no_descendant_survives(method: str, tmp_path: Path, ending: str) -> None:
    pidfile = tmp_path / "pids"

    def leave_grandchild() -> int:
        pid = start_grandchild(str(pidfile))
        if ending == "crash":
            os.kill(os.getpid(), signal.SIGSEGV)
        if ending == "raise":
            raise RuntimeError("after starting a grandchild")
        return pid

    with pytest.raises((ChildCrashed, RuntimeError)) if ending != "return" else _nothing():
        run_isolated(leave_grandchild, method=method)
    pids = read_pids(pidfile)
    assert len(pids) == 2
    assert_gone(pids)


def test_grandchild_in_its_own_session_is_ended_when_tracked(method: str, tmp_path: Path) -> None:
    """A grandchild that left the child's session is still found through the process tree."""
    pidfile = tmp_path / "pids"

    def escape() -> None:
        start_grandchild(str(pidfile), new_session=True)
        time.sleep(600)

    with pytest.raises(ChildTimeout):
        run_isolated(escape, timeout=3, method=method)
    assert_gone(read_pids(pidfile))


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> bool:
        return False


# --- environment ------------------------------------------------------------------------

def test_env_only_in_child(method: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HARNESS_T_KEEP", "parent")
    monkeypatch.setenv("HARNESS_T_DROP", "parent")
    before = dict(os.environ)

    def read() -> tuple[str | None, str | None, str | None]:
        return (os.environ.get("HARNESS_T_NEW"), os.environ.get("HARNESS_T_KEEP"),
                os.environ.get("HARNESS_T_DROP"))

    res = run_isolated(read, env={"HARNESS_T_NEW": "child", "HARNESS_T_DROP": None}, method=method)
    assert res.value == ("child", "parent", None)
    assert dict(os.environ) == before


# --- the harness cannot pass a fn it never ran ------------------------------------------

class _SilentLauncher:
    """A broken launcher whose child exits cleanly without running anything."""

    name = "silent"

    def start(self, workdir: Path, env: dict[str, str], cwd: str):  # type: ignore[no-untyped-def]
        from harness.isolation.run import _PopenHandle

        proc = subprocess.Popen([sys.executable, "-c", "pass"], start_new_session=True)
        return _PopenHandle(proc)


def test_child_that_never_ran_fn_cannot_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("harness.isolation.run.get_launcher", lambda method: _SilentLauncher())
    with pytest.raises(ChildCrashed, match="exited with code 0 before returning a result"):
        run_isolated(double, 1)


def test_result_with_a_stale_token_is_rejected(monkeypatch: pytest.MonkeyPatch) -> None:
    """A result file not written for this run (wrong token) is never taken as a pass."""
    import harness.isolation.run as iso

    real = iso._load_result

    def forged(workdir: Path, token: str, res: harness.IsolatedResult) -> bool:
        return real(workdir, "not-" + token, res)

    monkeypatch.setattr(iso, "_load_result", forged)
    res = isolate(double, (1,))
    assert res.outcome == "crashed"
    assert res.value is None


def test_unknown_method_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="unknown isolation method 'thread'.*spawn"):
        run_isolated(double, 1, method="thread")


def test_unpicklable_argument_is_a_clear_error() -> None:
    with pytest.raises(TypeError, match="cannot send .* to an isolated child"):
        run_isolated(double, threading.Lock())


@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_a_child_killed_at_timeout_records_the_signal_that_ended_it(method: str) -> None:
    """The reaper collects a spawned child's status while ending its session: the status
    recorded is still the real one (it was 0 when the reaper's wait consumed it)."""
    res = isolate(time.sleep, (60,), timeout=0.5, method=method)
    assert res.outcome == "timeout"
    assert res.exitcode in (-signal.SIGTERM, -signal.SIGKILL), res.exitcode
    assert res.signal == -res.exitcode


def test_a_result_file_that_cannot_be_read_is_an_isolation_error(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Permissions (a child that set umask 0o777, as a non-root user), a truncated file, a
    full disk: the parent's read fails, and that is a ChildError naming the cause."""
    real = Path.read_bytes

    def unreadable(self: Path) -> bytes:
        if self.name == "result.pkl":
            raise PermissionError(13, "Permission denied", str(self))
        return real(self)

    monkeypatch.setattr(Path, "read_bytes", unreadable)
    with pytest.raises(ChildError) as caught:
        run_isolated(int, "5", method="forkserver")
    assert "result.pkl could not be read (PermissionError: [Errno 13] Permission denied" \
        in str(caught.value)
    assert isinstance(caught.value, IsolationError)


def test_a_truncated_result_file_is_an_isolation_error(monkeypatch: pytest.MonkeyPatch) -> None:
    real = Path.read_bytes
    monkeypatch.setattr(Path, "read_bytes", lambda self: real(self)[:10]
                        if self.name == "result.pkl" else real(self))
    with pytest.raises(ChildError, match=r"could not be read \((EOFError|UnpicklingError)"):
        run_isolated(int, "5", method="spawn")


def test_a_new_session_removes_only_the_folders_of_gone_processes(tmp_path: Path) -> None:
    """Work and socket folders of a process that is gone (a SIGKILLed pytest) are removed;
    those of live processes, and other names, stay."""
    from harness.isolation import workdirs

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale_run = tmp_path / f"npu-regress-run-{dead.pid}-abc"
    stale_fs = tmp_path / f"npu-regress-fs-{dead.pid}-def"
    live = tmp_path / f"npu-regress-run-{os.getppid()}-ghi"
    mine = tmp_path / f"npu-regress-fs-{os.getpid()}-jkl"
    other = tmp_path / "npu-regress-verl-xyz"
    for folder in (stale_run, stale_fs, live, mine, other):
        folder.mkdir()
        (folder / "sock").write_text("")
    assert sorted(workdirs.remove_stale(tmp_path)) == sorted([stale_run, stale_fs])
    assert [p.exists() for p in (stale_run, stale_fs, live, mine, other)] == [
        False, False, True, True, True]


def test_work_folders_name_their_owner() -> None:
    from harness.isolation import workdirs

    folder = workdirs.make("run")
    try:
        assert workdirs.owner(folder) == os.getpid()
    finally:
        folder.rmdir()


def test_folders_left_by_a_sigkilled_run_are_removed_by_the_next(tmp_path: Path) -> None:
    import glob
    import tempfile

    import psutil

    tmp = tempfile.gettempdir()
    victim = subprocess.Popen([sys.executable, "-c", (
        "import time, harness; harness.run_isolated(time.sleep, 120, method='forkserver', "
        "timeout=300)")], cwd=str(tmp_path))
    try:
        deadline = time.monotonic() + 120
        while not glob.glob(f"{tmp}/npu-regress-run-{victim.pid}-*"):
            assert time.monotonic() < deadline, "the victim never started its child"
            time.sleep(0.2)
        victim.kill()
        victim.wait()
        left = glob.glob(f"{tmp}/npu-regress-*-{victim.pid}-*")
        assert len(left) == 2  # its child's work folder and its forkserver's socket folder
        subprocess.run([sys.executable, "-c", "import harness; harness.run_isolated(int, '1')"],
                       check=True, timeout=120)
        assert glob.glob(f"{tmp}/npu-regress-*-{victim.pid}-*") == []
    finally:
        victim.kill()
        victim.wait()
        # what the killed run left running (its forkserver and the sleeping child, whose
        # command lines name the forkserver's folder): ours to end
        for proc in psutil.process_iter(["cmdline"]):
            if any(f"npu-regress-fs-{victim.pid}-" in part for part in proc.info["cmdline"] or []):
                proc.kill()


def _sleeps_with_its_own_sigusr1_handler() -> None:
    signal.signal(signal.SIGUSR1, lambda *_: None)  # the harness's stack signal, taken over
    time.sleep(60)


@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_timeout_stacks_do_not_depend_on_a_signal_the_child_can_take(method: str) -> None:
    res = isolate(_sleeps_with_its_own_sigusr1_handler, timeout=3, method=method)
    assert res.outcome == "timeout"
    assert "in _sleeps_with_its_own_sigusr1_handler" in res.stack, res.stack


def _leave_a_setsid_sleeper(pidfile: str, end: str) -> None:
    """Start a sleeper in a session of its own (as engine workers and daemons do), then end
    at once: by returning, raising, or (``crash``) SIGKILL of this child."""
    proc = subprocess.Popen(["sleep", "3011"], start_new_session=True)
    Path(pidfile).write_text(str(proc.pid))
    if end == "raise":
        raise ValueError("ended by raising")
    if end == "crash":
        os.kill(os.getpid(), signal.SIGKILL)


def _leave_a_daemon(pidfile: str) -> None:
    """Double fork: the middle process exits at once, the sleeper is nobody's child."""
    subprocess.run([sys.executable, "-c", (
        "import subprocess, pathlib; q = subprocess.Popen(['sleep', '3012'], "
        "start_new_session=True, stdout=subprocess.DEVNULL); "
        f"pathlib.Path({pidfile!r}).write_text(str(q.pid))")], check=True)


@pytest.mark.parametrize("end", ["return", "raise"])
def test_a_setsid_grandchild_does_not_outlive_a_child_that_ends_at_once(
        method: str, end: str, tmp_path: Path) -> None:
    """Before: the 1 s descendant poll never saw it, and it ran on."""
    pidfile = tmp_path / "pid"
    res = isolate(_leave_a_setsid_sleeper, (str(pidfile), end), method=method, timeout=60)
    assert res.outcome == ("returned" if end == "return" else "raised")
    assert_gone(read_pids(pidfile))


def test_a_double_forked_daemon_does_not_outlive_its_child(method: str, tmp_path: Path) -> None:
    pidfile = tmp_path / "pid"
    isolate(_leave_a_daemon, (str(pidfile),), method=method, timeout=60)
    assert_gone(read_pids(pidfile))


def test_a_crashing_child_leaves_no_setsid_grandchild(method: str, tmp_path: Path) -> None:
    """The isolation server (forkserver or spawn supervisor) is the subreaper of its
    children: it adopts and ends what a crashed child left, before reporting the crash."""
    pidfile = tmp_path / "pid"
    res = isolate(_leave_a_setsid_sleeper, (str(pidfile), "crash"), method=method,
                  timeout=60)
    assert res.outcome == "crashed" and res.signal == signal.SIGKILL
    assert_gone(read_pids(pidfile))
