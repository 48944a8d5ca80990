"""The leader's side of ranks across nodes through torchrun's elastic agent.

Node 0 (this process, inside the check's isolated child) hosts a ``TCPStore`` for the job
and its reports, puts the job there, and runs its own node's agent; the other nodes' agents
are started by ``npu-regress ranks-node --serve`` on each (a fleet) or, on loopback, here,
each under a host name of its own (``unshare --uts``; ``$NPU_REGRESS_NODE_ID`` where the
kernel refuses). It then reads every node's report: every rank's value with the node it ran
on, or the rank that died, raised or hung, named with its node and local rank. On any way
out it marks the job aborted (``--serve`` ends that job's processes on its node) and ends
what it started here.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import pickle
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Mapping
from datetime import timedelta
from pathlib import Path
from typing import Any

from harness.collectives import ranks
from harness.collectives.launchers import node
from harness.collectives.launchers.protocol import LaunchSpec
from harness.collectives.ranks import RankError, RankResult
from harness.stack.network import free_port

#: past the job's own time: a node's watchdog reads its stacks and reports, then this
REPORT_GRACE_S = 30.0
_POLL_S = 0.1
#: the host name each loopback node k > 0 gets
LOOPBACK_NAME = "npu-regress-node{k}"


@functools.cache
def _uts_namespaces() -> bool:
    """Whether this machine lets us give a process a host name of its own."""
    if not shutil.which("unshare"):
        return False
    probe = subprocess.run(["unshare", "--uts", "sh", "-c", "hostname npu-regress-probe"],
                           capture_output=True, timeout=30)
    return probe.returncode == 0


def as_node(name: str, cmd: list[str], env: dict[str, str]
            ) -> tuple[list[str], dict[str, str]]:
    """``cmd`` run as the node ``name`` on this machine: under that host name in a UTS
    namespace of its own, or, where the kernel refuses, with ``$NPU_REGRESS_NODE_ID``."""
    if _uts_namespaces():
        return ["unshare", "--uts", "sh", "-c", 'hostname "$0" && exec "$@"', name, *cmd], env
    return cmd, {**env, ranks.NODE_ID_ENV: name}


class TorchrunLauncher:
    def __init__(self, spec: LaunchSpec) -> None:
        self.spec = spec
        #: the job's store, held here only: dropped on the way out, so the port is free
        #: for the next job even while an error's traceback keeps this call's frames
        self._store: Any = None

    def _node_command(self, k: int, store: str) -> tuple[list[str], dict[str, str]]:
        cmd = [sys.executable, "-m", "harness.collectives.launchers.node", "--store", store,
               "--node-rank", str(k)]
        env = dict(os.environ)
        if k == 0 or not self.spec.loopback:
            return cmd, env
        return as_node(LOOPBACK_NAME.format(k=k), cmd, env)

    def run(self, fn: Callable[..., Any], args: tuple[Any, ...], *, world: int,
            backend: str, env: Mapping[str, str | None] | None = None,
            timeout: float = 120.0) -> list[RankResult]:
        import cloudpickle
        from torch.distributed import TCPStore

        spec = self.spec
        if world != spec.world:
            raise ValueError(f"world={world}: torchrun runs {spec.nnodes} node(s) x "
                             f"{spec.nproc_per_node} rank(s) = {spec.world}")
        if not spec.rdzv_endpoint:  # loopback: free ports, chosen per job
            here = "127.0.0.1"
            spec = dataclasses.replace(spec, rdzv_endpoint=f"{here}:{free_port(here)}",
                                       store_port=free_port(here))
        host, _ = spec.host_port()
        port = spec.results_port()
        job_id = f"npu-regress-{uuid.uuid4().hex[:12]}"
        body = cloudpickle.dumps({"fn": fn, "args": args, "env": dict(env or {}),
                                  "backend": backend, "timeout": timeout})
        job = {"id": job_id, "nnodes": spec.nnodes, "nproc": spec.nproc_per_node,
               "rdzv_endpoint": spec.rdzv_endpoint, "timeout": timeout, "body": body}
        self._store = TCPStore(host, port, is_master=True, wait_for_workers=False,
                               timeout=timedelta(seconds=30))
        self._store.set("job", pickle.dumps(job))
        logs = Path(tempfile.mkdtemp(prefix="npu-regress-nodes-"))
        here = range(spec.nnodes) if spec.loopback else range(1)
        procs: dict[int, subprocess.Popen[bytes]] = {}
        try:
            for k in here:
                cmd, node_env = self._node_command(k, f"{host}:{port}")
                with (logs / f"node{k}.log").open("wb") as log:
                    procs[k] = subprocess.Popen(cmd, env=node_env, stdout=log,
                                                stderr=subprocess.STDOUT)
            reports = self._collect(spec, job_id, procs, logs, timeout, backend)
            return _results(reports, world, backend, timeout)
        finally:
            with contextlib.suppress(Exception):
                self._store.set(f"{job_id}/abort", b"1")
            from harness.isolation.reaper import end_tree

            for proc in procs.values():
                end_tree(proc.pid, grace=2.0)
                proc.wait()
            self._store = None
            shutil.rmtree(logs, ignore_errors=True)

    def _collect(self, spec: LaunchSpec, job_id: str,
                 procs: dict[int, subprocess.Popen[bytes]], logs: Path, timeout: float,
                 backend: str) -> dict[int, dict[str, Any]]:
        """Every node's report, or a ``RankError`` naming the node that gave none."""
        n = spec.nnodes
        keys = {k: f"{job_id}/node{k}" for k in range(n)}
        wait = ranks.START_S + timeout + REPORT_GRACE_S
        deadline = time.monotonic() + wait
        gone: dict[int, float] = {}
        while True:
            missing = [k for k in range(n) if not self._store.check([keys[k]])]
            if not missing:
                return {k: node.take(self._store, keys[k]) for k in range(n)}
            now = time.monotonic()
            for k in missing:
                proc = procs.get(k)
                if proc is not None and proc.poll() is not None:
                    gone.setdefault(k, now)
                    if now - gone[k] > 2.0:  # its report would be there by now
                        tail = (logs / f"node{k}.log").read_text(errors="replace")[-3000:]
                        raise RankError(
                            f"node {k} of {n} ({backend}) {ranks.describe_exit(proc.returncode)}"
                            f" without a report; its log ends:\n{tail}",
                            k * spec.nproc_per_node)
            if now > deadline:
                raise RankError(
                    f"node(s) {', '.join(map(str, missing))} of {n} ({backend}) gave no report "
                    f"within {wait:.0f} s"
                    + ("" if spec.loopback else
                       ": is `npu-regress ranks-node --serve` running there, with --store "
                       f"{spec.host_port()[0]}:{spec.results_port()}?"),
                    missing[0] * spec.nproc_per_node)
            time.sleep(_POLL_S)


