"""The batch-invariance target interface (``InvarianceTarget``), the checks it names and
what it expects of each (``Expect``): what every adapter implements. The registry of
targets is ``harness.invariance``."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from harness.stack.devices import has_module  # noqa: F401 - re-exported for the adapters
from harness.stack.dispatch import BATCH_INVARIANT_PREFIX, select_counts

ENTRY_POINT_GROUP = "npu_regress.invariance_targets"
SWITCH_ENV = "VLLM_BATCH_INVARIANT"
#: the seven checks of the existing Ascend switch regression test (verl, 2026-09)
CHECKS = ("switch", "mm", "matmul", "torch_sum", "tensor_sum", "add_rms_norm",
          "fused_infer_attention_score")


@dataclass(frozen=True)
class Expect:
    """One expectation on event counts: the total over events matching ``pattern`` (a name,
    or a ``ns::`` prefix) must be > 0 (``ran=True``) or exactly 0 (``ran=False``)."""

    pattern: str
    ran: bool

    def check(self, counts: dict[str, int]) -> str | None:
        """None if met; else a sentence for the failure message."""
        seen = select_counts(counts, [self.pattern])
        total = sum(seen.values())
        if self.ran and total == 0:
            return f"expected {self.pattern} to run, but it ran 0 times"
        if not self.ran and total:
            return f"expected no {self.pattern} event, but saw {seen}"
        return None


def no_invariant_events() -> list[Expect]:
    """The 'off' rule for every target: not one batch_invariant_ops:: event."""
    return [Expect(BATCH_INVARIANT_PREFIX, ran=False)]


class InvarianceTarget:
    """Base class; parent-side methods must not import device stacks or touch a device."""

    name: str = "?"
    #: device kinds the target runs on
    devices: tuple[str, ...] = ()
    #: the upstream distribution under test ("" for our own reference ops)
    distribution: str = ""
    #: what starting one case costs beyond the check itself, measured on an idle 2-core
    #: runner (verl: its run_ppo starts a local Ray); scaled by the load at run time
    start_cost_s: float = 0.0
    #: modules a case's child imports that read the environment at import (verl's
    #: trainer): the child is forked from a server that imported them in the child's own
    #: environment (``run_on_npu``'s ``preload``), not imported by each child
    child_imports: tuple[str, ...] = ()

    def time_budget(self, base: float) -> float:
        """The child timeout for one case: ``base`` plus four times the measured start cost,
        times how overloaded the machine is now (load average per core, at least 1): a
        loaded runner gets the time its Ray start needs, an idle one still sees a hang."""
        if not self.start_cost_s:
            return base
        import os

        try:
            load = os.getloadavg()[0] / (os.cpu_count() or 1)
        except OSError:
            load = 1.0
        return base + 4 * self.start_cost_s * max(1.0, load)

    # --- parent side ---
    def unavailable(self, device_kind: str, npu_missing: str | None) -> str | None:
        """Why this target cannot run in this session (the skip reason), or None."""
        raise NotImplementedError

    def release(self) -> str:
        """What is under test, as ``name version`` (failure messages name the release)."""
        from harness.stack.upstream import release

        return release(self.distribution) if self.distribution else self.name

    def not_applicable(self, check: str) -> str | None:
        """Why ``check`` does not apply to this target (the skip reason), or None."""
        return None

    def expectations(self, check: str, enabled: bool) -> list[Expect]:
        """What the counted events must show for ``check``; 'off' always forbids invariant ops."""
        return [] if enabled else no_invariant_events()

    def event_patterns(self) -> list[str]:
        """Event names/prefixes to count in the child (all that any expectation needs)."""
        pats = {BATCH_INVARIANT_PREFIX}
        for check in CHECKS:
            for enabled in (True, False):
                pats.update(e.pattern for e in self.expectations(check, enabled))
        return sorted(pats)

    # --- child side ---
    def device(self) -> Any:
        """The ``torch.device`` the case's tensors go to: the session's, unless the target
        brings its own stand-in (vllm_ascend on a machine without an NPU)."""
        from harness.stack import devices

        return devices.device()

    def load(self) -> None:
        """Import what the switch needs without turning anything on. The dispatcher is
        compared from here to after ``set_switch``: import-time definitions (an op library's
        own namespace) are not the switch's footprint."""

    def switch_env(self, enabled: bool) -> dict[str, str | None]:
        """The environment the case's child starts with: the switch variable, unless the
        target's own code must be what sets it (verl), and none of what "on" declares it
        sets (``harness.invariance.declared``)."""
        from harness.invariance.declared import unset_env

        return {**unset_env(self.declared()), **switch_env(enabled)}

    #: the environment variable that is the switch (unset: off), or None where the switch
    #: is not a variable (SGLang's server flag)
    switch_variable: str | None = SWITCH_ENV

    #: the release's in-process "off" (``disable_batch_invariant_mode()``), as its users
    #: call it; None: it has none (``switch_off`` then does nothing)
    in_process_off: str | None = None

    def switch_off(self) -> bool:
        """Child side, after the switch was on: call ``in_process_off``; False where the
        release has none."""
        return False

    #: loggers the stack logs on without propagating to the root (vLLM's): a switch that
    #: declines says why there
    loggers: tuple[str, ...] = ("vllm", "vllm_ascend", "sglang", "verl")

    #: (name, distribution) of the declaration this target's switch follows
    #: (``declared.toml``); by default its own name and distribution
    declared_as: tuple[str, str] | None = None

    def declared(self) -> Any:
        """What this target's release declares its switch does (``declared.Declared``)."""
        cached = self.__dict__.get("_declared")
        if cached is None:
            from harness.invariance import declared
            from harness.stack.upstream import version

            name, distribution = self.declared_as or (self.name, self.distribution)
            cached = declared.load(name, version(distribution) if distribution else None)
            self.__dict__["_declared"] = cached
        return cached

    def config_object(self) -> Any:
        """Child side: the stack's config object the switch changes (vllm-ascend's ascend
        config), or None."""
        return None

    def set_switch(self, enabled: bool) -> None:
        """Set the switch the way users do, then run the stack's init (which must honour it)."""
        raise NotImplementedError

    def evidence(self) -> dict[str, Any]:
        """Target-specific facts the child reports after ``set_switch`` (picklable)."""
        return {}

    def judge_evidence(self, got: dict[str, Any], enabled: bool) -> list[str]:
        """Parent side: what is wrong with ``got``, what ``evidence()`` returned in the child
        (``SwitchObservation.evidence``): sentences; empty: nothing."""
        return []

    def is_enabled(self) -> bool:
        raise NotImplementedError

    def reduce_sum(self) -> Any:
        """The function ``torch.sum`` must be when the switch is on."""
        raise NotImplementedError

    def add_rms_norm(self) -> Callable[..., Any]:
        """The currently bound add_rms_norm entry point (x, residual, weight, eps)."""
        raise NotImplementedError

    def attention_binding(self) -> tuple[Any, tuple[Any, ...]]:
        """(the bound fused-attention entry point, the objects it must be when on)."""
        raise NotImplementedError


def switch_env(enabled: bool) -> dict[str, str]:
    return {SWITCH_ENV: "1" if enabled else "0"}
