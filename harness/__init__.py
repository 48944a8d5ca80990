"""npu-regress: spawn-isolated hardware-regression checks for Ascend NPU stacks.

Public API (a contract for users' suites and CI): ``run_isolated``, ``IsolatedResult``,
the ``IsolationError`` family, ``count_events`` (dispatch events counted around a block),
and ``device()`` for use inside an isolated child.
"""

from __future__ import annotations

from harness.isolation.result import (
    ChildCrashed,
    ChildError,
    ChildTimeout,
    IsolatedResult,
    IsolationError,
)
from harness.isolation.run import run_isolated
from harness.stack.devices import DEVICE_ENV, device, device_kind  # noqa: F401 - DEVICE_ENV
from harness.stack.dispatch import count_events

__all__ = [
    "ChildCrashed",
    "ChildError",
    "ChildTimeout",
    "IsolatedResult",
    "IsolationError",
    "count_events",
    "device",
    "device_kind",
    "run_isolated",
]

