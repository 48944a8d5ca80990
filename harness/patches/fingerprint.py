"""Source fingerprints of patch targets, and the three kinds of change between two sources.

Read from the installed files with ``ast`` (nothing is imported), so a CPU runner can tell,
after installing or downloading tonight's release, which targets changed and how, before
any NPU job starts. Three fingerprints per source:

- ``raw``: the text as written;
- ``text``: the text without any whitespace (what verl's GLM-5.2 patches compare): changes
  when a comment, docstring or token changes;
- ``meaning``: the syntax tree without docstrings (comments and layout never reach it).

``classify`` names the kind of change: ``whitespace`` (only ``raw`` differs), ``comments``
(``text`` differs, ``meaning`` does not: comments or docstrings), ``meaning``.
"""

from __future__ import annotations

import ast
import hashlib
import json
import textwrap
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from harness.patches.declare import DeclaredPatch, split
from harness.stack.upstream import source_file

KINDS = ("same", "whitespace", "comments", "meaning")


@dataclass(frozen=True)
class Fingerprints:
    raw: str
    text: str
    meaning: str


def _digest(data: str) -> str:
    return hashlib.sha256(data.encode()).hexdigest()[:16]


def _without_docstrings(tree: ast.AST) -> ast.AST:
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Module))
                and body and isinstance(body[0], ast.Expr)
                and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)):
            node.body = body[1:] or [ast.Pass()]
    return tree


def fingerprints(source: str) -> Fingerprints:
    """The three fingerprints of one function's (or class's) source."""
    tree = _without_docstrings(ast.parse(textwrap.dedent(source)))
    return Fingerprints(raw=_digest(source), text=_digest("".join(source.split())),
                        meaning=_digest(ast.dump(tree, include_attributes=False)))


def classify(old: Fingerprints, new: Fingerprints) -> str:
    """Which kind of change leads from ``old`` to ``new`` (one of ``KINDS``)."""
    if old.meaning != new.meaning:
        return "meaning"
    if old.text != new.text:
        return "comments"
    if old.raw != new.raw:
        return "whitespace"
    return "same"


_DEFS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
#: how many imports, aliases and base classes ``locate`` follows
MAX_HOPS = 8


def _defined(scope: list[ast.stmt], name: str) -> ast.AST | None:
    """The definition of ``name`` in ``scope`` that wins (the last, as at run time)."""
    found = [n for n in scope if isinstance(n, _DEFS) and n.name == name]
    return found[-1] if found else None


def _imported(tree: ast.Module, module: str, name: str) -> tuple[str, str] | None:
    """Where a module-level ``name`` comes from: ``from M import x as name`` or
    ``name = x`` (an alias in the same module)."""
    for node in tree.body:
        if isinstance(node, ast.ImportFrom):
            for alias in node.names:
                if (alias.asname or alias.name) == name:
                    base = module.rsplit(".", node.level)[0] if node.level else ""
                    source = ".".join(p for p in (base, node.module or "") if p)
                    return source, alias.name
        value = node.value if isinstance(node, (ast.Assign, ast.AnnAssign)) else None
        targets = node.targets if isinstance(node, ast.Assign) else \
            [node.target] if isinstance(node, ast.AnnAssign) else []
        if isinstance(value, ast.Name) and any(
                isinstance(t, ast.Name) and t.id == name for t in targets):
            return module, value.id
    return None


def _find(module: str, parts: list[str], hops: int = 0) -> tuple[Path, ast.AST, str]:
    file = source_file(module)
    if file is None or hops > MAX_HOPS:
        raise LookupError(f"no installed source for module {module}")
    text = file.read_text()
    tree = ast.parse(text)
    node = _defined(tree.body, parts[0])
    if node is None:
        origin = _imported(tree, module, parts[0])
        if origin is None:
            raise LookupError(f"{file} defines no {parts[0]} (nor imports or aliases it; "
                              "an object chosen at run time needs a declared source)")
        return _find(origin[0], [origin[1], *parts[1:]], hops + 1)
    for i, part in enumerate(parts[1:], start=1):
        found = _defined(getattr(node, "body", []), part)
        if found is None and isinstance(node, ast.ClassDef):  # inherited: the bases
            for base in node.bases:
                if isinstance(base, ast.Name):
                    try:
                        return _find(module, [base.id, *parts[i:]], hops + 1)
                    except LookupError:
                        continue
        if found is None:
            raise LookupError(f"{file} defines no {'.'.join(parts[:i + 1])}")
        node = found
    return file, node, text


def locate(path: str) -> tuple[Path, int, str]:
    """Where ``path``'s definition is in the installed sources: (file, line, its source),
    following imports, aliases and base classes. Raises LookupError naming what is missing."""
    module, parts = split(path)
    file, node, text = _find(module, parts)
    segment = ast.get_source_segment(text, node, padded=True) or ""
    return file, getattr(node, "lineno", 0), segment


def report(patches: list[DeclaredPatch],
           previous: dict[str, dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """One row per declared target: where it is, its fingerprints, and (given an earlier
    report's rows by target) which kind of change happened since."""
    rows = []
    for patch in patches:
        for target in patch.targets:
            row: dict[str, Any] = {"patch": patch.name, "target": target,
                                   "releases": patch.releases()}
            try:
                file, line, source = locate(patch.sources.get(target, target))
            except LookupError as exc:
                row.update(status="missing", detail=str(exc))
            else:
                prints = fingerprints(source)
                row.update(status="found", file=str(file), line=line, **asdict(prints))
                before = (previous or {}).get(target)
                if before and before.get("status") == "found":
                    row["change"] = classify(Fingerprints(before["raw"], before["text"],
                                                          before["meaning"]), prints)
            rows.append(row)
    return rows


def load_previous(path: Path) -> dict[str, dict[str, Any]]:
    """An earlier ``report`` written as JSON, by target. A clear error names a bad file."""
    try:
        rows = json.loads(path.read_text())
        return {row["target"]: row for row in rows}
    except (OSError, ValueError, TypeError, KeyError) as exc:
        raise ValueError(f"{path}: not a fingerprint report written by 'npu-regress patches "
                         f"fingerprints --json' ({exc})") from None
