"""Patch guard: declare a run-time patch that a stack applies to vLLM or vllm-ascend, and
check every night, in isolated children against the installed upstream, that it still
applies, applies once, reaches spawned engine processes, fails fast on an upstream edit that
changes the target's meaning (not on whitespace or comments) and changes behaviour only where
it means to.

A patch is declared with ``DeclaredPatch``: the function that applies it, the upstream
targets it replaces (``module:Class.attr``), the marker it sets on replacements, the spawn
entry it installs (if any) and the environment that turns it on. The checks live in
``harness.patches.checks``, the source fingerprints (read with ``ast``, no import) in
``harness.patches.fingerprint``. Built in: verl's GLM-5.2 patches
(``harness.patches.verl_glm52``); third parties add theirs through the entry-point group
``npu_regress.patches`` (each entry point loads a ``DeclaredPatch`` or an iterable of them).

Layer: a check family. May import the isolation core and the stack layer, never the pytest
face (``harness.plugin``) or the report.
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Iterable

from harness.patches.declare import (  # noqa: F401 - the family's public names
    ENTRY_POINT_GROUP,
    Behaviour,
    DeclaredPatch,
    install,
    resolve,
    split,
)


def registry() -> dict[str, DeclaredPatch]:
    """Built-in declared patches, then those of installed plugins (entry points)."""
    from harness.patches.verl_glm52 import PATCHES

    found = {p.name: p for p in PATCHES}
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        loaded = ep.load()
        for patch in ([loaded] if isinstance(loaded, DeclaredPatch) else list(loaded)):
            found.setdefault(patch.name, patch)
    return found


def declared(names: Iterable[str] | None = None) -> list[DeclaredPatch]:
    known = registry()
    if names is None:
        return list(known.values())
    unknown = [n for n in names if n not in known]
    if unknown:
        raise KeyError(f"unknown declared patch {', '.join(unknown)}; known: {', '.join(known)}")
    return [known[n] for n in names]
