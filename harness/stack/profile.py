"""Stack profiles (``ci/profiles/*.toml``): a coherent upstream stack taken from the
releases' own declarations, which ``ci/setup.sh --profile NAME`` installs, and the record of
the one installed here (``npu_regress_profile.json`` in the environment's site-packages),
which the run reads: a ``forward``
profile's failures are forward-compatibility, never release findings; a profile's declared
deviations (torch on a CPU machine) are notes, not pairing failures.

``python -m harness.stack.profile`` is what ``ci/upstream.sh`` calls: ``get``, ``install``
(the declared requirements, as pip lines) and ``verify`` (what is missing or out of range,
naming the package; exit 1)."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

from harness.stack import requirements
from harness.stack.upstream import profile_record

KINDS = ("release", "forward")
#: where ci/upstream.sh records the installed profile: in the environment it installed it
#: into (beside the .pth of vllm-ascend's sources), so two venvs of one checkout keep theirs
ROOT = Path(__file__).resolve().parents[2]


class ProfileError(ValueError):
    """A profile file that cannot be used (named, with the fix)."""


@dataclass
class Profile:
    name: str
    kind: str
    summary: str
    path: str = ""
    lock: str | None = None
    wheels: dict[str, str] = field(default_factory=dict)
    sources: dict[str, str] = field(default_factory=dict)
    pins: dict[str, str] = field(default_factory=dict)
    not_installed: dict[str, dict[str, str]] = field(default_factory=dict)
    deviations: list[dict[str, str]] = field(default_factory=list)
    #: "fail": setup stops on an unmet requirement; "report": printed (the forward profile,
    #: whose newest releases may not agree with each other: that is what it shows)
    verify: str = "fail"

    @property
    def distributions(self) -> list[str]:
        return [*self.wheels, *self.sources]

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "kind": self.kind, "summary": self.summary,
                "path": self.path, "wheels": self.wheels, "sources": self.sources,
                "pins": self.pins, "not_installed": self.not_installed,
                "deviations": self.deviations, "verify": self.verify}


def from_dict(data: dict[str, Any], path: str = "") -> Profile:
    where = path or "the profile"
    for key in ("name", "kind", "summary"):
        if not isinstance(data.get(key), str):
            raise ProfileError(f"{where}: '{key}' is missing or not a string: add "
                               f'{key} = "..." at the top')
    if data["kind"] not in KINDS:
        raise ProfileError(f"{where}: kind = {data['kind']!r}; use one of {', '.join(KINDS)}")
    verify = data.get("verify", "fail")
    if verify not in ("fail", "report"):
        raise ProfileError(f"{where}: verify = {verify!r}; use 'fail' or 'report'")
    return Profile(name=data["name"], kind=data["kind"], summary=data["summary"], path=path,
                   lock=data.get("lock"), wheels=dict(data.get("wheels", {})),
                   sources=dict(data.get("sources", {})), pins=dict(data.get("pins", {})),
                   not_installed={k: dict(v) for k, v in data.get("not_installed", {}).items()},
                   deviations=list(data.get("deviation", data.get("deviations", []))),
                   verify=verify)


def load(name_or_path: str | Path, root: Path = ROOT) -> Profile:
    """A profile by name (``ci/profiles/NAME.toml``) or by path."""
    path = Path(name_or_path)
    if not path.suffix:
        path = root / "ci" / "profiles" / f"{name_or_path}.toml"
    if not path.is_file():
        known = sorted(p.stem for p in (root / "ci" / "profiles").glob("*.toml"))
        raise ProfileError(f"no stack profile {str(name_or_path)!r} ({path} does not exist); "
                           f"known: {', '.join(known) or 'none'}")
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise ProfileError(f"{path}: not valid TOML ({exc})") from None
    return from_dict(data, str(path))


def active(path: Path | None = None) -> Profile | None:
    """The profile ``ci/setup.sh`` installed in this environment, or None (an Ascend image's
    own stack, or no upstream set)."""
    path = path or profile_record()
    try:
        return from_dict(json.loads(path.read_text(encoding="utf-8")), str(path))
    except (OSError, ValueError):
        return None


def unmet(profile: Profile) -> list[requirements.Unmet]:
    return requirements.unmet(profile.distributions, profile.not_installed)


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) < 2 or args[0] not in ("get", "install", "verify", "record"):
        print("usage: python -m harness.stack.profile {get FIELD|install|verify|record} "
              "PROFILE", file=sys.stderr)
        return 2
    action, *rest = args
    try:
        profile = load(rest[-1])
    except ProfileError as exc:
        print(f"npu-regress profile: {exc}", file=sys.stderr)
        return 2
    if action == "get":
        value = getattr(profile, rest[0])
        for item in (value.items() if isinstance(value, dict) else [(value, None)]):
            print(item[0] if item[1] is None else f"{item[0]}=={item[1]}")
        return 0
    if action == "install":
        for line in requirements.install_lines(profile.distributions, profile.not_installed,
                                               profile.pins):
            print(line)
        return 0
    if action == "record":
        path = profile_record()
        path.write_text(json.dumps(profile.to_dict(), indent=1) + "\n", encoding="utf-8")
        print(f"npu-regress profile: {profile.name} ({profile.kind}) recorded in {path}")
        return 0
    problems = unmet(profile)
    for problem in problems:
        print(f"npu-regress profile {profile.name}: {problem}", file=sys.stderr)
    if problems and profile.verify == "fail":
        print(f"npu-regress profile {profile.name}: {len(problems)} declared requirement(s) "
              f"unmet: install them, or list them under [not_installed] in {profile.path} "
              "with the reason", file=sys.stderr)
        return 1
    if problems:
        print(f"npu-regress profile {profile.name}: {len(problems)} declared requirement(s) "
              "unmet, reported only (verify = \"report\": this profile's releases do not "
              "agree with each other; that is what it shows)")
    else:
        print(f"npu-regress profile {profile.name}: every declared requirement of "
              f"{', '.join(profile.distributions)} is met")
    return 0


if __name__ == "__main__":
    sys.exit(main())
