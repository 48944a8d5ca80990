"""Ending a child and everything it started.

Each isolated child leads its own session (and so its own process group). Anything it
starts stays in that session unless it calls ``setsid`` itself, and the kernel never hands a
session id to a new process while any member lives, so "every process whose session id is
the child's pid" is exactly what the child left behind, even after the child itself is gone.
We add the child's live descendants (psutil) for the ones that changed session.

The registry of live children lets the plugin end them all when pytest itself is
interrupted (Ctrl-C, SIGTERM) instead of leaving them holding NPU memory and ports.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Callable

import psutil

#: grace between SIGTERM and SIGKILL when ending a child's group
TERM_GRACE_S = 3.0

_live: set[int] = set()
_live_lock = threading.Lock()


def register(sid: int) -> None:
    with _live_lock:
        _live.add(sid)


def unregister(sid: int) -> None:
    with _live_lock:
        _live.discard(sid)


def live_sessions() -> list[int]:
    with _live_lock:
        return sorted(_live)


def members(sid: int, extra: list[psutil.Process] | None = None) -> list[psutil.Process]:
    """Processes in session ``sid`` or process group ``sid``, plus ``extra`` still alive."""
    found: dict[int, psutil.Process] = {}
    me = os.getpid()
    for proc in psutil.process_iter():
        if proc.pid == me:
            continue
        try:
            if os.getsid(proc.pid) == sid or os.getpgid(proc.pid) == sid:
                found[proc.pid] = proc
        except (ProcessLookupError, PermissionError):
            continue
    for proc in extra or ():
        with contextlib.suppress(psutil.Error):
            if proc.is_running() and proc.pid != me:
                found.setdefault(proc.pid, proc)
    return list(found.values())


def descendants(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []


def end_session(sid: int, extra: list[psutil.Process] | None = None,
                grace: float = TERM_GRACE_S) -> dict[int, int | None]:
    """SIGTERM every member, wait ``grace`` seconds, SIGKILL the rest. Returns each ended
    pid with its exit status where this process collected it (our own children: Popen-style,
    negative for a signal), else None: a caller's own ``wait`` would then find nothing."""
    procs = members(sid, extra)
    if not procs:
        return {}
    return _end(procs, lambda: members(sid), grace)


def end_tree(pid: int, grace: float = TERM_GRACE_S) -> None:
    """End a process that does not lead a session of its own (a rank, a server) and every
    descendant it has, as ``end_session`` ends a session. Its own ``wait`` is the caller's
    (a Popen or a multiprocessing Process reaps its own child)."""
    try:
        root = psutil.Process(pid)
    except psutil.Error:
        return
    _end([root, *descendants(pid)], lambda: descendants(pid), grace)


def _end(procs: list[psutil.Process], again: Callable[[], list[psutil.Process]],
         grace: float) -> dict[int, int | None]:
    """The one ladder: SIGTERM ``procs``, ``grace`` seconds, SIGKILL the rest, then SIGKILL
    what ``again()`` finds (processes forked while we signalled)."""
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            proc.send_signal(signal.SIGTERM)
    gone, alive = psutil.wait_procs(procs, timeout=grace)
    for proc in alive:
        with contextlib.suppress(psutil.Error):
            proc.kill()
    gone += psutil.wait_procs(alive, timeout=grace)[0]
    late = again()
    for proc in late:
        with contextlib.suppress(psutil.Error):
            proc.kill()
    gone += psutil.wait_procs(late, timeout=grace)[0]
    status = {p.pid: None for p in procs + late}
    status.update({p.pid: _status(getattr(p, "returncode", None)) for p in gone})
    return status


def _status(code: int | None) -> int | None:
    return None if code is None else int(code)


def send(pid: int, sig: signal.Signals) -> bool:
    """Send ``sig`` to one process that may be gone already (a child asked for its stacks, a
    child ended at once when pytest is interrupted). False when it was gone. The package's
    one call of ``os.kill``: every signal the harness sends leaves from this module
    (tests/test_layers.py)."""
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        return False
    return True


def kill_now(procs: list[psutil.Process], wait: float = 2.0) -> None:
    """SIGKILL ``procs`` at once, no grace, and wait up to ``wait`` seconds for them: a child
    ending what it left behind as its last act (its own exit is already decided)."""
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            proc.kill()
    psutil.wait_procs(procs, timeout=wait)


def end_all_live(grace: float = 1.0) -> None:
    """End every registered child session: used when pytest itself is interrupted."""
    for sid in live_sessions():
        with contextlib.suppress(Exception):
            end_session(sid, descendants(sid), grace=grace)
        unregister(sid)
