"""A stack manifest as the results header holds it (written by ``harness.plugin.stack_manifest``):
one entry per component, shown as text, and what changed between two nights (the bisect
hint)."""

from __future__ import annotations

from typing import Any

Manifest = dict[str, dict[str, Any]]


def differences(then: Manifest | None, now: Manifest | None) -> list[dict[str, Any]]:
    """Entries whose version or revision differ: ``[{"name", "then", "now"}]``."""
    if not isinstance(then, dict) or not isinstance(now, dict):
        return []
    out = []
    for name in sorted(set(then) | set(now)):
        a, b = shown(then.get(name)), shown(now.get(name))
        if a != b:
            out.append({"name": name, "then": a, "now": b})
    return out


def shown(entry: Any) -> str:
    if not isinstance(entry, dict):
        return "absent"
    version = entry.get("version")
    text = "not installed" if version is None else str(version)
    if entry.get("revision"):
        text += f" @ {str(entry['revision'])[:12]}"
    return text
