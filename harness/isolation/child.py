"""The child side of isolation: run one shipped callable once and write back how it ended.

The parent (``harness.isolation.run``) prepares a work directory:

- ``meta.json``: the parent's ``sys.path`` and a one-time token;
- ``payload.pkl``: the callable, its arguments and child-side contexts, cloudpickled.

The child writes ``result.pkl`` only after fn has really run, echoing the token. A child
that never ran fn therefore cannot produce a result, and the parent reports it as crashed:
the "every test passes because the child never ran it" bug cannot happen silently.

Faulthandler writes crash stacks to ``crash.txt`` and, on SIGUSR1 (sent by the parent at
timeout), the stacks of every thread to ``stack.txt``.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import faulthandler
import functools
import gc
import json
import os
import pickle
import signal
import sys
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

#: the harness package's folder (this file is in harness/isolation/)
_HARNESS_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep

#: exit codes of a child that could not write its work folder, by errno: the folder is on
#: a full (or read-only) filesystem, so no message can be written there; the parent names
#: the cause, the path and the free space (``harness.isolation.run``)
DISK_EXITS = {errno.ENOSPC: 201, errno.EDQUOT: 202, errno.EROFS: 203}
#: the errno each of those exit codes stands for
DISK_ERRNO_OF_EXIT = {code: err for err, code in DISK_EXITS.items()}

#: SIGUSR1 asks the child for its stacks (parent side: ``harness.isolation.run``).
STACK_SIGNAL = signal.SIGUSR1
#: the file the child creates once STACK_SIGNAL is handled (the parent sends it only then)
ARMED = "stack-armed"
_PR_SET_PDEATHSIG = 1


@functools.cache
def _libc() -> Any:
    """This process's C library, loaded once (a forked child inherits the server's)."""
    return ctypes.CDLL(None, use_errno=True)


def die_with_parent() -> None:
    """Ask the kernel to SIGKILL us if the parent dies (Linux), so a killed pytest leaks nothing."""
    with contextlib.suppress(OSError, AttributeError):
        _libc().prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Python's cyclic collector off while a process of ours imports its stack, on again
    after. An import of torch makes hundreds of thousands of objects, and every pass of the
    oldest generation walks all of them again: measured here, ``import torch.distributed``
    1.25-1.8 s of CPU with it, 1.05 s without. Nothing is lost: the first collection after
    the import sees every cycle it made. Only around our own start-up imports (a rank's, a
    forkserver's preload), never around a check's body."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


_PR_SET_CHILD_SUBREAPER = 36


def become_subreaper() -> None:
    """Orphans below us (a setsid'd grandchild whose parent exited, a double-forked daemon)
    are re-parented to us instead of init, so they stay our descendants (Linux)."""
    with contextlib.suppress(OSError, AttributeError):
        _libc().prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def _descendants(pid: int, prune: frozenset[int] = frozenset()) -> list[int] | None:
    """Every pid below ``pid`` but those in ``prune`` and what is below them, from the
    kernel's per-thread ``children`` lists (a few file reads, where a scan of all of /proc
    costs milliseconds per check); None where the kernel has no such lists."""
    found: list[int] = []
    todo = [pid]
    while todo:
        parent = todo.pop()
        try:
            tasks = os.listdir(f"/proc/{parent}/task")
        except OSError:
            continue
        for tid in tasks:
            try:
                with open(f"/proc/{parent}/task/{tid}/children") as fh:
                    kids = [int(k) for k in fh.read().split()]
            except FileNotFoundError:
                if parent == pid:
                    return None
                kids = []
            except OSError:
                kids = []
            kids = [k for k in kids if k not in prune]
            found.extend(kids)
            todo.extend(kids)
    return found


def end_descendants(keep: frozenset[int] = frozenset()) -> None:
    """SIGKILL every process below this one but ``keep`` and what is below those (the
    forkserver's spare child; its branches, each serving children of its own), and reap
    them: with ``become_subreaper`` that is everything started below us, whatever session
    it moved to. Repeated while new orphans appear (a process that forked while we killed
    its parent is adopted by us)."""
    for _ in range(5):
        pids = _descendants(os.getpid(), keep)
        if pids == []:
            return
        import psutil

        from harness.isolation import reaper

        procs: list[psutil.Process] = []
        if pids is None:
            kept = set(keep)
            for pid in keep:
                with contextlib.suppress(psutil.Error):
                    kept.update(p.pid for p in psutil.Process(pid).children(recursive=True))
            with contextlib.suppress(psutil.Error):
                procs = [p for p in psutil.Process().children(recursive=True)
                         if p.pid not in kept]
        for pid in pids or ():
            with contextlib.suppress(psutil.Error):
                procs.append(psutil.Process(pid))
        if not procs:
            return
        reaper.kill_now(procs)


def _arm_faulthandler(workdir: Path) -> list[Any]:
    crash = open(workdir / "crash.txt", "w")  # noqa: SIM115 - must outlive this function
    stack = open(workdir / "stack.txt", "w")  # noqa: SIM115
    faulthandler.enable(file=crash, all_threads=True)
    faulthandler.register(STACK_SIGNAL, file=stack, all_threads=True, chain=False)
    # from now on STACK_SIGNAL dumps stacks; before, its default action would kill the child
    (workdir / ARMED).touch()
    return [crash, stack]


def _outcome_of(exc: BaseException) -> str | None:
    """Map pytest's outcome exceptions (skip, xfail, fail) without importing pytest: its
    public ``pytest.skip.Exception`` and friends, where the child has pytest loaded."""
    pytest = sys.modules.get("pytest")
    for kind, fn in (("skip", "skip"), ("xfail", "xfail"), ("fail", "fail")):
        cls = getattr(getattr(pytest, fn, None), "Exception", None)
        if isinstance(cls, type) and isinstance(exc, cls):
            return kind
    return None


def _qualname(obj_type: type) -> str:
    module = obj_type.__module__
    return obj_type.__qualname__ if module == "builtins" else f"{module}.{obj_type.__qualname__}"


def _pack(obj: Any) -> tuple[bytes | None, str]:
    """cloudpickle obj and prove it loads again; return (bytes, "") or (None, why not)."""
    import cloudpickle

    try:
        data = cloudpickle.dumps(obj)
        cloudpickle.loads(data)
        return data, ""
    except BaseException as exc:  # noqa: BLE001 - any failure means "cannot travel"
        return None, f"{type(exc).__name__}: {exc}"


def synchronize_devices() -> None:
    """Wait for the device work fn queued (NPU and CUDA kernels run asynchronously, and
    their errors surface at the next synchronisation): a kernel that faults fails the check
    that launched it, before its result is written, not a later check or the exit."""
    torch = sys.modules.get("torch")
    if torch is None:
        return
    for name in ("npu", "cuda"):
        backend = getattr(torch, name, None)
        initialised = getattr(backend, "is_initialized", None)
        if callable(initialised) and initialised():
            backend.synchronize()


def execute(payload: dict[str, Any], result: dict[str, Any]) -> None:
    """Run fn once inside the payload's contexts, filling ``result`` in place."""
    fn = payload["fn"]
    contexts = payload.get("contexts") or {}
    with contextlib.ExitStack() as stack:
        entered = {name: stack.enter_context(factory()) for name, factory in contexts.items()}
        try:
            value = fn(*payload.get("args", ()), **payload.get("kwargs", {}))
            synchronize_devices()
        except SystemExit:
            raise  # sys.exit() in fn: the process ends with that code and no result
        except BaseException as exc:  # noqa: BLE001 - every ending must be reported
            _record_exception(exc, result)
        else:
            data, why = _pack(value)
            if data is None:
                result.update(
                    kind="error",
                    exc_type="harness.ChildError",
                    message=(
                        f"isolated fn returned a value of type {_qualname(type(value))} "
                        f"that cannot be sent back to the parent ({why}); return plain data "
                        "(numbers, strings, lists, dicts, tensors moved to CPU) instead"
                    ),
                )
            else:
                result.update(kind="returned", value=data)
    # contexts have exited: what they yielded is final now (e.g. event counts)
    result["extras"] = {name: value for name, value in entered.items() if value is not None}


def _record_exception(exc: BaseException, result: dict[str, Any]) -> None:
    # drop our own frames (execute, a whole test's runner) so the traceback starts in the
    # user's code
    frames = exc.__traceback__
    while frames is not None and frames.tb_frame.f_code.co_filename.startswith(_HARNESS_DIR):
        frames = frames.tb_next
    frames = frames or exc.__traceback__
    tb = "".join(traceback.format_exception(type(exc), exc, frames))
    outcome = _outcome_of(exc)
    if outcome is not None:
        result.update(kind=outcome, message=str(getattr(exc, "msg", exc) or ""),
                      pytrace=bool(getattr(exc, "pytrace", True)), traceback=tb)
        return
    data, why = _pack(exc)
    result.update(kind="raised", exc_type=_qualname(type(exc)), traceback=tb,
                  message=str(exc))
    if data is None:
        result.update(
            kind="error",
            message=(
                f"isolated fn raised {_qualname(type(exc))}: {exc} "
                f"(the exception itself cannot be sent back: {why})"
            ),
        )
    else:
        result["exception"] = data


#: how long before the parent's deadline the watchdog writes every thread's stack
WATCHDOG_LEAD_S = 1.0


def _arm_watchdog(stack_file: Any, deadline: float | None) -> None:
    """faulthandler's own watchdog thread writes every thread's stack to ``stack.txt``
    shortly before the parent's deadline (wall clock): timeout stacks then depend on no
    signal that the code under test could take over (its own SIGUSR1 handler)."""
    if deadline is None:
        return
    import time

    delay = max(deadline - time.time() - WATCHDOG_LEAD_S, 0.5 * (deadline - time.time()))
    if delay > 0:
        faulthandler.dump_traceback_later(delay, repeat=False, file=stack_file, exit=False)


def main(workdir: str) -> None:
    try:
        _main(workdir)
    except OSError as exc:
        exit_for_disk_error(exc)
        raise


def exit_for_disk_error(exc: OSError) -> None:
    """Exit with the code that names ``exc``'s errno when the work folder's filesystem is
    full or read-only (nothing can be written there to say so); return for anything else."""
    code = DISK_EXITS.get(exc.errno or 0)
    if code is not None:
        with contextlib.suppress(Exception):
            sys.stderr.flush()
        os._exit(code)


def _main(workdir: str) -> None:
    wd = Path(workdir)
    die_with_parent()
    become_subreaper()
    keep = _arm_faulthandler(wd)  # noqa: F841 - the files must stay open
    with contextlib.suppress(AttributeError, ValueError):
        sys.stdout.reconfigure(line_buffering=True)
    meta = json.loads((wd / "meta.json").read_text())
    sys.path[:] = meta["sys_path"]
    _arm_watchdog(keep[1], meta.get("deadline"))
    threads = os.environ.get("HARNESS_TORCH_THREADS")
    if threads and "torch" in sys.modules:  # forked from a server that imported torch
        with contextlib.suppress(Exception):
            sys.modules["torch"].set_num_threads(int(threads))
    result: dict[str, Any] = {"token": meta["token"], "pid": os.getpid()}
    try:
        import cloudpickle

        payload = cloudpickle.loads((wd / "payload.pkl").read_bytes())
    except BaseException as exc:  # noqa: BLE001
        result.update(
            kind="error",
            exc_type=_qualname(type(exc)),
            message=f"the isolated callable could not be loaded in the child: {exc}",
            traceback=traceback.format_exc(),
        )
    else:
        try:
            execute(payload, result)
        except SystemExit:
            raise
        except BaseException as exc:  # noqa: BLE001 - a context failed to enter or exit
            result.update(
                kind="error",
                exc_type=_qualname(type(exc)),
                message=f"isolation context failed in the child: {type(exc).__name__}: {exc}",
                traceback=traceback.format_exc(),
            )
    tmp = wd / "result.pkl.tmp"
    tmp.write_bytes(pickle.dumps(result))
    tmp.rename(wd / "result.pkl")
    sys.stdout.flush()
    sys.stderr.flush()
    # Nothing fn started outlives it: end it before the parent hears that we ended.
    end_descendants()
    # Skip interpreter teardown: threads fn left behind, or device runtimes that crash at
    # exit, must not turn a finished check into a hang; the result is already written.
    os._exit(0)


if __name__ == "__main__":  # pragma: no cover - entry used by spawn
    main(sys.argv[1])
