"""Is the runner's stack one that its releases support? The pairing table
(``pairings.toml``, package data: each row with its source and the date it was read) and the
installed packages' own Requires-Dist decide, before any check is judged: a failure on a
stack that no release pairs (vllm-ascend 0.23.0.post1 on vLLM 0.33.0) is about the mix,
not about either release.

Binding: a vllm-ascend row (its matrix: vLLM, torch / torch_npu, triton-ascend), and the
stack pieces' Requires-Dist. Advisory (a note): a verl row (its ``vllm`` extra: what verl's
own CI installs; verl runs on Ascend over vllm-ascend's pairing), and a deviation the active
stack profile declares with its reason (torch on a CPU machine, where no torch_npu pairs)."""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

from harness.stack import requirements
from harness.stack.upstream import version as installed_version

TABLE = Path(__file__).with_name("pairings.toml")
#: the distributions whose Requires-Dist the preflight reads, and the names it reads there
STACK = ("vllm-ascend", "vllm", "verl")
STACK_PIECES = ("torch", "torch-npu", "vllm", "transformers", "tensordict", "triton-ascend")
#: table column -> distribution name
COLUMNS = {"vllm": "vllm", "torch": "torch", "torch_npu": "torch-npu",
           "triton_ascend": "triton-ascend", "transformers": "transformers"}


@dataclass
class Pairing:
    """What the preflight found: ``problems`` (the stack is not one its releases support),
    ``notes`` (advisory differences, declared deviations)."""

    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def supported(self) -> bool:
        return not self.problems

    def to_dict(self) -> dict[str, Any]:
        return {"supported": self.supported, "problems": self.problems, "notes": self.notes}


@lru_cache(maxsize=4)
def table(path: Path = TABLE) -> dict[str, dict[str, dict[str, str]]]:
    """``{"vllm_ascend": {release: row}, "verl": {release: row}}``."""
    data = tomllib.loads(path.read_text(encoding="utf-8"))
    return {group: {row["release"]: row for row in rows} for group, rows in data.items()}


def _same(have: str, want: str) -> bool:
    a, b = requirements.release_of(have), requirements.release_of(want)
    return a is not None and a == b


def check(versions: Callable[[str], str | None] = installed_version,
          deviations: Mapping[str, str] | None = None,
          rows: Mapping[str, Mapping[str, Mapping[str, str]]] | None = None,
          requires: bool = True) -> Pairing:
    """The pairing verdict for the installed stack (``versions``: distribution -> version or
    None). ``deviations``: distribution -> why the active profile installs another version
    (a note, not a problem)."""
    rows = table() if rows is None else rows
    deviations = dict(deviations or {})
    found = Pairing()
    has_npu = versions("torch-npu") is not None
    ascend = versions("vllm-ascend")
    if ascend is not None:
        row = rows.get("vllm_ascend", {}).get(ascend.removeprefix("v"))
        if row is None:
            found.problems.append(
                f"vllm-ascend {ascend} has no row in the harness's pairing table "
                f"({TABLE.name}): the pairing cannot be checked; add its row from its "
                "docs/source/community/versioning_policy.md (a harness gap)")
        else:
            for column in ("vllm", "torch", "torch_npu", "triton_ascend"):
                want = row.get(column) or ""
                dist = COLUMNS[column]
                have = versions(dist)
                if not want or (have is None and dist != "vllm"):
                    continue  # an NPU-only piece absent on a CPU machine: nothing paired
                if column == "torch" and not has_npu:
                    if have is not None and not _same(have, want):
                        found.notes.append(
                            f"torch {have} (vllm-ascend {ascend} pairs with {want}): no "
                            "torch_npu is installed, so nothing is paired with it"
                            + (f"; the profile says: {deviations['torch']}"
                               if "torch" in deviations else ""))
                    continue
                if have is None or not _same(have, want):
                    found.problems.append(
                        f"vllm-ascend {ascend} pairs with {dist} {want} ({row['source']}, "
                        f"read {row['read']}); this runner has "
                        f"{have or 'no ' + dist}: install {dist}=={want}, or the vllm-ascend "
                        f"release paired with {dist} {have}")
    verl = versions("verl")
    if verl is not None and (row := rows.get("verl", {}).get(verl)) is not None:
        for column in ("vllm", "torch", "transformers"):
            want, dist = row.get(column) or "", COLUMNS[column]
            have = versions(dist)
            if want and have is not None and not _same(have, want):
                found.notes.append(f"verl {verl}'s `vllm` extra pins {dist}=={want}; this "
                                   f"runner has {have} (advisory: {row['source']})")
    if requires:
        exempt = {"*": {name: why for name, why in deviations.items()}}
        if not has_npu:  # no NPU stack: its pieces are not installed, nothing to pair
            exempt["*"].update({"torch-npu": "", "triton-ascend": ""})
        for unmet in requirements.unmet(STACK, exempt, only=STACK_PIECES):
            found.problems.append(f"{unmet} (its own declared requirement)")
    return found


def for_this_runner() -> Pairing:
    """The verdict for the installed stack, with the active profile's declared deviations."""
    from harness.stack import profile

    active = profile.active()
    deviations = {d["package"]: f"{d.get('reason', '')} (profile {active.name})"
                  for d in active.deviations} if active else {}
    return check(deviations=deviations)
