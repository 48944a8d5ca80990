"""How a run-time patch is declared (``DeclaredPatch``, its ``Behaviour`` tables) and
how its targets are named, resolved and installed (``module:Qual.name``). The
declared patches are listed by ``harness.patches``."""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

ENTRY_POINT_GROUP = "npu_regress.patches"


@dataclass(frozen=True)
class Behaviour:
    """A call table for one target: ``table`` (``module:function``) takes the candidate
    function and returns ``{case: observation}`` from calls on stub collaborators; it runs
    on the upstream original and on the replacement. ``intent`` names the cases where the
    patch is meant to behave differently; any other difference fails."""

    target: str
    table: str
    intent: frozenset[str] = frozenset()


@dataclass(frozen=True)
class DeclaredPatch:
    """One run-time patch under test."""

    name: str
    #: ``module:function`` that applies the patch (called with no arguments)
    apply: str
    #: the upstream objects it may replace, ``module:Qual.name``
    targets: tuple[str, ...]
    #: the attribute it sets (true) on every replacement, so a second apply changes nothing
    marker: str
    #: where it installs the function a spawned engine process starts with (``module:Qual``)
    spawn_entry: str | None = None
    #: the environment that turns the patch on
    env: Mapping[str, str] = field(default_factory=dict)
    #: packages whose ``__init__`` is skipped to import ``apply``'s module (see
    #: ``harness.stack.upstream.import_upstream``)
    skip_inits: tuple[str, ...] = ()
    #: the targets need vllm-ascend: on a machine without an NPU, the CPU stand-in device
    standin: bool = False
    behaviours: tuple[Behaviour, ...] = ()
    #: the upstream distributions a failure is a finding about (named in messages)
    distributions: tuple[str, ...] = ()
    #: targets replaced only together with another target whose marker guards both (no
    #: marker of their own): ``{target: the marked target}``
    guarded_by: Mapping[str, str] = field(default_factory=dict)
    #: where the fingerprint report reads a target whose object is chosen at run time
    #: (``target -> module:Qual.name`` of the definition to fingerprint)
    sources: Mapping[str, str] = field(default_factory=dict)

    def releases(self) -> str:
        from harness.stack.upstream import release

        return ", ".join(release(d) for d in self.distributions) or self.name


def split(path: str) -> tuple[str, list[str]]:
    """``"pkg.mod:Cls.attr"`` -> ``("pkg.mod", ["Cls", "attr"])``."""
    module, sep, qualname = path.partition(":")
    if not sep or not qualname:
        raise ValueError(f"patch target {path!r}: write it as module:Qual.name")
    return module, qualname.split(".")


def resolve(path: str, *, raw: bool = False) -> Any:
    """The object at ``path`` (imports its module). ``raw`` returns what the owner's
    ``__dict__`` holds (a ``staticmethod`` object rather than its function)."""
    import importlib

    module, parts = split(path)
    obj: Any = importlib.import_module(module)
    for i, part in enumerate(parts):
        last = i == len(parts) - 1
        obj = inspect.getattr_static(obj, part) if raw and last else getattr(obj, part)
    return obj


def install(path: str, value: Any) -> None:
    """Put ``value`` at ``path`` (what a patch does)."""
    module, parts = split(path)
    owner = resolve(f"{module}:{'.'.join(parts[:-1])}") if len(parts) > 1 else \
        __import__(module, fromlist=["_"])
    setattr(owner, parts[-1], value)
