"""Is the runner's stack coherent, before anything else is judged? (suite
``suites/test_stack_preflight.py``)

A runner whose torch_npu was built for another torch, or whose ``batch_invariant_ops``
package lacks an op the installed vllm-ascend calls, fails every later check for reasons
that have nothing to do with what those checks test. These checks name the component and
the fix instead.
"""

from __future__ import annotations

import importlib
import importlib.util
import re
from pathlib import Path

from packaging.version import InvalidVersion, Version

OPS_NAMESPACE = "batch_invariant_ops"
_OP_USE = re.compile(r"torch\.ops\.batch_invariant_ops\.([A-Za-z_][A-Za-z0-9_]*)")


def torch_pair_problem(torch_version: str, torch_npu_version: str) -> str | None:
    """Why this torch and torch_npu do not go together, or None. A torch_npu release X.Y.Z
    (any .postN) is built for torch X.Y.Z (torch-npu 2.14.0 needs torch 2.14.0)."""
    try:
        torch_release = Version(torch_version).release[:3]
        npu_release = Version(torch_npu_version).release[:3]
    except InvalidVersion as exc:
        return f"cannot compare torch {torch_version!r} with torch_npu {torch_npu_version!r}: {exc}"
    if torch_release == npu_release:
        return None
    wanted = ".".join(map(str, npu_release))
    return (f"torch {torch_version} is installed with torch_npu {torch_npu_version}, which is "
            f"built for torch {wanted}: install torch=={wanted}, or the torch_npu release for "
            f"torch {'.'.join(map(str, torch_release))} (Ascend images ship them matched; "
            "a bare `pip install torch` replaces the matched one)")


def ops_used_by(package: str = "vllm_ascend") -> set[str]:
    """The ``torch.ops.batch_invariant_ops.*`` names the installed ``package`` calls, read
    from its source files (nothing imported)."""
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        return set()
    if spec is None or not spec.submodule_search_locations:
        return set()
    found: set[str] = set()
    for root in spec.submodule_search_locations:
        for path in Path(root).rglob("*.py"):
            try:
                found.update(_OP_USE.findall(path.read_text(encoding="utf-8",
                                                            errors="replace")))
            except OSError:
                continue
    return found


def unregistered(ops: list[str]) -> list[str]:
    """In an isolated child: import torch_npu and the ops package (which registers its ops),
    then the names in ``ops`` that ``torch.ops.batch_invariant_ops`` does not have."""
    import torch

    importlib.import_module("torch_npu")
    importlib.import_module(OPS_NAMESPACE)
    namespace = getattr(torch.ops, OPS_NAMESPACE)
    missing = []
    for op in sorted(ops):
        try:
            getattr(namespace, op)
        except (AttributeError, RuntimeError):
            missing.append(op)
    return missing
