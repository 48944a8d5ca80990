"""Batch-invariance targets: one small interface over each stack's switch.

A target says whether it can run here (and if not, exactly why), turns the switch on or
leaves it off inside an isolated child, tells whether it is on *by identity* (the override
library exists, ``torch.sum`` is the replacement), and names the dispatch events each check
expects. The switch checks themselves live in ``harness.invariance.switch``.

Built in: ``reference`` (ours, CPU and any device), ``vllm_ascend`` (NPU or the CPU stand-in),
``verl`` (verl's rollout switch over vllm_ascend), ``sglang`` (NPU or the CPU stand-in),
``vllm`` (CUDA and CPU).
Third parties add targets through the entry-point group ``npu_regress.invariance_targets``
(each entry point loads an ``InvarianceTarget`` instance or class).

Layer: a check family. May import the isolation core and the stack layer, never the pytest
face (``harness.plugin``) or the report.
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Callable

from harness.invariance.target import (  # noqa: F401 - the family's public names
    CHECKS,
    ENTRY_POINT_GROUP,
    SWITCH_ENV,
    Expect,
    InvarianceTarget,
    has_module,
    no_invariant_events,
    switch_env,
)


def _builtin() -> dict[str, Callable[[], InvarianceTarget]]:
    from harness.invariance.adapters import (
        ReferenceTarget,
        SglangTarget,
        VerlTarget,
        VllmAscendTarget,
        VllmTarget,
    )

    return {"reference": ReferenceTarget, "vllm_ascend": VllmAscendTarget, "vllm": VllmTarget,
            "verl": VerlTarget, "sglang": SglangTarget}


#: the built-in targets' names, in the order they are checked (the options' help lists them
#: without importing the adapters)
BUILTIN_TARGETS = ("reference", "vllm_ascend", "vllm", "verl", "sglang")


def registry() -> dict[str, Callable[[], InvarianceTarget]]:
    """Built-in targets, then those of installed plugins (entry points)."""
    found = _builtin()
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        found.setdefault(ep.name, ep.load)
    return found


def get_target(name: str) -> InvarianceTarget:
    factories = registry()
    if name not in factories:
        raise KeyError(f"unknown batch-invariance target {name!r}; known: {', '.join(factories)}")
    obj = factories[name]()
    return obj() if isinstance(obj, type) else obj

