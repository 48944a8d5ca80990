"""Is the runner's stack coherent, before anything else is judged? (suite
``suites/test_stack_preflight.py``)

A runner whose torch_npu was built for another torch, or whose ``batch_invariant_ops``
package lacks an op the installed vllm-ascend calls, fails every later check for reasons
that have nothing to do with what those checks test. These checks name the component and
the fix instead.
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path

from packaging.version import InvalidVersion, Version

from harness.stack.upstream import package_dirs

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
    found: set[str] = set()
    for root in package_dirs(package):
        for path in root.rglob("*.py"):
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


# --- CANN and driver against the installed vllm-ascend ------------------------------------

#: The CANN each vllm-ascend release is built and tested with ("Stable CANN" in the release
#: compatibility matrix of vllm-ascend's docs/source/community/versioning_policy.md, read at
#: v0.23.0.post1; its installation guide asks for exactly that CANN). Serves installs that
#: carry no docs (wheels); a matrix shipped beside the installed sources is read first.
STATED_CANN: dict[str, str] = {
    "0.23.0.post1": "9.1.0", "0.23.0": "9.1.0", "0.23.0rc1": "9.0.1",
    "0.22.1rc1": "9.0.0", "0.21.0rc1": "9.0.0", "0.20.2rc1": "9.0.0",
    "0.19.1rc1": "8.5.1", "0.18.0": "8.5.1", "0.18.0rc1": "8.5.1", "0.17.0rc1": "8.5.1",
    "0.16.0rc1": "8.5.1", "0.15.0rc1": "8.5.0", "0.14.0rc1": "8.5.0", "0.13.0": "8.5.0",
    "0.13.0rc3": "8.5.1", "0.12.0rc1": "8.3.RC2", "0.11.0": "8.3.RC2",
}
#: where a source checkout (and ci/upstream.sh's unpacked sdist) keeps the matrix, relative
#: to the folder that holds the ``vllm_ascend`` package
MATRIX_PATH = Path("docs/source/community/versioning_policy.md")
_MATRIX_ROW = re.compile(r"^\|\s*v?(?P<release>[0-9][^|\s]*)\s*\|[^|]*\|[^|]*\|"
                         r"\s*(?P<cann>[0-9][^|\s]*)\s*\|")


def parse_matrix(text: str) -> dict[str, str]:
    """vllm-ascend release -> its "Stable CANN", from the compatibility matrix's table rows
    (``| v0.23.0 | v0.23.0 | >= 3.10, < 3.13 | 9.1.0 | ...``); other lines are ignored."""
    found: dict[str, str] = {}
    for line in text.splitlines():
        match = _MATRIX_ROW.match(line.strip())
        if match:
            found.setdefault(match["release"], match["cann"])
    return found


def installed_matrix(package: str = "vllm_ascend") -> Path | None:
    """The compatibility matrix beside the installed ``package`` (a checkout, or the unpacked
    sdist of the upstream set), or None for installs without docs."""
    for root in package_dirs(package):
        if (path := root.parent / MATRIX_PATH).is_file():
            return path
    return None


def stated_cann(release: str, matrix: Path | None = None) -> tuple[str, str] | None:
    """(the CANN ``release`` of vllm-ascend is released for, where that was read), or None
    when neither the matrix file nor :data:`STATED_CANN` knows the release."""
    key = release.removeprefix("v")
    if matrix is not None:
        try:
            rows = parse_matrix(matrix.read_text(encoding="utf-8", errors="replace"))
        except OSError:
            rows = {}
        if key in rows:
            return rows[key], str(matrix)
    if key in STATED_CANN:
        return STATED_CANN[key], "harness.hardware.preflight.STATED_CANN (vllm-ascend's matrix)"
    return None


def cann_problem(cann: str, release: str, stated: str, source: str) -> str | None:
    """Why CANN ``cann`` is too old for vllm-ascend ``release`` (released for ``stated``), or
    None. A newer CANN is not judged here: the release names one version, not a ceiling."""
    from harness.hardware import parse_version

    have, need = parse_version(cann), parse_version(stated)
    if have is None or need is None:
        return (f"cannot compare CANN {cann!r} with {stated!r}, the CANN vllm-ascend {release} "
                f"is released for (read from {source})")
    if have >= need:
        return None
    older = sorted((r for r, c in STATED_CANN.items()
                    if (v := parse_version(c)) is not None and v <= have),
                   key=lambda r: Version(r), reverse=True)
    instead = f", or vllm-ascend {older[0]} (released for CANN {STATED_CANN[older[0]]})" \
        if older else ""
    return (f"CANN {cann} is older than {stated}, the CANN vllm-ascend {release} is released "
            f"for (read from {source}): install CANN {stated} (the "
            f"`cann:{stated.lower()}-<chip>-...` images ship it){instead}")
