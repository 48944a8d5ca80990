"""Spawned ranks with a process group each: the multi-process side of a collectives check.

Runs inside an isolated child (the check's own process), so the isolation core's guarantees
hold around it: the child is a subreaper and ends its descendants. Here each rank also dies
with its launcher (``PR_SET_PDEATHSIG``), the launcher ends every rank on any way out, and a
rank that dies or hangs is named: a rank killed by a signal is the cause and the ranks that
then failed in a collective its consequence; on a hang every rank's Python stack is read
(``faulthandler`` on SIGUSR1) and the rank that is not where the others wait is named.

The collective settings a switch sets (``HCCL_DETERMINISTIC``, ``NCCL_ALGO``...) are read
when the process group starts, so each rank applies its environment before
``init_process_group`` and reports what it saw there (``env_at_init``).
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import pickle
import shutil
import tempfile
import time
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from harness.isolation.child import STACK_SIGNAL
from harness.isolation.reaper import end_tree, send
from harness.isolation.result import signal_name

#: the process-group backend of each device kind
BACKENDS = {"npu": "hccl", "cuda": "nccl", "cpu": "gloo"}
#: how long a hung rank gets to write its stack after SIGUSR1
STACK_WAIT_S = 1.0
#: how long the other ranks get to end after the first one failed, before they are ended
SETTLE_S = 2.0
#: how long the ranks get to start (spawn, import torch) before the check's own timeout
#: starts: a loaded runner's slow start is not a hang
START_S = 300.0
_POLL_S = 0.05
#: the exit of a rank whose process ended by a cause its launcher does not report (a Ray
#: actor: a signal, the OOM killer); counted with the killed ranks as a cause
DIED = -(1 << 16)
#: a rank that raised and lives on (a Ray actor returns the error)
RAISED = 1 << 16
#: a node's id where host names do not tell nodes apart (containers on one host)
NODE_ID_ENV = "NPU_REGRESS_NODE_ID"


def backend_for(device_kind: str) -> str:
    """The process-group backend for the session's device kind (gloo on anything else)."""
    return BACKENDS.get(device_kind, "gloo")


class RankError(RuntimeError):
    """A rank died, raised or hung; ``rank`` is the one named as the cause."""

    def __init__(self, message: str, rank: int, stacks: dict[int, str] | None = None) -> None:
        super().__init__(message)
        self.rank = rank
        self.stacks = stacks or {}

    def __reduce__(self) -> tuple[Any, ...]:  # back from an isolated child whole
        return (type(self), (str(self), self.rank, self.stacks))


@dataclass
class RankResult:
    """What one rank returned, the collective environment it saw at init, and where it ran
    (its node's id, the node's rank among the nodes, its own rank on the node)."""

    rank: int
    value: Any
    env_at_init: dict[str, str | None]
    node: str = ""
    node_rank: int = 0
    local_rank: int = -1

    def place(self) -> str:
        return f"node {self.node} (node rank {self.node_rank}, local rank {self.local_rank})"


def node_id() -> str:
    """This machine's id among the nodes: ``$NPU_REGRESS_NODE_ID``, else its host name."""
    import socket

    return os.environ.get(NODE_ID_ENV) or socket.gethostname()


def describe_exit(code: int | None) -> str:
    if code is None:
        return "still running"
    if code == DIED:
        return "died (its process ended without a result)"
    if code == RAISED:
        return "raised"
    if code < 0:
        return f"was killed by {signal_name(-code)}"
    return f"exited with status {code}"


def apply_env(env: Mapping[str, str | None]) -> dict[str, str | None]:
    """Set (a value) or remove (None) each name, before the process group starts (the
    libraries read them at init); returns what the rank then sees."""
    for name, value in env.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    return {name: os.environ.get(name) for name in env}


def init_group(backend: str, device_index: int, timeout: float, **how: Any) -> None:
    """This rank's device (its index on the node), then its process group."""
    import torch.distributed as dist

    if backend == "hccl":
        import torch
        import torch_npu  # noqa: F401 - registers the hccl backend

        torch.npu.set_device(device_index)
    elif backend == "nccl":
        import torch

        torch.cuda.set_device(device_index)
    dist.init_process_group(backend, timeout=timedelta(seconds=timeout), **how)


def run_body(fn: Callable[..., Any], rank: int, world: int, args: tuple[Any, ...],
             failed_at: Path) -> Any:
    """``fn(rank, world, *args)``; the time it raised, if it did, written before the group
    is torn down: the rank that raised first is the cause, the others' broken connections
    follow from it."""
    import torch.distributed as dist

    try:
        return fn(rank, world, *args)
    except BaseException:
        failed_at.write_text(repr(time.time()))
        raise
    finally:
        with contextlib.suppress(Exception):
            dist.destroy_process_group()