def _results(reports: dict[int, dict[str, Any]], world: int, backend: str,
             timeout: float) -> list[RankResult]:
    """Every rank's result from the nodes' reports, or the ``RankError`` they add up to."""
    where: dict[int, tuple[str, int, int]] = {}
    for k, report in reports.items():
        for rank, seen in report.get("ranks", {}).items():
            where[rank] = (report["node"], k, seen["local_rank"])
        for rank, value in report["values"].items():
            where[rank] = (value["node"], value["node_rank"], value["local_rank"])

    def place(rank: int) -> str:
        node, k, local = where.get(rank, ("?", -1, -1))
        return f" on node {node} (node rank {k}, local rank {local})"

    errors = sorted((r.get("error_at", 0.0), k) for k, r in reports.items() if r.get("error"))
    failed = [f["failed_at"] for r in reports.values() for f in r["failures"].values()]
    if errors and not (failed and min(failed) < errors[0][0]):
        k = errors[0][1]
        raise RankError(f"node {k} of {len(reports)} ({reports[k]['node']}) could not run its "
                        f"ranks: {reports[k]['error']}", k * (world // len(reports)))
    # a node whose agent failed after a rank did (its rendezvous lost with the other node's
    # agent) follows from that rank: the rank is named, the node's error said after it
    then = [f"  then node {k} ({reports[k]['node']}) could not run its ranks: "
            f"{reports[k]['error']}" for _, k in errors]
    codes: dict[int, int | None] = {r: None for r in range(world)}
    outs: dict[int, dict[str, Any] | None] = {}
    stacks: dict[int, str] = {}
    for report in reports.values():
        codes.update({rank: 0 for rank in report["values"]})
        for rank, failure in report["failures"].items():
            codes[rank] = failure["code"]
            outs[rank] = failure
        stacks.update(report.get("stacks", {}))
    if any(report["failures"] for report in reports.values()):
        first = min(outs, key=lambda r: outs[r]["failed_at"])  # type: ignore[index]
        error = ranks.name_failure(world, backend, codes, outs, first, stacks, place)
        if then:
            head, _, rest = str(error).partition("\n")
            error = RankError("\n".join([head, *then, *([rest] if rest else [])]),
                              error.rank, error.stacks)
        raise error
    if any(report["hung"] for report in reports.values()):
        live = sorted(r for r, c in codes.items() if c is None)
        raise ranks.name_hang(world, backend, timeout, live or sorted(stacks), stacks, place)
    results = []
    for rank in range(world):
        value = next((r["values"][rank] for r in reports.values() if rank in r["values"]),
                     None)
        if value is None:
            raise RankError(f"rank {rank} of {world} ({backend}) left no result", rank)
        results.append(RankResult(rank, value["value"], value["env_at_init"], value["node"],
                                  value["node_rank"], value["local_rank"]))
    return results
