"""One collectives case, in its own isolated child: the switch's settings, the ranks, the
reading (``run_collective_case``); and how many ranks this runner gives (``world_for``)."""

from __future__ import annotations

import os
from typing import Any

from harness.collectives import inputs, launchers, properties, settings
from harness.collectives.launchers import LaunchSpec

#: ranks on a CPU runner: 4 gloo ranks fit 2 cores on these messages; a 2-rank sum cannot
#: show order, so fewer than 3 ranks make the size property vacuous
CPU_RANKS = 4
MAX_RANKS = 8
#: override the rank count (an accelerator runner with more devices than a check needs)
RANKS_ENV = "NPU_REGRESS_COLLECTIVE_RANKS"


def world_for(device_kind: str, launch: LaunchSpec | None = None) -> int:
    """The ranks a case runs: torchrun's nodes x ranks per node, else
    ``$NPU_REGRESS_COLLECTIVE_RANKS``, else 4 on CPU, else the visible devices (at most 8)."""
    if launch is not None and launch.kind == "torchrun":
        return launch.world
    raw = os.environ.get(RANKS_ENV)
    if raw:
        try:
            return max(1, int(raw))
        except ValueError:
            raise ValueError(f"{RANKS_ENV}={raw!r}: give a whole number of ranks, e.g. 4") \
                from None
    if device_kind == "cpu":
        return CPU_RANKS
    from harness.stack.devices import device_count

    return min(MAX_RANKS, device_count(device_kind))


def run_collective_case(target_name: str, how: str, collective: str, world: int,
                        backend: str, sizes: tuple[int, ...] = inputs.SIZES,
                        dtypes: tuple[str, ...] = inputs.DTYPES, timeout: float = 120.0,
                        launch: LaunchSpec | None = None) -> dict[str, Any]:
    """Child side: the target's collective settings (``how``: "switch" or "none"), then
    ``collective`` on ``world`` ranks started by ``launch`` (spawned here by default), read
    here (the tensors stay in the child)."""
    from harness.invariance import get_target

    launch = launch or LaunchSpec()
    applied = settings.apply(get_target(target_name), how)
    results = launchers.get(launch).run(properties.measure, (collective, dtypes, sizes),
                                        world=world, backend=backend, env=applied.env,
                                        timeout=timeout)
    places = {r.rank: f" on {r.place()}" for r in results} if launch.nnodes > 1 else {}
    reading = properties.read(collective, world, [r.value for r in results], sizes, dtypes,
                              places=places)
    return {"applied": applied, "reading": reading,
            "env_at_init": [r.env_at_init for r in results],
            "nodes": {r.rank: r.node for r in results}}
