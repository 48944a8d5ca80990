"""What the installed upstream packages declare they need, and what of it this machine does
not have: a ``pip check`` over the declared requirements of each upstream distribution
(installed wheels' Requires-Dist; for vllm-ascend's sources-only install, the
``requirements.txt`` of its sdist, which ``ci/upstream.sh`` keeps beside the package).

The upstream wheels go in with ``--no-deps`` (a resolution would pull a CUDA torch), so
nothing else would notice a declared requirement left out or installed out of range, and a
missing one shows up later as an ImportError filed against the release."""

from __future__ import annotations

import importlib.metadata
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from harness.stack.upstream import package_dirs, version

#: sources-only installs: distribution -> (its import package, the requirements file beside it)
SOURCES_REQUIREMENTS = {"vllm-ascend": ("vllm_ascend", "requirements.txt")}


@dataclass(frozen=True)
class Unmet:
    """One declared requirement this machine does not meet."""

    declared_by: str
    requirement: str
    installed: str | None

    def __str__(self) -> str:
        have = "not installed" if self.installed is None else f"{self.installed} is installed"
        return f"{self.declared_by} requires {self.requirement}: {have}"


def _parse(lines: Iterable[str]) -> list[Requirement]:
    found = []
    for raw in lines:
        line = raw.split("#", 1)[0].strip()
        if not line or line.startswith("-"):
            continue
        try:
            req = Requirement(line)
        except InvalidRequirement:
            continue
        # a requirement of an extra is not a requirement of the distribution
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        found.append(req)
    return found


def requirements_file(distribution: str) -> Path | None:
    """The requirements file of a sources-only install of ``distribution``, if any."""
    if distribution not in SOURCES_REQUIREMENTS:
        return None
    package, name = SOURCES_REQUIREMENTS[distribution]
    for root in package_dirs(package):
        if (path := root.parent / name).is_file():
            return path
    return None


def declared(distribution: str) -> list[Requirement] | None:
    """What ``distribution`` declares it needs (markers evaluated for this machine, extras
    left out), or None when it is not installed."""
    try:
        return _parse(importlib.metadata.requires(distribution) or [])
    except importlib.metadata.PackageNotFoundError:
        pass
    path = requirements_file(distribution)
    if path is None:
        return None
    return _parse(path.read_text(encoding="utf-8", errors="replace").splitlines())


def _satisfies(installed: str, req: Requirement) -> bool:
    try:
        have = Version(installed)
    except InvalidVersion:
        return False
    # a local build (2.13.0+cpu, 0.23.0+empty) is the release it was built from
    return req.specifier.contains(Version(have.public), prereleases=True) \
        or req.specifier.contains(have, prereleases=True)


def unmet(distributions: Iterable[str],
          exempt: Mapping[str, Mapping[str, str]] | None = None,
          only: Iterable[str] | None = None) -> list[Unmet]:
    """Each declared requirement of ``distributions`` that is not installed or not in range.
    ``exempt``: declaring distribution (or ``"*"``) -> {requirement name: why it is not
    installed}; ``only``: check just these requirement names (the preflight's stack pieces)."""
    exempt = exempt or {}
    keep = {canonicalize_name(n) for n in only} if only is not None else None
    found: list[Unmet] = []
    for dist in distributions:
        reqs = declared(dist)
        if reqs is None:
            continue
        skip = {canonicalize_name(n) for n in (*exempt.get("*", {}), *exempt.get(dist, {}))}
        for req in reqs:
            name = canonicalize_name(req.name)
            if name in skip or (keep is not None and name not in keep):
                continue
            have = version(req.name)
            if have is None or not _satisfies(have, req):
                found.append(Unmet(dist, str(req), have))
    return found


def install_lines(distributions: Iterable[str],
                  exempt: Mapping[str, Mapping[str, str]] | None = None,
                  pins: Mapping[str, str] | None = None) -> list[str]:
    """The requirement lines to hand to pip: everything the ``distributions`` declare but
    the exempt, each declaring distribution's specifier kept (pip intersects them), and the
    profile's ``pins`` for names whose ranges the releases leave open or do not agree on
    (``unmet`` still judges the pin against every declared range)."""
    exempt = exempt or {}
    pins = {canonicalize_name(k): v for k, v in (pins or {}).items()}
    distributions = list(distributions)
    # the distributions themselves are installed without dependencies (their own lines
    # would make pip resolve theirs: triton, a CUDA torch)
    provided = {canonicalize_name(d) for d in distributions}
    lines: list[str] = []
    seen: set[str] = set()
    for dist in distributions:
        skip = {canonicalize_name(n) for n in (*exempt.get("*", {}), *exempt.get(dist, {}))}
        for req in declared(dist) or []:
            name = canonicalize_name(req.name)
            if name in skip or name in pins or name in provided:  # a pin: every range
                continue
            line = f"{req.name}{'[' + ','.join(sorted(req.extras)) + ']' if req.extras else ''}" \
                   f"{req.specifier}"
            if line not in seen:
                seen.add(line)
                lines.append(line)
    for name, pin in pins.items():
        lines.append(f"{name}=={pin}")
    return lines
