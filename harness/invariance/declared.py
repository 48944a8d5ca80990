"""What a target's switch declares it does (``declared.toml``), and the judge of it.

Registering kernels is only part of a switch: vllm-ascend's "on" also makes HCCL and LCCL
deterministic, turns on torch's deterministic algorithms and changes its config; vLLM's pins
cuBLAS and NCCL. A release that drops one still passes every op check, and its collectives
are no longer deterministic across ranks. So each target's release declares, as data with
the source line, the operators it overrides and everything else "on" sets; the child reads
the state after the switch (``state``) and the parent compares (``judge``): "on" must have
all of it, "off" none of it, and the operators overridden must be exactly those declared.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

DATA = Path(__file__).with_name("declared.toml")
KINDS = ("env", "deterministic", "config")


@dataclass(frozen=True)
class Override:
    """One thing "on" sets besides kernels."""

    kind: str
    name: str
    value: Any
    source: str
    #: the collective library an env setting is for (hccl, lccl, nccl, custom-allreduce),
    #: "" for none: the collectives family runs its ranks with exactly these
    collective: str = ""

    def shown(self) -> str:
        if self.kind == "deterministic":
            return f"{self.name}(True{', warn_only=True' if self.value == 'warn_only' else ''})"
        if self.kind == "config":
            return f"config.{self.name}={self.value!r}"
        return f"{self.name}={self.value}"

    def holds(self, state: Any) -> bool:
        """Whether ``state`` (what ``read`` found) is what "on" sets."""
        if self.kind == "deterministic":
            return state == {"enabled": True, "warn_only": self.value == "warn_only"}
        return state == self.value

    def set_at_all(self, state: Any) -> bool:
        """Whether ``state`` shows any of it ("off" must show none)."""
        if self.kind == "deterministic":
            return bool(state and state.get("enabled"))
        return state == self.value


@dataclass
class Declared:
    """A target release's declaration; ``ops`` None: it declares no operator set."""

    ops: set[str] | None = None
    #: Python-level functions the switch replaces (``torch.sum``...)
    rebinds: set[str] = field(default_factory=set)
    ops_source: str = ""
    rebinds_source: str = ""
    overrides: list[Override] = field(default_factory=list)


def _in_release(spec: str, version: str | None) -> bool:
    if spec == "*":
        return True
    from harness.stack.requirements import in_range

    return in_range(version, spec)


def load(target: str, version: str | None, path: Path = DATA) -> Declared:
    """The declaration of ``target`` at ``version`` (its distribution's installed version)."""
    data = tomllib.loads(path.read_text(encoding="utf-8"))
    found = Declared()
    for entry in data.get("ops", []):
        if entry["target"] == target and _in_release(entry["release"], version):
            found.ops = set(entry["ops"])
            found.rebinds = set(entry.get("rebinds", ()))
            found.ops_source = entry["source"]
            found.rebinds_source = entry.get("rebinds_source", entry["source"])
    for entry in data.get("override", []):
        if entry["target"] == target and _in_release(entry["release"], version):
            if entry["kind"] not in KINDS:
                raise ValueError(f"{path}: override {entry['name']!r} has kind "
                                 f"{entry['kind']!r}; use one of {', '.join(KINDS)}")
            found.overrides.append(Override(entry["kind"], entry["name"], entry["value"],
                                            entry["source"], entry.get("collective", "")))
    return found


def read(declared: Declared, config: Any) -> dict[str, Any]:
    """Child side, after the switch: each override's current state (``config``: the
    target's config object, or None)."""
    state: dict[str, Any] = {}
    for override in declared.overrides:
        if override.kind == "env":
            state[override.name] = os.environ.get(override.name)
        elif override.kind == "deterministic":
            import torch

            state[override.name] = {
                "enabled": torch.are_deterministic_algorithms_enabled(),
                "warn_only": torch.is_deterministic_algorithms_warn_only_enabled()}
        else:
            state[override.name] = getattr(config, override.name, None)
    return state


def unset_env(declared: Declared) -> dict[str, None]:
    """The child's environment must not inherit what "on" would set (a CI runner that
    exports HCCL_DETERMINISTIC would make every "off" case look set)."""
    return {o.name: None for o in declared.overrides if o.kind == "env"}


def judge(declared: Declared, release: str, enabled: bool, state: dict[str, Any],
          footprint: dict[str, list[str]] | None) -> list[str]:
    """Parent side: what of the declaration the child's state and the switch's footprint
    (``None``: not compared, the check is not the switch case) contradict."""
    problems = []
    for override in declared.overrides:
        got = state.get(override.name)
        if enabled and not override.holds(got):
            problems.append(f"with the switch on, {release} did not set {override.shown()} "
                            f"(the child read {got!r}); declared at {override.source}")
        if not enabled and override.set_at_all(got):
            problems.append(f"with the switch off, {release} set {override.shown()}; "
                            f"declared for 'on' at {override.source}")
    if enabled and footprint is not None and declared.ops is not None:
        overridden = set(footprint)
        for op in sorted(declared.ops - overridden):
            problems.append(f"{release}'s switch did not override {op} (declared at "
                            f"{declared.ops_source}); it overrode "
                            f"{', '.join(sorted(overridden)) or 'nothing'}")
        for op in sorted(overridden - declared.ops):
            problems.append(f"{release}'s switch also overrode {op} on "
                            f"{', '.join(footprint[op])}, which its declaration "
                            f"({declared.ops_source}) does not list: a change of the release "
                            "(read it, then update harness/invariance/declared.toml)")
    return problems
