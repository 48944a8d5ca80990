"""The collective settings a target's switch sets, read from the switch itself.

``declared.toml`` names each target's collective settings with their source lines (the env
overrides marked ``collective = "hccl" | "lccl" | "nccl" | "custom-allreduce"``). In the
check's child the target's switch runs the way users turn it on, and what it then left in
the environment is what the ranks start with: exactly what the switch set, not our copy of
the declaration. A declared setting the switch did not set, or a collective variable it set
that the declaration does not name, is reported (the release changed; read it, then update
the declaration). "none" is the inverse control: the switch not run and every declared name
removed from the ranks' environment.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Any

#: variables that configure a collective library (what a switch could set undeclared)
COLLECTIVE_VARIABLE = re.compile(r"^(HCCL_|LCCL_|NCCL_|VLLM_.*ALL_?REDUCE|VLLM_.*ALLGATHER)")
SETTINGS = ("switch", "none")


@dataclass
class Applied:
    """What the ranks start with, and how it came to be."""

    settings: str
    #: name -> value (None: removed) given to every rank before the process group
    env: dict[str, str | None] = field(default_factory=dict)
    #: name -> (declared value, source) of the target's declared collective settings
    declared: dict[str, tuple[Any, str]] = field(default_factory=dict)
    #: declared settings the switch did not set as declared: name -> what it left
    missing: dict[str, str | None] = field(default_factory=dict)
    #: collective variables the switch set that the declaration does not name
    undeclared: dict[str, str] = field(default_factory=dict)


def declared_settings(target: Any) -> dict[str, tuple[Any, str]]:
    """The target's declared collective settings: name -> (value, source line)."""
    return {o.name: (o.value, o.source) for o in target.declared().overrides
            if o.kind == "env" and o.collective}


def apply(target: Any, settings: str) -> Applied:
    """Child side: run the target's switch ("switch") or not ("none"), and say what the ranks
    start with."""
    if settings not in SETTINGS:
        raise ValueError(f"settings={settings!r}: use one of {', '.join(SETTINGS)}")
    declared = declared_settings(target)
    applied = Applied(settings, declared=declared)
    if settings == "none":
        applied.env = {name: None for name in declared}
        return applied
    target.device()  # the target's device, or its CPU stand-in (torch_npu's for vllm_ascend)
    before = dict(os.environ)
    target.load()
    target.set_switch(True)
    for name, (value, _source) in declared.items():
        got = os.environ.get(name)
        applied.env[name] = got
        if got != str(value):
            applied.missing[name] = got
    for name, value in os.environ.items():
        if (COLLECTIVE_VARIABLE.match(name) and before.get(name) != value
                and name not in declared):
            applied.undeclared[name] = value
            applied.env[name] = value
    return applied


def judge(applied: Applied, release: str, seen: list[dict[str, str | None]]) -> list[str]:
    """Parent side: the switch set what it declares, nothing undeclared, and every rank saw
    exactly that at init (``seen``: each rank's ``env_at_init``)."""
    problems = []
    for name, got in applied.missing.items():
        value, source = applied.declared[name]
        problems.append(f"with the switch on, {release} did not set {name}={value} (it left "
                        f"{got!r}); declared at {source}")
    for name, value in applied.undeclared.items():
        problems.append(f"{release}'s switch also set {name}={value}, which "
                        "harness/invariance/declared.toml does not name: a change of the "
                        "release (read it, then declare it with its source line)")
    for rank, env in enumerate(seen):
        if env != applied.env:
            problems.append(f"rank {rank} started its process group with {env}, not the "
                            f"settings {applied.env}: the check did not run what it claims")
    return problems
