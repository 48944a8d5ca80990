"""pytest's private internals: used in one module only, each one's shape checked on the
installed pytest (ci/compat.sh runs this file on the oldest and newest pytest of the
declared range), and each fallback keeping the outcome."""

from __future__ import annotations

import ast
import types
from pathlib import Path
from typing import Any

import pytest

from harness.plugin import failure_repr, pytest_private

ROOT = Path(__file__).resolve().parent.parent


def test_every_declared_private_use_has_the_shape_the_harness_uses() -> None:
    drifted = [(use.name, problem) for use, problem in pytest_private.drift()]
    assert drifted == [], f"pytest {pytest.__version__}: {drifted}"


def test_no_module_but_pytest_private_imports_pytest_internals() -> None:
    """Before: 38 uses of ``_pytest`` across 8 modules, ``SetupState`` imported at module top
    of ``forked_probe.py`` (a rename there breaks every pytest run in the environment)."""
    found = []
    for path in (ROOT / "harness").rglob("*.py"):
        if path.name == "pytest_private.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            text = ast.unparse(node) if isinstance(node, (ast.Constant,)) else ""
            if any(n == "_pytest" or n.startswith("_pytest.") for n in names) or \
                    text.startswith("'_pytest."):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
            if isinstance(node, ast.keyword) and node.arg == "_ispytest":
                found.append(f"{path.relative_to(ROOT)}:{node.value.lineno} (_ispytest)")
    assert found == []


def test_the_rewrite_wrapper_reads_only_the_code_and_returns_pytests_result(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """pytest 9.1 returned (stat, code), 9.2 (source_hash, code): before, the wrapper read
    ``stat.st_mtime_ns`` and 9.2 collected nothing ('bytes' object has no attribute
    'st_mtime_ns'). Any first element works now, and an unknown shape is passed through."""
    from _pytest.assertion import rewrite

    code = compile("x = 1", "m.py", "exec")
    shapes = {"hash": (b"\x00" * 8, code), "stat": (object(), code), "odd": ("a", "b", "c")}
    for shape, result in shapes.items():
        monkeypatch.setattr(rewrite, "_rewrite_test", _returning(result))
        kept: list[Any] = []
        assert pytest_private.remember_rewrites(lambda p, c, into=kept: into.append(c))
        assert rewrite._rewrite_test(tmp_path / "m.py", None) is result, shape
        assert kept == ([] if shape == "odd" else [code]), shape


def _returning(result: Any) -> Any:
    def _rewrite_test(fn: Path, config: Any) -> Any:
        return result
    return _rewrite_test


def test_without_pytests_assertion_hooks_the_test_runs_without_the_diff(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The fallback keeps the outcome: the assert still fails, only pytest's diff is gone."""
    monkeypatch.setattr(pytest_private, "assertion_protocol", lambda: None)
    settings = failure_repr.RenderSettings()
    with failure_repr.assertion_detail(settings, lambda *a: None), \
            pytest.raises(AssertionError):
        assert [1, 2, 3] == [1, 2, 4]


def test_a_fixture_the_child_cannot_build_is_a_named_harness_gap(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pytest_private, "_module", lambda name: types.SimpleNamespace())
    with pytest.raises(pytest_private.PrivateDrift,
                       match=r"cannot build `capsys` in the isolated child on pytest"):
        pytest_private.capture_fixture("capsys")


def test_a_test_module_that_imports_torch_gets_torch_preloaded() -> None:
    """Before: torch 2.13 starts a native thread at import, so the warm-up of such a module
    was refused and each isolated test imported torch itself (1061 ms a test)."""
    from harness.plugin.preload import _imports_torch

    torch = pytest.importorskip("torch")
    assert _imports_torch(types.SimpleNamespace(torch=torch, x=1))
    assert _imports_torch(types.SimpleNamespace(nn=torch.nn))
    assert not _imports_torch(types.SimpleNamespace(os=ast, x=1))
