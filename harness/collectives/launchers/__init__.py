"""Where a collectives check's ranks come from, one module per launcher behind
``protocol.Launcher``: ``spawn`` (children of the check, one machine) and ``torchrun``
(torch's elastic agent, c10d rendezvous, one agent per node: ranks across nodes) and
``ray`` (Ray actors on a Ray cluster's nodes).

``node`` is the side that runs on every node (the agent and its ranks, started by the leader
on loopback or by ``npu-regress ranks-node`` on a fleet's other nodes); ``rank`` is one
rank under the agent.
"""

from __future__ import annotations

from harness.collectives.launchers.protocol import Launcher, LaunchSpec


def get(spec: LaunchSpec) -> Launcher:
    """The launcher ``spec`` names."""
    if spec.kind == "torchrun":
        from harness.collectives.launchers.torchrun import TorchrunLauncher

        return TorchrunLauncher(spec)
    if spec.kind == "ray":
        from harness.collectives.launchers.ray import RayLauncher

        return RayLauncher(spec)
    from harness.collectives.launchers.spawn import SpawnLauncher

    return SpawnLauncher()


__all__ = ["LaunchSpec", "Launcher", "get"]
