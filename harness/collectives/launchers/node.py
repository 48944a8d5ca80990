"""One node's part of a torchrun job: torch's elastic agent (``elastic_launch``, what
``torchrun`` runs) with this node's ranks, its report put in the leader's store.

The leader (``torchrun.TorchrunLauncher``) puts the job in a ``TCPStore`` it hosts; every
node reads it, runs ``nproc_per_node`` ranks under the agent, meeting the other nodes at
the job's c10d rendezvous, and puts back its report: each rank's value, or the agent's
failures (exit status or signal, the error and its traceback, when it raised), or, past the
job's time, every live rank's stack. ``--serve`` keeps a fleet's other nodes taking jobs
(``npu-regress ranks-node``); each job runs in its own process, ended with all it started
when the leader aborts the job or goes away.
"""

from __future__ import annotations

import argparse
import os
import pickle
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import psutil

from harness.collectives import ranks

#: how long a node waits for the leader's store before giving up (a job), or idles (--serve)
CONNECT_S = ranks.START_S
_POLL_S = 0.2


def connect(host: str, port: int, wait_s: float) -> Any:
    """A client of the leader's store, retried while the leader is not up yet."""
    from torch.distributed import TCPStore

    deadline = time.monotonic() + wait_s
    while True:
        try:
            return TCPStore(host, port, is_master=False, timeout=timedelta(seconds=30),
                            wait_for_workers=False)
        except (RuntimeError, OSError, TimeoutError):
            if time.monotonic() > deadline:
                raise
            time.sleep(1.0)


def _local(folder: Path) -> dict[int, dict[str, int]]:
    """This node's ranks (global rank -> pid, local rank), as they armed themselves."""
    found = {}
    for armed in folder.glob("rank*.armed"):
        rank = int(armed.name[4:-6])
        pid, _, local = armed.read_text().partition(" ")
        found[rank] = {"pid": int(pid), "local_rank": int(local or -1)}
    return found


def _error(failure: Any) -> tuple[str, str]:
    """(error, traceback) from a ``ProcessFailure`` (a signal has no error file)."""
    data = failure.error_file_data if isinstance(failure.error_file_data, dict) else {}
    message = data.get("message") or failure.message
    if isinstance(message, dict):
        return (str(message.get("message", "")),
                str(message.get("extraInfo", {}).get("py_callstack", "")))
    return (str(message) if message not in (None, "<NONE>") else "", "")


def _failures(folder: Path, agent: dict[int, Any]) -> dict[int, dict[str, Any]]:
    """Every local rank that failed: the agent's one (its exit status or signal) and those
    that raised, from their own files (the agent stops the rest after the first)."""
    found = {}
    for rank in sorted(set(_local(folder)) | set(agent)):
        mine = folder / f"rank{rank}.error"
        if rank not in agent and not mine.exists():
            continue  # ended by the agent after another rank failed
        error, trace = pickle.loads(mine.read_bytes()) if mine.exists() else \
            _error(agent[rank])
        failed_at = folder / f"rank{rank}.failed_at"
        found[rank] = {"code": agent[rank].exitcode if rank in agent else 1, "error": error,
                       "traceback": trace,
                       "failed_at": float(failed_at.read_text()) if failed_at.exists()
                       else float(agent[rank].timestamp if rank in agent else time.time())}
    return found


def _watch(folder: Path, nproc: int, timeout: float, report: dict[str, Any],
           publish: Any) -> None:
    """Past the job's time (counted from when this node's ranks started), every live rank's
    stack goes in the report, the report out, and the node ends with all it started."""
    from harness.isolation.reaper import end_tree

    started = time.monotonic()
    while len(list(folder.glob("rank*.ready"))) < nproc:
        if time.monotonic() - started > ranks.START_S:
            break
        time.sleep(_POLL_S)
    time.sleep(timeout)
    live = {r: p["pid"] for r, p in _local(folder).items()}
    hung = {**report, "hung": True, "stacks": ranks.read_stacks(live, folder),
            "ranks": _local(folder)}
    if not publish(hung):
        return  # the job finished while the stacks were read: its own report stands
    for child in psutil.Process().children():
        end_tree(child.pid, grace=1.0)
    shutil.rmtree(folder, ignore_errors=True)
    os._exit(0)


