"""What is installed here, read without importing it: the stack manifest's package entries
(package metadata and ``direct_url.json`` only, a checkout's git revision, a generated
version file for a package copied in without metadata). Below the pytest face, so that the
bisect (which reads the manifests of two nights and the versions installed here) and the
pytest face share it without the bisect loading a pytest plugin. Run in a fresh interpreter
by the callers (``harness.plugin.stack_manifest`` through the isolation core, the bisect
through ``python -c``), so that nothing the caller imported skews it."""

from __future__ import annotations

import ast
import contextlib
import importlib.metadata
import importlib.util
import json
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

#: manifest key -> distribution name: the packages every manifest lists
MANIFEST_DISTRIBUTIONS = {
    "npu-regress": "npu-regress", "torch": "torch", "torch_npu": "torch-npu",
    "vllm": "vllm", "vllm_ascend": "vllm-ascend", "verl": "verl",
    "batch_invariant_ops": "batch_invariant_ops", "pytest": "pytest",
    "sglang": "sglang", "transformers": "transformers",
}
#: the module to look for when a package has no metadata (built and copied in by hand)
MODULES = {"torch_npu": "torch_npu", "vllm_ascend": "vllm_ascend",
           "batch_invariant_ops": "batch_invariant_ops", "sglang": "sglang"}
#: the files a package without metadata may state its version in (setuptools-scm's,
#: SGLang's own)
VERSION_FILES = ("_version.py", "version.py")

Manifest = dict[str, dict[str, Any]]


def read_packages() -> Manifest:
    """In the child: ``{name: {"version", "source"[, "revision"]}}`` for Python and each
    package (``version`` None: not installed)."""
    entries: Manifest = {"python": {"version": platform.python_version(),
                                    "source": sys.executable}}
    for key, dist in {**MANIFEST_DISTRIBUTIONS, **_profile_packages()}.items():
        try:
            found = importlib.metadata.distribution(dist)
        except importlib.metadata.PackageNotFoundError:
            entries[key] = _without_metadata(key)
            continue
        entry: dict[str, Any] = {"version": found.version,
                                 "source": f"package metadata of {dist}"}
        revision = None
        for candidate in importlib.metadata.distributions(name=dist):  # an egg-info in the
            revision = revision or _source_revision(candidate)  # cwd can shadow the install
        if revision:
            entry.update(revision)
        entries[key] = entry
    return entries


def _profile_packages() -> dict[str, str]:
    """Every wheel and pin of the stack profile installed here (tensordict, fastapi...), so
    that a change of any of them is seen between two nights (``npu-regress bisect``)."""
    from harness.stack.upstream import profile_record

    try:
        profile = json.loads(profile_record().read_text(encoding="utf-8"))
        names = [*profile.get("wheels", {}), *profile.get("pins", {})]
    except (OSError, ValueError, AttributeError):
        return {}
    known = set(MANIFEST_DISTRIBUTIONS.values())
    return {name: name for name in names if isinstance(name, str) and name not in known}


def _without_metadata(key: str) -> dict[str, Any]:
    module = MODULES.get(key)
    spec = None
    if module:
        with contextlib.suppress(Exception):
            spec = importlib.util.find_spec(module)
    if spec is None or not spec.origin:
        return {"version": None, "source": "not installed"}
    for name in VERSION_FILES:
        generated = Path(spec.origin).parent / name  # setuptools-scm / vcs-versioning
        values = _literal_assignments(generated, ("__version__", "__commit_id__"))
        if values.get("__version__"):
            break
    if values.get("__version__"):
        entry = {"version": str(values["__version__"]), "source": f"{generated} (no metadata)"}
        if values.get("__commit_id__"):
            entry.update(revision=str(values["__commit_id__"]), revision_source=str(generated))
        return entry
    return {"version": "unknown", "source": f"module {module} at {spec.origin} (no metadata)"}


def _literal_assignments(path: Path, names: tuple[str, ...]) -> dict[str, Any]:
    """``NAME = <literal>`` values in a Python file, read without importing it."""
    found: dict[str, Any] = {}
    with contextlib.suppress(OSError, SyntaxError, ValueError):
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if isinstance(node, ast.Assign):
                targets = [t for t in node.targets if isinstance(t, ast.Name)]
                # ``__version__ = version = '1.0'``: every name bound to the same literal
                for target in targets:
                    if target.id in names:
                        with contextlib.suppress(ValueError):
                            found[target.id] = ast.literal_eval(node.value)
    return found


def _source_revision(dist: importlib.metadata.Distribution) -> dict[str, Any] | None:
    """Where a package installed from a checkout or a VCS URL came from, and its revision."""
    with contextlib.suppress(Exception):
        raw = dist.read_text("direct_url.json")
        if not raw:
            return None
        info = json.loads(raw)
        vcs = info.get("vcs_info") or {}
        if vcs.get("commit_id"):
            return {"revision": vcs["commit_id"], "revision_source": info.get("url", "")}
        url = urlparse(info.get("url", ""))
        if url.scheme == "file":
            path = unquote(url.path)
            out = subprocess.run(["git", "-C", path, "rev-parse", "HEAD"], capture_output=True,
                                 text=True, timeout=10, check=False)
            if out.returncode == 0 and out.stdout.strip():
                return {"revision": out.stdout.strip(), "revision_source": f"git in {path}"}
    return None


def manifest_key(distribution: str) -> str:
    """The manifest entry a distribution is recorded under (``vllm-ascend``: ``vllm_ascend``;
    a profile's other packages under their own names)."""
    return next((k for k, d in MANIFEST_DISTRIBUTIONS.items() if d == distribution),
                distribution)


def entry_version(entry: object) -> str | None:
    """A stack manifest entry's version as the results file holds it: an object with
    ``version`` (and ``source``: where it was read); None where it says not installed or is
    no entry. Every reader of a manifest outside the report uses this one."""
    version = entry.get("version") if isinstance(entry, dict) else None
    return None if version is None else str(version)


def distribution(key: str) -> str:
    """The distribution a manifest entry names."""
    return MANIFEST_DISTRIBUTIONS.get(key, key)
