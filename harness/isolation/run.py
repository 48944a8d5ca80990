"""Run one callable in a fresh process and bring back everything about how it ended.

Layers, parent side: ``run_isolated`` (public, raises like the child did) -> ``isolate``
(never raises for a child's outcome; returns an ``IsolatedResult``) -> a launcher
(``spawn`` here; the forkserver launcher lives in ``harness.isolation.server``) -> the child
(``harness.isolation.child``) -> ``harness.isolation.reaper`` to end whatever the child left behind.

stdout and stderr go to files, not pipes: a child can print gigabytes without ever blocking
on a full pipe, and we read back only the last ``OUTPUT_LIMIT`` bytes of each.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import importlib.util
import io
import json
import os
import pickle
import secrets
import shutil
import signal
import sys
import time
import types
import warnings
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import cloudpickle
import psutil

from harness.isolation import reaper, workdirs
from harness.isolation.child import ARMED, DISK_ERRNO_OF_EXIT, STACK_SIGNAL
from harness.isolation.failure_text import child_traceback_note
from harness.isolation.result import IsolatedResult
from harness.isolation.server import (  # noqa: F401 - SpawnLauncher, PACKAGE_ROOT: re-exported
    PACKAGE_ROOT,
    ForkServerUnavailable,
    SpawnLauncher,
    _PopenHandle,
    get_forkserver_launcher,
)
from harness.stack.devices import thread_budget_env

if TYPE_CHECKING:
    from harness.hardware.spoof import NpuSpoof

#: bytes of each of stdout / stderr kept from the end of the child's output
OUTPUT_LIMIT = 1 << 20
#: how long to wait for faulthandler to write the stacks we asked for at timeout
STACK_WAIT_S = 3.0
#: how often the parent notes the child's descendants while it runs
TRACK_INTERVAL_S = 1.0
#: methods ``run_isolated`` accepts
METHODS = ("spawn", "forkserver", "auto")


class ChildHandle(Protocol):
    pid: int

    def wait(self, timeout: float | None) -> int | None:
        """Popen-style return code (negative: killed by that signal), or None if still running."""


class Launcher(Protocol):
    name: str

    def start(self, workdir: Path, env: dict[str, str], cwd: str) -> ChildHandle: ...


_auto_warned = False


def resolve_launcher(method: str, forkserver: Callable[[], Launcher]
                     ) -> tuple[Launcher, str | None]:
    """The launcher for ``method``: ``spawn``; ``forkserver`` (``forkserver()``, which raises
    ``ForkServerUnavailable`` when it cannot serve); ``auto``: the forkserver, else spawn.
    Returns (launcher, why auto fell back to spawn, or None)."""
    if method == "spawn":
        return SpawnLauncher(), None
    if method not in ("forkserver", "auto"):
        raise ValueError(f"unknown isolation method {method!r}: use one of {', '.join(METHODS)}")
    try:
        return forkserver(), None
    except ForkServerUnavailable as exc:
        if method == "forkserver":
            raise
        return SpawnLauncher(), str(exc)


def get_launcher(method: str) -> Launcher:
    """``resolve_launcher`` with this process's shared forkserver (default preload); an
    ``auto`` fallback warns once per process."""
    global _auto_warned
    launcher, why = resolve_launcher(method, get_forkserver_launcher)
    if why and not _auto_warned:
        _auto_warned = True
        warnings.warn(f"npu-regress: forkserver unavailable, isolating with spawn: {why}",
                      RuntimeWarning, stacklevel=2)
    return launcher


def child_environ(env: Mapping[str, str | None] | None, mark_child: bool = True
                  ) -> dict[str, str]:
    """The parent's environment with ``env`` applied (None removes a variable), and
    ``HARNESS_CHILD=1`` unless ``mark_child`` is false (a whole test that asked for no
    device sees exactly the parent's environment). A marked child under pytest-xdist also
    gets its worker's share of the CPUs as intra-op threads, unless ``env`` says otherwise
    (``thread_budget_env``: ``run_isolated`` called from a test as ``run_on_npu`` is; with
    every core's OpenMP threads in each worker's child, a TinyDecoder check took 120 s
    instead of 2.4 s under -n 2 on 2 cores)."""
    out = dict(os.environ)
    if mark_child:
        out.update(thread_budget_env(os.environ))
    for key, value in (env or {}).items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = str(value)
    if mark_child:
        out["HARNESS_CHILD"] = "1"
    return out


def _is_test_module(name: str) -> bool:
    base = name.rpartition(".")[2]
    return base.startswith("test_") or base.endswith("_test") or base == "conftest"


def _by_value_modules(fn: Callable[..., Any]) -> list[Any]:
    """Modules to ship by value: test files (keeps pytest's assertion rewriting and needs no
    import in the child) and anything the child could not import by name."""
    name = getattr(fn, "__module__", None)
    module = sys.modules.get(name or "")
    if module is None or name == "__main__":
        return []
    try:
        importable = importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        importable = False
    return [module] if _is_test_module(name) or not importable else []


def _code_reduce_keeping_filename(code: types.CodeType) -> Any:
    """cloudpickle >= 3 writes every shipped code object's file as ``<dynamic-code>``; put the
    real file back so the child's tracebacks and stacks name the test file and its lines."""
    rebuild, args = cloudpickle.Pickler.dispatch_table[types.CodeType](code)
    args = tuple(code.co_filename if a == "<dynamic-code>" else a for a in args)
    return rebuild, args


class _Pickler(cloudpickle.Pickler):
    dispatch_table = collections.ChainMap(
        {types.CodeType: _code_reduce_keeping_filename}, cloudpickle.Pickler.dispatch_table
    )


def dumps(obj: Any) -> bytes:
    """cloudpickle ``obj`` as the child will load it (code objects keep their file)."""
    buf = io.BytesIO()
    _Pickler(buf, protocol=pickle.HIGHEST_PROTOCOL).dump(obj)
    return buf.getvalue()


def dump_payload(payload: dict[str, Any]) -> bytes:
    """cloudpickle the payload, with a clear error naming what cannot travel."""
    modules = _by_value_modules(payload["fn"])
    for module in modules:
        cloudpickle.register_pickle_by_value(module)
    try:
        return dumps(payload)
    except Exception as exc:
        raise TypeError(
            f"cannot send {payload['fn']!r} and its arguments to an isolated child: {exc}. "
            "Everything passed to run_isolated must be picklable by cloudpickle."
        ) from exc
    finally:
        for module in modules:
            with contextlib.suppress(ValueError):
                cloudpickle.unregister_pickle_by_value(module)


def _read_tail(path: Path, limit: int = OUTPUT_LIMIT) -> str:
    try:
        with open(path, "rb") as fh:
            size = fh.seek(0, os.SEEK_END)
            fh.seek(max(0, size - limit))
            data = fh.read()
    except OSError:
        return ""
    text = data.decode("utf-8", errors="replace")
    if size > limit:
        text = f"[... {size - limit} earlier bytes dropped ...]\n" + text
    return text


def _request_stack(pid: int, workdir: Path) -> str:
    """Every thread's stack at the deadline: what the child's watchdog wrote just before it,
    else asked for now through the child's faulthandler (and waited for)."""
    path = workdir / "stack.txt"
    if path.exists() and path.stat().st_size:
        return _read_tail(path)
    if not (workdir / ARMED).exists():  # still starting: the signal would kill it, not dump
        return (f"(no stack: the child had not yet armed its {STACK_SIGNAL.name} stack dump; "
                "it was still starting up)")
    reaper.send(pid, STACK_SIGNAL)
    deadline = time.monotonic() + STACK_WAIT_S
    last = -1
    while time.monotonic() < deadline:
        time.sleep(0.1)
        size = path.stat().st_size if path.exists() else 0
        if size and size == last:
            break
        last = size
    text = _read_tail(path)
    if not text:
        return f"(no stack: the child did not answer {STACK_SIGNAL.name} within {STACK_WAIT_S:g} s)"
    return text


def _load_result(workdir: Path, token: str, res: IsolatedResult) -> bool:
    """Fill ``res`` from result.pkl; False if the child never wrote a result for this token."""
    path = workdir / "result.pkl"
    try:
        if not path.exists():
            return False
        data = pickle.loads(path.read_bytes())
    except (OSError, EOFError, pickle.UnpicklingError, ValueError) as exc:
        # permissions (a child that set umask 0o777), a truncated file, a full disk...
        res.outcome = "error"
        res.message = (f"the child's result file {path} could not be read "
                       f"({type(exc).__name__}: {exc}): the child ended, its result is lost")
        return True
    if not isinstance(data, dict) or data.get("token") != token:
        return False
    kind = data["kind"]
    res.outcome = kind
    res.message = data.get("message", "")
    res.traceback = data.get("traceback", "")
    res.exc_type = data.get("exc_type", "")
    res.pytrace = data.get("pytrace", True)
    extras = data.get("extras") or {}
    res.events_counted = "events" in extras
    counted = extras.pop("events", None) or {}
    res.recorder = str(getattr(counted, "recorder", "") or "")
    res.events = dict(counted)
    res.extras = extras
    try:
        if kind == "returned":
            res.value = cloudpickle.loads(data["value"])
        elif kind == "raised":
            exc = cloudpickle.loads(data["exception"])
            add_note(exc, child_traceback_note(res.pid, res.traceback))
            res.exception = exc
    except Exception as exc:  # noqa: BLE001 - a class the parent cannot import, say
        what = "return value" if kind == "returned" else f"exception {res.exc_type}"
        res.outcome = "error"
        res.message = (
            f"the child's {what} could not be rebuilt in the parent ({type(exc).__name__}: "
            f"{exc})" + (f"; its message was: {res.message}" if res.message else "")
        )
    return True


def add_note(exc: BaseException, note: str) -> None:
    """``exc.add_note(note)``; on Python 3.10, which has no ``add_note``, the same
    ``__notes__`` list (pytest renders it there too, through its exceptiongroup backport).
    Before: a child's KeyError came back on 3.10 as "could not be rebuilt in the parent"."""
    if hasattr(exc, "add_note"):
        exc.add_note(note)
        return
    with contextlib.suppress(AttributeError, TypeError):
        notes = getattr(exc, "__notes__", None)
        exc.__notes__ = [*(notes if isinstance(notes, list) else []), note]  # type: ignore[attr-defined]


#: what a child had reported, in words, when it died after writing its result
_REPORTED = {"returned": "returned a result", "skip": "skipped", "xfail": "xfailed"}


def _ended_after_result(res: IsolatedResult, workdir: Path) -> None:
    """The child wrote its result and then died by a signal or exited non-zero (a device
    runtime that faults in teardown, a thread that corrupts memory): never a pass. A
    result that was green (returned, skip, xfail) becomes ``crashed``, its value kept; a
    failing one stays failing and says how the process ended too."""
    res.stack = _read_tail(workdir / "crash.txt")
    reported = _REPORTED.get(res.outcome)
    if reported is not None:
        if res.outcome == "skip" and res.message:
            reported += f" ({res.message})"
        res.after_result = reported
        res.outcome = "crashed"
        return
    note = f"then the child {res.ending()} during exit"
    if res.exception is not None:
        add_note(res.exception, note)
    res.message = f"{res.message} ({note})" if res.message else note


def isolate(
    fn: Callable[..., Any],
    args: tuple[Any, ...] = (),
    kwargs: Mapping[str, Any] | None = None,
    *,
    timeout: float = 180.0,
    env: Mapping[str, str | None] | None = None,
    method: str = "spawn",
    contexts: Mapping[str, Callable[[], AbstractContextManager[Any]]] | None = None,
    cwd: str | None = None,
    launcher: Launcher | None = None,
    mark_child: bool = True,
) -> IsolatedResult:
    """Run ``fn(*args, **kwargs)`` once in a fresh process; never raises for how it ended.

    ``contexts`` are entered in the child around fn; what each yields (filled in by the time
    it exits) comes back in ``result.extras`` under its key (``events`` -> ``result.events``).
    ``launcher`` (the plugin's own) overrides ``method``. ``mark_child``: see
    ``child_environ``.
    """
    launcher = launcher or get_launcher(method)
    token = secrets.token_hex(16)
    payload = dump_payload(
        {"fn": fn, "args": tuple(args), "kwargs": dict(kwargs or {}),
         "contexts": dict(contexts or {})}
    )
    res = IsolatedResult(method=launcher.name, timeout=timeout)
    try:
        workdir = workdirs.make("run")
    except OSError as exc:
        if exc.errno not in workdirs.DISK_ERRORS:
            raise
        res.message = workdirs.disk_message(exc.filename or workdirs.base(), exc.errno)
        return res
    handle: ChildHandle | None = None
    tracked: dict[int, psutil.Process] = {}
    try:
        try:
            (workdir / "meta.json").write_text(json.dumps({
                "sys_path": [p for p in sys.path if isinstance(p, str)], "token": token,
                # wall clock: the child's watchdog writes the stacks just before it
                "deadline": time.time() + timeout}))
            (workdir / "payload.pkl").write_bytes(payload)
        except OSError as exc:
            if exc.errno not in workdirs.DISK_ERRORS:
                raise
            res.message = workdirs.disk_message(workdir, exc.errno)
            return res  # outcome "error": nothing was started
        start = time.monotonic()
        handle = launcher.start(workdir, child_environ(env, mark_child), cwd or os.getcwd())
        res.pid = handle.pid
        res.notes.extend(getattr(handle, "notes", ()))
        reaper.register(handle.pid)
        deadline = start + timeout
        rc: int | None = None
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            rc = handle.wait(min(remaining, TRACK_INTERVAL_S))
            if rc is not None:
                break
            tracked.update((p.pid, p) for p in reaper.descendants(handle.pid))
        res.duration = time.monotonic() - start
        if rc is None:
            res.outcome = "timeout"
            res.extras["timeout_load"] = _load_at_timeout(
                [handle.pid, *tracked], res.duration)
            res.stack = _request_stack(handle.pid, workdir)
            tracked.update((p.pid, p) for p in reaper.descendants(handle.pid))
            ended = reaper.end_session(handle.pid, list(tracked.values()))
            rc = handle.wait(reaper.TERM_GRACE_S)
            if ended.get(handle.pid) is not None:  # the reaper collected our own child
                rc = ended[handle.pid]
        res.exitcode = rc
        if rc is not None and rc < 0:
            res.signal = -rc
        loaded = res.outcome != "timeout" and _load_result(workdir, token, res)
        if loaded and rc != 0:
            _ended_after_result(res, workdir)
        elif res.outcome != "timeout" and not loaded:
            res.outcome = "crashed"
            res.stack = _read_tail(workdir / "crash.txt")
            disk = DISK_ERRNO_OF_EXIT.get(rc or 0)
            if disk is not None:  # the child could not write its work folder
                res.outcome = "error"
                res.message = (f"the isolated child could not write its work folder: "
                               f"{workdirs.disk_message(workdir, disk)}")
            died = getattr(handle, "server_died", None)
            if died:  # not the child's doing: say whose
                res.outcome = "error"
                server = "spawn supervisor" if launcher.name == "spawn" else "forkserver"
                res.message = (f"the {server} that started this child died while it ran "
                               f"({died}); the child was ended with it")
        res.stdout = _read_tail(workdir / "stdout")
        res.stderr = _read_tail(workdir / "stderr")
        return res
    finally:
        if handle is not None:
            if handle.wait(0) is None:  # interrupted (Ctrl-C) while the child ran
                reaper.send(handle.pid, signal.SIGKILL)
                handle.wait(reaper.TERM_GRACE_S)
            reaper.end_session(handle.pid, list(tracked.values()))
            reaper.unregister(handle.pid)
        shutil.rmtree(workdir, ignore_errors=True)


def run_isolated(
    fn: Callable[..., Any],
    *args: Any,
    timeout: float = 180.0,
    env: Mapping[str, str | None] | None = None,
    method: str = "spawn",
    events: Sequence[str] | None = None,
    spoof: NpuSpoof | None = None,
    **kwargs: Any,
) -> IsolatedResult:
    """Run ``fn(*args, **kwargs)`` once in a fresh process and return its ``IsolatedResult``.

    ``events``: profiler event names or ``ns::`` prefixes to count while fn runs; the counts
    come back in ``result.events`` (``harness.stack.dispatch``). ``spoof``: a
    ``harness.hardware.NpuSpoof`` installed in the child only. ``timeout``, ``env``,
    ``method``, ``events`` and ``spoof`` are the harness's own keywords, never passed to fn.

    Raises what the child raised (rebuilt, with the child's traceback as a note), the same
    pytest outcome for skip / xfail / fail, ``ChildCrashed`` for a signal or an early exit,
    ``ChildTimeout`` (with the stacks) at ``timeout``, and ``ChildError`` for anything that
    cannot be rebuilt. Nothing the child started survives the call.
    """
    __tracebackhide__ = True
    return isolate(fn, args, kwargs, timeout=timeout, env=env, method=method,
                   contexts=child_contexts(events, spoof)).raise_for_outcome()


def child_contexts(events: Sequence[str] | None = None,
                   spoof: NpuSpoof | None = None) -> dict[str, Callable[[], Any]]:
    """Child-side contexts for the harness's own keywords: the spoof first (so a counted
    fn already sees the fake machine), then event counting."""
    contexts: dict[str, Callable[[], Any]] = {}
    if spoof is not None:
        contexts["spoof"] = spoof.installed
    if events:
        contexts["events"] = functools.partial(_count_events, tuple(events))
    return contexts


def _load_at_timeout(pids: list[int], wall: float) -> dict[str, Any]:
    """How loaded the machine was and how much CPU the child's processes used, at its
    timeout: a child that computed most of its wall time was slow (a loaded machine, big
    work); one that used little was waiting (a hang, a peer that never answered)."""
    import psutil

    cpu = 0.0
    for pid in dict.fromkeys(pids):
        try:
            times = psutil.Process(pid).cpu_times()
        except (psutil.Error, OSError):
            continue
        cpu += times.user + times.system
    try:
        load = os.getloadavg()[0]
    except OSError:
        load = -1.0
    return {"load_avg_1m": round(load, 2), "cores": os.cpu_count() or 1,
            "child_cpu_s": round(cpu, 2), "wall_s": round(wall, 2)}


def _count_events(patterns: tuple[str, ...]) -> Any:
    from harness.stack.dispatch import count_events

    return count_events(*patterns)
