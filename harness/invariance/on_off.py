"""On, then off, in one process: what stays patched after the release's own "off".

A serving process that turns batch invariance on and off again (SGLang's
``disable_batch_invariant_mode()``, a test fixture, a weight-sync phase) must get back the
kernels and functions it had. The child records the dispatcher's kernel tables and each
function the release declares it rebinds (``declared.toml``'s ``rebinds``), turns the switch
on the way users do, then off the release's way, and reports what differs from before:
kernels still overridden, functions still rebound. Each left over is one sentence, naming
the declared source line.
"""

from __future__ import annotations

import importlib
import sys
from typing import Any

from harness.stack.dispatch import footprint, registrations


def resolve(dotted: str) -> Any:
    """The object a dotted name (``torch_npu.npu_add_rms_norm``) is bound to now, or a
    marker string where it does not resolve."""
    head, *rest = dotted.split(".")
    obj: Any = sys.modules.get(head)
    if obj is None:
        try:
            obj = importlib.import_module(head)
        except ImportError:
            return f"<{head} not importable>"
    for part in rest:
        try:
            obj = getattr(obj, part)
        except AttributeError:
            return f"<no {dotted}>"
    return obj


def _bound(names: set[str]) -> dict[str, Any]:
    return {name: resolve(name) for name in sorted(names)}


def run_on_then_off(target: Any) -> dict[str, Any]:
    """Child side: on, then the release's off; what changed at each step."""
    from harness.invariance import get_target

    tgt = get_target(target) if isinstance(target, str) else target
    tgt.device()
    tgt.load()
    names = tgt.declared().rebinds
    before, bound_before = registrations(), _bound(names)
    tgt.set_switch(True)
    on, bound_on = registrations(), _bound(names)
    if not tgt.switch_off():
        return {"has_off": False}
    after, bound_after = registrations(), _bound(names)
    return {
        "has_off": True,
        "on_footprint": footprint(before, on),
        "left_footprint": footprint(before, after),
        "rebound_on": [n for n in bound_on if bound_on[n] is not bound_before[n]],
        "left_rebound": {n: repr(bound_after[n]) for n in bound_after
                         if bound_after[n] is not bound_before[n]},
        "restored": {n: repr(bound_before[n]) for n in bound_before},
        "enabled_after_off": tgt.is_enabled(),
    }


def judge(target: Any, got: dict[str, Any]) -> list[str]:
    """Parent side: each thing the "off" left patched, and an "on" that changed nothing."""
    release = target.release()
    off = f"{release}'s {target.in_process_off}"
    declared = target.declared()
    problems = []
    if not got["on_footprint"] and not got["rebound_on"]:
        problems.append(f"{release}'s switch changed nothing when on: the on -> off case "
                        "proves nothing")
    if got["enabled_after_off"]:
        problems.append(f"{release} is still on by identity after {target.in_process_off}")
    for op, keys in got["left_footprint"].items():
        problems.append(f"after {off}, {op} still has the switch's kernel on "
                        f"{', '.join(keys)} (declared at {declared.ops_source})")
    for name, now in got["left_rebound"].items():
        problems.append(f"after {off}, {name} is still rebound to {now}, not "
                        f"{got['restored'][name]} (rebound at {declared.rebinds_source})")
    return problems