def run_job(job: dict[str, Any], node_rank: int, publish: Any) -> None:
    """This node's ranks of ``job`` under the elastic agent; the report to ``publish``."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    from harness.collectives.launchers import rank as rank_main

    folder = Path(tempfile.mkdtemp(prefix=f"npu-regress-node{node_rank}-"))
    job_file = folder / "job"
    job_file.write_bytes(job["body"])
    report: dict[str, Any] = {"node_rank": node_rank, "node": ranks.node_id(), "values": {},
                              "failures": {}, "hung": False, "stacks": {}, "error": None}
    threading.Thread(target=_watch, args=(folder, job["nproc"], job["timeout"], report,
                                          publish), daemon=True).start()
    config = LaunchConfig(
        min_nodes=job["nnodes"], max_nodes=job["nnodes"], nproc_per_node=job["nproc"],
        run_id=job["id"], rdzv_backend="c10d", rdzv_endpoint=job["rdzv_endpoint"],
        rdzv_configs={"is_host": node_rank == 0, "join_timeout": int(ranks.START_S)},
        max_restarts=0, start_method="spawn", monitor_interval=0.05)
    try:
        report["values"] = elastic_launch(config, rank_main.main)(str(job_file), str(folder))
    except ChildFailedError as exc:
        report["failures"] = _failures(folder, exc.failures)
    except Exception as exc:  # noqa: BLE001 - the rendezvous or the agent: named by node
        report["error"] = f"{type(exc).__name__}: {exc}"
        report["error_at"] = time.time()  # against a rank's ``failed_at``: which came first
    report["ranks"] = _local(folder)
    publish(report)
    shutil.rmtree(folder, ignore_errors=True)


def _key(job_id: str, node_rank: int) -> str:
    return f"{job_id}/node{node_rank}"


#: a store value's size limit is 8 MiB (c10d's libuv server): a report goes in parts
PART_BYTES = 4 << 20


def put(store: Any, key: str, value: Any) -> None:
    """``value`` under ``key`` in parts the store takes; ``key`` itself (the part count)
    last, so that a reader who sees it finds every part."""
    data = pickle.dumps(value)
    parts = [data[i:i + PART_BYTES] for i in range(0, len(data), PART_BYTES)] or [b""]
    for i, part in enumerate(parts):
        store.set(f"{key}/part{i}", part)
    store.set(key, str(len(parts)))


def take(store: Any, key: str) -> Any:
    """What ``put`` left under ``key``."""
    count = int(store.get(key))
    return pickle.loads(b"".join(store.get(f"{key}/part{i}") for i in range(count)))


def once(host: str, port: int, node_rank: int) -> int:
    """Read the leader's job, run this node's part, put the report back."""
    store = connect(host, port, CONNECT_S)
    job = pickle.loads(store.get("job"))
    lock = threading.Lock()
    sent: list[bool] = []

    def publish(report: dict[str, Any]) -> bool:
        """The node's one report: the first to come (the job's end or its watchdog's)."""
        with lock:
            if sent:
                return False
            put(store, _key(job["id"], node_rank), report)
            sent.append(True)
            return True

    run_job(job, node_rank, publish)
    return 0


def serve(host: str, port: int, node_rank: int, idle_s: float) -> int:
    """Take the leader's jobs one after another, each in its own process; end when the
    leader has had no store up for ``idle_s`` seconds."""
    from harness.isolation.reaper import end_tree

    done: set[str] = set()
    last = time.monotonic()
    while time.monotonic() - last < idle_s:
        try:
            store = connect(host, port, 0)
            job = pickle.loads(store.get("job"))
        except (RuntimeError, OSError, TimeoutError):
            time.sleep(1.0)
            continue
        if job["id"] in done:
            time.sleep(1.0)
            continue
        done.add(job["id"])
        child = subprocess.Popen([sys.executable, "-m", __name__, "--store", f"{host}:{port}",
                                  "--node-rank", str(node_rank)])
        try:
            while child.poll() is None:
                try:
                    if store.check([f"{job['id']}/abort"]):
                        break
                except (RuntimeError, OSError):  # the leader's store went away
                    break
                time.sleep(_POLL_S)
        finally:
            end_tree(child.pid, grace=2.0)
            child.wait()
        last = time.monotonic()
    return 0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--store", required=True, metavar="HOST:PORT",
                        help="the leader's results store: node 0's address, port = the "
                        "rendezvous port + 1 unless --ranks-store-port set it")
    parser.add_argument("--node-rank", type=int, required=True, metavar="K",
                        help="this node's rank among the nodes (1 .. nnodes-1; node 0 runs "
                        "the checks)")
    parser.add_argument("--serve", action="store_true",
                        help="take jobs until the leader has had no store up for --idle-exit")
    parser.add_argument("--idle-exit", type=float, default=600.0, metavar="SECONDS")


def main(args: argparse.Namespace) -> int:
    host, _, port = args.store.rpartition(":")
    if not host or not port.isdigit():
        print(f"npu-regress ranks-node: --store {args.store!r}: give HOST:PORT, e.g. "
              "10.0.0.1:29401", file=sys.stderr)
        return 2
    if args.serve:
        return serve(host, int(port), args.node_rank, args.idle_exit)
    from harness.isolation.child import die_with_parent

    die_with_parent()  # a node the leader started ends with it
    return once(host, int(port), args.node_rank)


if __name__ == "__main__":
    _parser = argparse.ArgumentParser(prog="python -m harness.collectives.launchers.node")
    add_arguments(_parser)
    sys.exit(main(_parser.parse_args()))