def arm_stack(folder: Path, rank: int, local_rank: int = -1) -> Any:
    """A file this rank's Python stack is written to on ``STACK_SIGNAL`` (a hang); the
    ``armed`` file says which process it is and its rank on the node."""
    import faulthandler

    stack_file = (folder / f"rank{rank}.stack").open("w")
    faulthandler.register(STACK_SIGNAL, file=stack_file, all_threads=True)
    (folder / f"rank{rank}.armed").write_text(f"{os.getpid()} {local_rank}")
    return stack_file


def _rank_main(rank: int, world: int, backend: str, init_file: str, folder: str,
               body: bytes, env: Mapping[str, str | None], timeout: float) -> None:
    """One rank: its environment first, then the process group, then the body."""
    import cloudpickle

    from harness.isolation.child import collector_paused, die_with_parent

    die_with_parent()
    out = Path(folder)
    stack_file = arm_stack(out, rank)
    result: dict[str, Any] = {"env_at_init": apply_env(env)}
    code = 0
    try:
        with collector_paused():
            import torch.distributed  # noqa: F401

        (out / f"rank{rank}.ready").touch()  # imports done: the check's time starts
        init_group(backend, rank, timeout, init_method=f"file://{init_file}", rank=rank,
                   world_size=world)
        fn, args = cloudpickle.loads(body)
        result["value"] = run_body(fn, rank, world, args, out / f"rank{rank}.failed_at")
    except BaseException as exc:  # noqa: BLE001 - reported to the launcher, named by rank
        failed = out / f"rank{rank}.failed_at"
        result["failed_at"] = float(failed.read_text()) if failed.exists() else time.time()
        result["error"] = f"{type(exc).__name__}: {exc}"
        result["traceback"] = traceback.format_exc()
        code = 1
    (out / f"rank{rank}.tmp").write_bytes(pickle.dumps(result))
    (out / f"rank{rank}.tmp").rename(out / f"rank{rank}.out")
    stack_file.close()
    os._exit(code)


def _read(folder: Path, rank: int) -> dict[str, Any] | None:
    path = folder / f"rank{rank}.out"
    if not path.exists():
        return None
    return pickle.loads(path.read_bytes())


def read_stacks(pids: Mapping[int, int], folder: Path) -> dict[int, str]:
    """The Python stacks of the live ranks ``rank -> pid`` that armed their handler."""
    asked = []
    for rank, pid in pids.items():
        if (folder / f"rank{rank}.armed").exists() and send(pid, STACK_SIGNAL):
            asked.append(rank)
    time.sleep(STACK_WAIT_S if asked else 0)
    return {rank: (folder / f"rank{rank}.stack").read_text(errors="replace").strip()
            for rank in asked}


def _stacks(procs: list[Any], folder: Path) -> dict[int, str]:
    return read_stacks({r: p.pid for r, p in enumerate(procs) if p.exitcode is None}, folder)


def _innermost(stack: str) -> str:
    """The innermost frame of a faulthandler dump's first thread (its top line)."""
    for line in stack.splitlines():
        if line.strip().startswith("File "):
            return line.strip()
    return stack.splitlines()[0] if stack else "no stack"


def _odd_one(stacks: dict[int, str]) -> int | None:
    """The rank whose innermost frame differs from every other rank's, if exactly one."""
    tops = {rank: _innermost(stack) for rank, stack in stacks.items()}
    lone = [rank for rank, top in tops.items() if list(tops.values()).count(top) == 1]
    return lone[0] if len(lone) == 1 and len(tops) > 2 else None


def _end(procs: list[Any]) -> None:
    """Every rank ends here, whatever happened, with whatever it started (the isolation
    core's reaper: TERM, then KILL), then reaped."""
    for proc in procs:
        if proc.exitcode is None and proc.pid is not None:
            end_tree(proc.pid, grace=2.0)
    for proc in procs:
        proc.join(5.0)


def _here(rank: int) -> str:
    return ""


def name_failure(world: int, backend: str, codes: Mapping[int, int | None],
                 outs: Mapping[int, dict[str, Any] | None], first: int,
                 stacks: dict[int, str], place: Callable[[int], str] = _here) -> RankError:
    """The cause among the ranks that ended badly: one killed by a signal before one that
    raised (the others' connection errors follow from it), else the one that raised first,
    else the first seen. ``outs``: each rank's error, traceback and ``failed_at``;
    ``place(rank)``: where it ran (its node, on more than one)."""
    killed = [r for r, c in sorted(codes.items()) if c is not None and c < 0]
    raised = sorted((o["failed_at"], r) for r, o in outs.items() if o and "failed_at" in o)
    cause = killed[0] if killed else raised[0][1] if raised else first
    out = outs.get(cause) or {}
    what = out.get("error")
    lines = [f"rank {cause} of {world} ({backend}){place(cause)} "
             f"{describe_exit(codes.get(cause))}" + (f": {what}" if what else "")]
    for rank, code in sorted(codes.items()):
        if rank == cause or code == 0:
            continue
        err = (outs.get(rank) or {}).get("error")
        state = "was still waiting (ended by the launcher)" if code is None else \
            describe_exit(code)
        lines.append(f"  then rank {rank}{place(rank)} {state}" + (f": {err}" if err else ""))
    if out.get("traceback"):
        lines.append(out["traceback"].rstrip())
    return RankError("\n".join(lines), cause, stacks)


