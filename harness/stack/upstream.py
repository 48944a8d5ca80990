"""What the harness knows of installed upstream code (vLLM, vllm-ascend, verl): which
release it is, where a module's source lies (found without importing), how to import a
module whose package ``__init__`` needs what a CPU runner lacks, and ``UpstreamApiMoved``, the
outcome when a symbol an adapter relies on is missing or renamed in the installed release.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import re
import sys
import types
from collections.abc import Iterable
from pathlib import Path


class UpstreamApiMoved(Exception):
    """An upstream module or symbol that an adapter relies on is missing or renamed: the
    release's API moved (results category ``upstream-drift``, its public name). Not a drift:
    in this harness a drift is the size of a difference only (``harness.drift``)."""


def package_dirs(package: str) -> list[Path]:
    """The folders of the installed top-level ``package``, found without importing it (its
    ``__init__`` may pull in a device stack); empty when it is not installed as a package."""
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        return []
    if spec is None or not spec.submodule_search_locations:
        return []
    return [Path(location) for location in spec.submodule_search_locations]


def source_file(module: str) -> Path | None:
    """Where ``module``'s source would be, found from its top package without importing
    anything (a parent package's ``__init__`` may pull in a device stack)."""
    top, *rest = module.split(".")
    dirs = package_dirs(top)
    if not dirs:
        return None
    base = dirs[0].joinpath(*rest)
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def version(distribution: str) -> str | None:
    """The installed version of ``distribution``, or of sources that carry a ``_version.py``
    (vllm-ascend's, from the upstream set); None if neither is there."""
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        pass
    version_file = source_file(f"{distribution.replace('-', '_')}._version")
    if version_file is not None:
        found = re.search(r"__version__\s*=.*?['\"]([^'\"]+)['\"]", version_file.read_text())
        if found:
            return found.group(1)
    return None


def release(distribution: str) -> str:
    """``name version`` of what is installed, else ``name (version unknown)``."""
    found = version(distribution)
    return f"{distribution} {found}" if found else f"{distribution} (version unknown)"


def import_upstream(module: str, *, skip_inits: tuple[str, ...] = ()) -> types.ModuleType:
    """Import ``module``; the packages in ``skip_inits`` get an empty parent instead of their
    ``__init__`` (verl's imports ray, tensordict and transformers: none of them is needed
    by ``verl.utils.device``, and none is installed on a CPU runner). Child side."""
    for name in skip_inits:
        if name in sys.modules:
            continue
        spec = importlib.util.find_spec(name)
        if spec is None or spec.submodule_search_locations is None:
            raise UpstreamApiMoved(f"upstream API moved: no package {name}")
        parent = types.ModuleType(name)
        parent.__path__ = list(spec.submodule_search_locations)
        parent.__spec__ = spec
        sys.modules[name] = parent
    return importlib.import_module(module)


def require(module: types.ModuleType, distribution: str, symbols: Iterable[str]) -> None:
    """``UpstreamApiMoved`` naming every one of ``symbols`` that ``module`` lacks."""
    missing = [s for s in symbols if not hasattr(module, s)]
    if missing:
        raise UpstreamApiMoved(f"upstream API moved: {release(distribution)} has no "
                            f"{', '.join(f'{module.__name__}.{s}' for s in missing)}")


#: where ci/upstream.sh unpacks what is read, not imported (torch-npu's wheel files)
UPSTREAM_DIR = Path(__file__).resolve().parents[2] / ".upstream"


#: the file ci/upstream.sh records the installed stack profile in, in the environment's
#: site-packages (``harness.stack.profile``); ``$HARNESS_PROFILE_RECORD`` names another
PROFILE_RECORD = "npu_regress_profile.json"
PROFILE_RECORD_ENV = "HARNESS_PROFILE_RECORD"


def profile_record() -> Path:
    import os
    import sysconfig

    return Path(os.environ.get(PROFILE_RECORD_ENV)
                or Path(sysconfig.get_paths()["purelib"]) / PROFILE_RECORD)


def _profile_source(name: str) -> str | None:
    """The version of ``name`` the installed stack profile takes from sources, if any."""
    import json

    try:
        return json.loads(profile_record().read_text(encoding="utf-8"))["sources"][name]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def torch_npu_file(relative: str) -> tuple[Path, str] | None:
    """A file of the torch_npu package (``include/...``) and the release it belongs to: from
    an installed torch_npu (found without importing it), else from the upstream set's
    unpacked torch-npu wheel; None if neither has it."""
    dirs = package_dirs("torch_npu")
    if dirs and (path := dirs[0] / relative).is_file():
        return path, release("torch-npu")
    trees = sorted(UPSTREAM_DIR.glob("torch-npu-*"), reverse=True)
    wanted = _profile_source("torch-npu")  # the installed profile's, before any other
    trees.sort(key=lambda tree: tree.name != f"torch-npu-{wanted}")
    for tree in trees:
        path = tree / "torch_npu" / relative
        if path.is_file():
            return path, f"torch-npu {tree.name.removeprefix('torch-npu-')}"
    return None
