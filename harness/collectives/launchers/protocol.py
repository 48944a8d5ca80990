"""What every launcher does, and the settings that choose one (``--ranks-launcher``...).

A launcher runs ``fn(rank, world, *args)`` on ``world`` ranks in one process group, each
rank with ``env`` applied before the group starts; it returns every rank's ``RankResult``
(with the node it ran on) or raises ``RankError`` naming the rank, and its node, that died,
raised or hung; and no rank it started outlives the call on any node.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from harness.collectives.ranks import RankResult

KINDS = ("spawn", "torchrun", "ray")
#: torchrun reads each of its options from ``PET_<OPTION>`` too (a PyTorchJob sets them)
PET = {"nnodes": "PET_NNODES", "nproc_per_node": "PET_NPROC_PER_NODE",
       "rdzv_endpoint": "PET_RDZV_ENDPOINT", "node_rank": "PET_NODE_RANK"}


@dataclass(frozen=True)
class LaunchSpec:
    """How the ranks start. ``spawn``: ``world`` children of the check. ``torchrun``:
    ``nnodes`` agents of ``nproc_per_node`` ranks each meeting at ``rdzv_endpoint``
    (host:port of node 0, this one); the results come back through a store at
    ``store_port`` there (the endpoint's port + 1 unless given). ``ray``: ``nproc_per_node``
    actors on each of ``nnodes`` nodes of the Ray cluster at ``ray_address`` ("auto":
    ``$RAY_ADDRESS`` or the local one). ``loopback``: this machine starts every node itself
    (torchrun: an agent each under its own host name; Ray: a head and worker raylets), for
    tests and a dry run."""

    kind: str = "spawn"
    nnodes: int = 1
    nproc_per_node: int = 0
    rdzv_endpoint: str = ""
    store_port: int = 0
    loopback: bool = False
    ray_address: str = ""

    @property
    def world(self) -> int:
        return self.nnodes * self.nproc_per_node

    def host_port(self) -> tuple[str, int]:
        host, _, port = self.rdzv_endpoint.rpartition(":")
        return host, int(port)

    def results_port(self) -> int:
        return self.store_port or self.host_port()[1] + 1

    @classmethod
    def from_options(cls, kind: str | None, nnodes: int | None, nproc_per_node: int | None,
                     rdzv_endpoint: str | None, node_rank: int | None, store_port: int | None,
                     loopback: bool, environ: Mapping[str, str] = os.environ,
                     ray_address: str | None = None) -> LaunchSpec:
        """Options first, then torchrun's own ``PET_*`` variables; a usage error naming the
        option and the fix where they do not make a run."""
        kind = kind or "spawn"
        if kind not in KINDS:
            raise ValueError(f"--ranks-launcher {kind!r}: give one of {', '.join(KINDS)}")
        if kind == "spawn":
            return cls()

        def pick(name: str, given: Any) -> str | None:
            return str(given) if given not in (None, "") else environ.get(PET[name])

        values = {name: pick(name, given) for name, given in
                  (("nnodes", nnodes), ("nproc_per_node", nproc_per_node),
                   ("rdzv_endpoint", rdzv_endpoint), ("node_rank", node_rank))}
        for name in ("nnodes", "nproc_per_node", "node_rank"):
            raw = values[name] or ("0" if name == "node_rank" else None)
            if raw is None or not raw.isdigit():
                flag = "--ranks-" + name.replace("_", "-")
                raise ValueError(f"{flag} {raw!r} (or ${PET[name]}): give a whole number"
                                 + (", e.g. 2" if raw is None else ""))
            values[name] = raw
        endpoint = values["rdzv_endpoint"] or ""
        if kind == "ray":
            return cls("ray", int(values["nnodes"] or 1), int(values["nproc_per_node"] or 1),
                       loopback=loopback, ray_address=ray_address or "auto")
        if loopback and not endpoint:
            pass  # free ports on this machine, chosen per job
        elif not endpoint.rpartition(":")[2].isdigit() or not endpoint.rpartition(":")[0]:
            raise ValueError(f"--ranks-rdzv-endpoint {endpoint!r} (or $PET_RDZV_ENDPOINT): "
                             "give node 0's HOST:PORT, e.g. 10.0.0.1:29400")
        if int(values["node_rank"] or 0) != 0:
            raise ValueError(f"--ranks-node-rank {values['node_rank']}: the checks run on node "
                             "0 (the rendezvous host); on the other nodes run "
                             "`npu-regress ranks-node --serve` with the same endpoint")
        return cls("torchrun", int(values["nnodes"] or 1),
                   int(values["nproc_per_node"] or 1), endpoint, store_port or 0, loopback)


class Launcher(Protocol):
    def run(self, fn: Callable[..., Any], args: tuple[Any, ...], *, world: int,
            backend: str, env: Mapping[str, str | None] | None = None,
            timeout: float = 120.0) -> list[RankResult]: ...