def name_hang(world: int, backend: str, timeout: float, live: list[int],
              stacks: dict[int, str], place: Callable[[int], str] = _here) -> RankError:
    """The hung rank: the one not where the others wait, else the first still running."""
    odd = _odd_one(stacks)
    named = odd if odd is not None else live[0]
    head = (f"rank {named} of {world} ({backend}){place(named)} hung: after {timeout:.0f} s "
            f"it was at {_innermost(stacks.get(named, ''))}")
    if odd is not None:
        others = sorted(r for r in stacks if r != odd)
        head += (f"; ranks {', '.join(map(str, others))} waited at "
                 f"{_innermost(stacks[others[0]])}")
    elif len(live) > 1:
        head += f" (ranks {', '.join(map(str, live))} all still running)"
    body = "\n".join(f"--- rank {r}{place(r)} ---\n{s}" for r, s in sorted(stacks.items()))
    return RankError(f"{head}\n{body}", named, stacks)


def _failure(procs: list[Any], folder: Path, first: int, backend: str) -> RankError:
    deadline = time.monotonic() + SETTLE_S
    while time.monotonic() < deadline and any(p.exitcode is None for p in procs):
        time.sleep(_POLL_S)
    stacks = _stacks(procs, folder)
    codes = {r: p.exitcode for r, p in enumerate(procs)}
    outs = {r: _read(folder, r) for r in range(len(procs))}
    return name_failure(len(procs), backend, codes, outs, first, stacks)


def _hung(procs: list[Any], folder: Path, timeout: float, backend: str) -> RankError:
    stacks = _stacks(procs, folder)
    live = [r for r, p in enumerate(procs) if p.exitcode is None]
    return name_hang(len(procs), backend, timeout, live, stacks)


def run_ranks(fn: Callable[..., Any], args: tuple[Any, ...] = (), *, world: int,
              backend: str, env: Mapping[str, str | None] | None = None,
              timeout: float = 120.0) -> list[RankResult]:
    """``fn(rank, world, *args)`` on ``world`` spawned ranks that share one process group.

    ``env``: set (a value) or removed (None) in each rank before the group starts.
    ``timeout`` counts from when every rank has started (imported torch), so a loaded
    runner's slow start is not a hang. Returns each rank's value; raises ``RankError`` naming
    the rank that died, raised or hung. No rank outlives this call.
    """
    import cloudpickle

    if world < 1:
        raise ValueError(f"world={world}: a process group needs at least one rank")
    folder = Path(tempfile.mkdtemp(prefix="npu-regress-ranks-"))
    body = cloudpickle.dumps((fn, args))
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_rank_main, name=f"npu-regress-rank{rank}",
                         args=(rank, world, backend, str(folder / "init"), str(folder), body,
                               dict(env or {}), timeout))
             for rank in range(world)]
    try:
        for proc in procs:
            proc.start()
        started = time.monotonic()
        deadline = None
        while True:
            codes = [p.exitcode for p in procs]
            bad = [r for r, c in enumerate(codes) if c not in (None, 0)]
            if bad:
                raise _failure(procs, folder, bad[0], backend)
            if all(c == 0 for c in codes):
                break
            now = time.monotonic()
            if deadline is None:
                ready = [(folder / f"rank{r}.ready").exists() or codes[r] is not None
                         for r in range(world)]
                if all(ready):
                    deadline = now + timeout
                elif now - started > START_S:
                    late = [r for r, ok in enumerate(ready) if not ok]
                    raise RankError(f"rank {late[0]} of {world} ({backend}) did not start "
                                    f"within {START_S:.0f} s (ranks {late} not ready)",
                                    late[0], _stacks(procs, folder))
            elif now > deadline:
                raise _hung(procs, folder, timeout, backend)
            time.sleep(_POLL_S)
        results = []
        for rank in range(world):
            out = _read(folder, rank)
            if out is None or "value" not in out:
                raise RankError(f"rank {rank} of {world} ({backend}) exited with status 0 "
                                "but left no result", rank)
            results.append(RankResult(rank, out["value"], out["env_at_init"], node_id(), 0,
                                      rank))
        return results
    finally:
        _end(procs)
        shutil.rmtree(folder, ignore_errors=True)
