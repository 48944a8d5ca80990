"""npu-regress: spawn-isolated hardware-regression checks for Ascend NPU stacks.

Public API (a contract for users' suites and CI): ``run_isolated``, ``IsolatedResult``,
the ``IsolationError`` family, ``count_events`` (dispatch events counted around a block),
and ``device()`` for use inside an isolated child.
"""

from __future__ import annotations

import os
from typing import Any

from harness.dispatch import count_events
from harness.isolation import run_isolated
from harness.result import (
    ChildCrashed,
    ChildError,
    ChildTimeout,
    IsolatedResult,
    IsolationError,
)

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

#: environment variable through which the plugin tells a child its device kind
DEVICE_ENV = "HARNESS_DEVICE"


def device() -> Any:
    """The ``torch.device`` this child was given by the session (``--device``); CPU outside one.

    Accelerators are pinned per xdist worker through the visible-devices variable, so the
    child always uses index 0 of what it can see.
    """
    import torch

    kind = device_kind()
    return torch.device("cpu") if kind == "cpu" else torch.device(kind, 0)


def device_kind() -> str:
    """``npu``, ``cuda`` or ``cpu``: the kind the session gave this child."""
    return os.environ.get(DEVICE_ENV, "cpu")
