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
from packaging.specifiers import SpecifierSet
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


def _parse(lines: Iterable[str], extras: Iterable[str] = ()) -> list[Requirement]:
    """Requirements that apply here: markers evaluated (``extra`` as each of ``extras``, or
    none: a requirement of an extra is not one of the distribution)."""
    wanted = [""] + [e for e in extras if e]
    found = []
    for raw in lines:
        line = raw.split("#", 1)[0].strip()
        if not line or line.startswith("-"):
            continue
        try:
            req = Requirement(line)
        except InvalidRequirement:
            continue
        if req.marker is not None and not any(req.marker.evaluate({"extra": e})
                                              for e in wanted):
            continue
        found.append(req)
    return found


def _extra_requirements(name: str, extras: Iterable[str]) -> list[Requirement]:
    """What the installed ``name`` needs for ``extras`` only (``fastapi[standard]``)."""
    extras = set(extras)
    try:
        lines = importlib.metadata.requires(name) or []
    except importlib.metadata.PackageNotFoundError:
        return []
    return [r for r in _parse(lines, extras) if r.marker is not None
            and not r.marker.evaluate({"extra": ""})]


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


def release_of(text: str) -> Version | None:
    """The public release of a version (``0.23.0+empty``, ``v0.23.0`` -> 0.23.0), or None
    when it does not parse."""
    try:
        return Version(Version(text.removeprefix("v")).public)
    except InvalidVersion:
        return None


def in_range(installed: str | None, specifier: SpecifierSet | str) -> bool:
    """Whether an installed version is inside ``specifier``; a local build (2.13.0+cpu,
    0.23.0+empty) counts as the release it was built from."""
    if installed is None:
        return False
    try:
        have = Version(installed)
    except InvalidVersion:
        return False
    spec = SpecifierSet(specifier) if isinstance(specifier, str) else specifier
    return spec.contains(Version(have.public), prereleases=True) \
        or spec.contains(have, prereleases=True)


def _satisfies(installed: str, req: Requirement) -> bool:
    return in_range(installed, req.specifier)


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
        skip = _exempt(exempt, dist)
        for req in reqs:
            name = canonicalize_name(req.name)
            if name in skip or (keep is not None and name not in keep):
                continue
            have = version(req.name)
            if have is None or not _satisfies(have, req):
                found.append(Unmet(dist, str(req), have))
            elif req.extras:
                found.extend(_unmet_extras(dist, req, set()))
    return found


def _unmet_extras(dist: str, req: Requirement, seen: set[str]) -> list[Unmet]:
    """What the extras of an installed requirement need and this machine lacks, through the
    extras they ask for in turn (``fastapi[standard]`` -> ``uvicorn[standard]`` -> uvloop)."""
    key = f"{canonicalize_name(req.name)}[{','.join(sorted(req.extras))}]"
    if key in seen:
        return []
    seen.add(key)
    found: list[Unmet] = []
    for sub in _extra_requirements(req.name, req.extras):
        have = version(sub.name)
        if have is None or not _satisfies(have, sub):
            found.append(Unmet(f"{dist} (through {key})", str(sub), have))
        elif sub.extras:
            found.extend(_unmet_extras(dist, sub, seen))
    return found


def closure(distributions: Iterable[str]) -> set[str]:
    """Every distribution name the ``distributions`` need, directly or through what they need
    (extras included), as canonical names: a module of one of them that does not import is
    the install's gap, not the release's."""
    todo = [(d, ()) for d in distributions]
    seen: set[str] = set()
    while todo:
        name, extras = todo.pop()
        key = f"{canonicalize_name(name)}{sorted(extras)}"
        if key in seen:
            continue
        seen.add(key)
        reqs = declared(name) if not extras else _extra_requirements(name, extras)
        for req in reqs or []:
            todo.append((req.name, ()))
            if req.extras:
                todo.append((req.name, tuple(sorted(req.extras))))
    return {k.split("[", 1)[0] for k in seen}


def _exempt(exempt: Mapping[str, Mapping[str, str]], dist: str) -> set[str]:
    """The requirement names ``dist`` declares that are not installed (``"*"``: anyone's)."""
    return {canonicalize_name(n) for n in (*exempt.get("*", {}), *exempt.get(dist, {}))}


def _with_extras(name: str, extras: Iterable[str]) -> str:
    wanted = sorted(extras)
    return f"{name}[{','.join(wanted)}]" if wanted else name


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
    extras: dict[str, set[str]] = {}
    for dist in distributions:
        skip = _exempt(exempt, dist)
        for req in declared(dist) or []:
            name = canonicalize_name(req.name)
            extras.setdefault(name, set()).update(req.extras)
            if name in skip or name in pins or name in provided:  # a pin: every range
                continue
            line = f"{_with_extras(req.name, req.extras)}{req.specifier}"
            if line not in seen:
                seen.add(line)
                lines.append(line)
    for name, pin in pins.items():  # a pin keeps the extras its declarations ask for
        lines.append(f"{_with_extras(name, extras.get(name, ()))}=={pin}")
    return lines
