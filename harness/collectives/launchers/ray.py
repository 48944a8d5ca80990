"""Ranks as Ray actors across a Ray cluster's nodes (verl places its workers this way).

``nproc_per_node`` actors on each of ``nnodes`` alive nodes (node affinity, the driver's node
first); each applies the job's environment, starts its group on rank 0's store (which
rank 0 binds to a port the kernel picks, so no other process can take it first) and runs
the body. A node is its Ray node id, which Ray gives every raylet, so two raylets on one host
are two nodes. On loopback this process starts the cluster itself (Ray's own
``cluster_utils.Cluster``: a head and ``nnodes - 1`` worker nodes); otherwise it joins the
one at ``ray_address``. A rank whose actor died, raised or hung is named with its node; every
actor is killed on the way out, and a loopback cluster shut down.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
import traceback
from collections.abc import Callable, Mapping
from typing import Any

from harness.collectives import ranks
from harness.collectives.launchers.protocol import LaunchSpec
from harness.collectives.ranks import RankError, RankResult

_POLL_S = 0.1


class _Rank:
    """One rank, a Ray actor (two threads: the body, and a stack read while it hangs)."""

    def __init__(self) -> None:
        from harness.isolation.child import die_with_parent

        die_with_parent()
        self.body_thread: int | None = None
        self.store: Any = None

    def where(self) -> dict[str, Any]:
        """Where this rank runs; it imports torch here, so that the check's time counts
        from ranks that have started (a loaded runner's slow import is not a hang)."""
        import socket

        import ray

        from harness.isolation.child import collector_paused

        with collector_paused():
            import torch.distributed  # noqa: F401

        return {"node_id": ray.get_runtime_context().get_node_id(), "pid": os.getpid(),
                "host": socket.gethostname(), "ip": ray.util.get_node_ip_address()}

    def open_store(self, host: str, world: int, env: Mapping[str, str | None],
                   timeout: float) -> int:
        """Rank 0's store, its port bound here and now (port 0: the kernel's choice), so no
        other process can take it between a port being picked and bound; after the job's
        environment, as the group start would see it."""
        from datetime import timedelta

        import torch.distributed as dist

        ranks.apply_env(env)
        self.store = dist.TCPStore(host, 0, world, is_master=True,
                                   timeout=timedelta(seconds=timeout), wait_for_workers=False)
        return int(self.store.port)

    def run(self, body: bytes, rank: int, world: int, local: int, node_rank: int,
            backend: str, store_at: tuple[str, int], timeout: float) -> dict[str, Any]:
        import threading
        from datetime import timedelta

        import cloudpickle
        import torch.distributed as dist

        self.body_thread = threading.get_ident()
        when = _When()
        try:  # everything that can raise, so that a raise is never read as a death
            fn, args, env = cloudpickle.loads(body)
            # the variables torchrun gives a rank, so a body reads its place the same way
            os.environ.update(RANK=str(rank), LOCAL_RANK=str(local), WORLD_SIZE=str(world),
                              GROUP_RANK=str(node_rank))
            seen = ranks.apply_env(env)
            limit = timeout + ranks.START_S
            store = self.store if rank == 0 else dist.TCPStore(
                *store_at, world, is_master=False, timeout=timedelta(seconds=limit))
            ranks.init_group(backend, local, limit, store=dist.PrefixStore("default_pg", store),
                             rank=rank, world_size=world)
            value = ranks.run_body(fn, rank, world, args, when)
        except BaseException as exc:  # noqa: BLE001 - named by rank in the driver
            return {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc(),
                    "failed_at": float(when.text or time.time())}
        return {"value": value, "env_at_init": seen}

    def stack(self) -> str:
        """The body's stack, innermost first, as faulthandler writes it."""
        frame = sys._current_frames().get(self.body_thread or -1)
        lines = []
        while frame is not None:
            code = frame.f_code
            lines.append(f'  File "{code.co_filename}", line {frame.f_lineno} in {code.co_name}')
            frame = frame.f_back
        return "\n".join(["Current thread (most recent call first):", *lines])


class _When:
    """``run_body``'s "when it raised" file, kept in memory: the actor returns it (before
    the group was torn down, which is when the other ranks' connections broke)."""

    text = ""

    def write_text(self, text: str) -> None:
        self.text = text


class RayLauncher:
    def __init__(self, spec: LaunchSpec) -> None:
        self.spec = spec

    def run(self, fn: Callable[..., Any], args: tuple[Any, ...], *, world: int,
            backend: str, env: Mapping[str, str | None] | None = None,
            timeout: float = 120.0) -> list[RankResult]:
        import cloudpickle
        import ray

        spec = self.spec
        if world != spec.world:
            raise ValueError(f"world={world}: Ray runs {spec.nnodes} node(s) x "
                             f"{spec.nproc_per_node} rank(s) = {spec.world}")
        cluster = None
        actors: list[Any] = []
        try:
            if spec.loopback:
                from ray.cluster_utils import Cluster

                cluster = Cluster(initialize_head=True, head_node_args={
                    "num_cpus": spec.nproc_per_node, "include_dashboard": False})
                for _ in range(spec.nnodes - 1):
                    cluster.add_node(num_cpus=spec.nproc_per_node)
                ray.init(address=cluster.address, log_to_driver=False)
                cluster.wait_for_nodes()
            else:
                ray.init(address=spec.ray_address or "auto", log_to_driver=False)
            nodes = _nodes(ray)
            if len(nodes) < spec.nnodes:
                raise RankError(f"the Ray cluster at {spec.ray_address or 'auto'} has "
                                f"{len(nodes)} alive node(s); {spec.nnodes} claimed "
                                "(--ranks-nnodes)", 0)
            actors = _start(ray, nodes[:spec.nnodes], spec.nproc_per_node)
            where = ray.get([a.where.remote() for a in actors], timeout=ranks.START_S)
            host = where[0]["ip"]
            try:
                port = ray.get(actors[0].open_store.remote(host, world, dict(env or {}),
                                                           timeout + ranks.START_S),
                               timeout=ranks.START_S)
            except ray.exceptions.RayTaskError as exc:  # a rank's failure, named as one
                raise RankError(f"rank 0 of {world} ({backend}){_place(where)(0)} could not "
                                f"open the job's store: {type(exc.cause).__name__}: "
                                f"{exc.cause}", 0) from exc
            body = cloudpickle.dumps((fn, args, dict(env or {})))
            refs = [a.run.remote(body, r, world, r % spec.nproc_per_node,
                                 r // spec.nproc_per_node, backend, (host, port), timeout)
                    for r, a in enumerate(actors)]
            return _collect(ray, actors, refs, where, world, backend, timeout)
        finally:
            for actor in actors:
                with contextlib.suppress(Exception):
                    ray.kill(actor)
            with contextlib.suppress(Exception):
                ray.shutdown()
            if cluster is not None:
                cluster.shutdown()


def _nodes(ray: Any) -> list[str]:
    """The alive nodes' ids, the driver's own first."""
    own = ray.get_runtime_context().get_node_id()
    alive = sorted(n["NodeID"] for n in ray.nodes() if n["Alive"])
    return sorted(alive, key=lambda node: node != own)


def _start(ray: Any, nodes: list[str], nproc: int) -> list[Any]:
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    actor = ray.remote(num_cpus=0, max_concurrency=2)(_Rank)
    return [actor.options(scheduling_strategy=NodeAffinitySchedulingStrategy(
        nodes[r // nproc], soft=False)).remote() for r in range(len(nodes) * nproc)]


def _node(where: dict[str, Any]) -> str:
    return f"{where['host']}/{where['node_id'][:8]}"


def _place(where: list[dict[str, Any]]) -> Callable[[int], str]:
    """Where a rank ran, as the failure's text names it: its node, node rank, local rank."""
    nproc = len(where) // len({w["node_id"] for w in where})

    def place(rank: int) -> str:
        return (f" on node {_node(where[rank])} (node rank {rank // nproc}, local rank "
                f"{rank % nproc})")

    return place


def _collect(ray: Any, actors: list[Any], refs: list[Any], where: list[dict[str, Any]],
             world: int, backend: str, timeout: float) -> list[RankResult]:
    """Every rank's result, or the rank whose actor died, raised or hung, by its node."""
    nproc = world // len({w["node_id"] for w in where})
    place = _place(where)
    outs: dict[int, dict[str, Any]] = {}
    codes: dict[int, int | None] = dict.fromkeys(range(world))
    pending = dict(enumerate(refs))
    deadline = time.monotonic() + timeout
    failed_since: float | None = None
    while pending:
        done, _ = ray.wait(list(pending.values()), num_returns=1, timeout=_POLL_S)
        for ref in done:
            rank = next(r for r, p in pending.items() if p == ref)
            del pending[rank]
            try:
                out = ray.get(ref)
            except ray.exceptions.RayTaskError as exc:  # raised outside the rank's own catch
                cause = exc.cause
                out = {"error": f"{type(cause).__name__}: {cause}", "traceback": str(exc),
                       "failed_at": time.time()}
            except Exception as exc:  # noqa: BLE001 - the actor died (a signal, OOM...)
                codes[rank] = ranks.DIED  # Ray does not say by which signal
                outs[rank] = {"error": str(exc).strip().splitlines()[0]}
                failed_since = failed_since or time.monotonic()
                continue
            codes[rank] = ranks.RAISED if "error" in out else 0
            outs[rank] = out
            if "error" in out:
                failed_since = failed_since or time.monotonic()
        now = time.monotonic()
        if failed_since is not None and (not pending or now - failed_since > ranks.SETTLE_S):
            bad = {r: o for r, o in outs.items() if codes[r] != 0}
            first = min((o.get("failed_at", float("inf")), r) for r, o in bad.items())[1]
            raise ranks.name_failure(world, backend, codes, bad, first, {}, place)
        if pending and now > deadline:
            stacks = {r: ray.get(actors[r].stack.remote(), timeout=10) for r in pending}
            raise ranks.name_hang(world, backend, timeout, sorted(pending), stacks, place)
    return [RankResult(r, outs[r]["value"], outs[r]["env_at_init"], _node(where[r]),
                       r // nproc, r % nproc) for r in range(world)]
