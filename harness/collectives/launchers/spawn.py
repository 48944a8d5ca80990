"""The ranks as children of the check, on this machine (``ranks.run_ranks``)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from harness.collectives.ranks import RankResult, run_ranks


class SpawnLauncher:
    def run(self, fn: Callable[..., Any], args: tuple[Any, ...], *, world: int,
            backend: str, env: Mapping[str, str | None] | None = None,
            timeout: float = 120.0) -> list[RankResult]:
        return run_ranks(fn, args, world=world, backend=backend, env=env, timeout=timeout)
