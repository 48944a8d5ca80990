"""Patch guard: every run-time patch a stack applies to vLLM and vllm-ascend (declared with
``harness.patches``; built in: verl's GLM-5.2 patches) is checked against the installed
upstream, each check in its own isolated child: it applies (each target replaced or kept,
with the fingerprint of the source it saw), it is idempotent, it reaches a spawned engine
process, it fails fast on an upstream edit that changes the target's meaning (and not on a
whitespace- or comment-only one), and it changes behaviour only where it means to. The
per-target table lands in the results file and the JUnit properties as ``patch_guard``."""

from __future__ import annotations

from typing import Any

import pytest

import harness
from harness.patches import DeclaredPatch, declared
from harness.patches.checks import (
    check_applies,
    check_behaviour,
    check_idempotent,
    check_propagates,
    check_upstream_edit,
    judge_applies,
    judge_behaviour,
    judge_idempotent,
    judge_propagates,
    judge_upstream_edit,
)
from harness.stack.upstream import version

PATCHES = declared()
#: what the apply of each patch did on the pristine upstream (one child per patch and worker)
_baselines: dict[str, dict[str, Any]] = {}


def _ids(patch: DeclaredPatch) -> str:
    return patch.name


def _needs(patch: DeclaredPatch) -> None:
    missing = [d for d in patch.distributions if version(d) is None]
    if missing:
        pytest.skip(f"{patch.name}: {', '.join(missing)} not installed (bash ci/setup.sh "
                    "--upstream installs the upstream set)")


def _importable(patch: DeclaredPatch, got: dict[str, Any], record_property: Any,
                *, applies: bool = False) -> None:
    """Targets that do not import: on a machine without an NPU, because the CPU stand-in
    lacks a native torch_npu piece (a skip naming it); otherwise a finding about the
    installed releases, failed by ``test_applies`` (the other checks skip pointing to it)."""
    if "unimportable" not in got:
        return
    error = got["unimportable"]
    if patch.standin and harness.device_kind() != "npu" and (
            "torch_npu" in error or "NotStoodIn" in error):
        pytest.skip(f"{patch.name}: the targets do not import on the CPU stand-in device "
                    f"({error}); the fingerprint report still reads them")
    if not applies:
        pytest.skip(f"{patch.name}: the targets do not import on {patch.releases()} "
                    f"(test_applies fails: {error})")
    record_property("release_finding", patch.releases())
    pytest.fail(f"{patch.name}: the targets do not import on {patch.releases()}: {error}",
                pytrace=False)


def _finding(patch: DeclaredPatch, problems: list[str], record_property: Any) -> None:
    if problems:
        record_property("release_finding", patch.releases())
    assert not problems, f"{patch.name} on {patch.releases()}:\n- " + "\n- ".join(problems)


def _baseline(patch: DeclaredPatch, run_on_npu: Any, record_property: Any,
              *, applies: bool = False) -> dict[str, Any]:
    if patch.name not in _baselines:
        _baselines[patch.name] = run_on_npu(check_applies, patch).value
    got = _baselines[patch.name]
    _importable(patch, got, record_property, applies=applies)
    return got


def _applied(patch: DeclaredPatch, run_on_npu: Any, record_property: Any) -> None:
    """Skip a check that needs the patch applied when the apply itself raises (its
    ``test_applies`` case fails with the reason)."""
    got = _baseline(patch, run_on_npu, record_property)
    if got.get("raised"):
        pytest.skip(f"{patch.name} does not apply on {patch.releases()} (test_applies fails: "
                    f"{got['raised']})")


@pytest.mark.parametrize("patch", PATCHES, ids=_ids)
def test_applies(patch: DeclaredPatch, run_on_npu, record_property) -> None:  # type: ignore[no-untyped-def]
    _needs(patch)
    got = _baseline(patch, run_on_npu, record_property, applies=True)
    record_property("patch_guard", {"check": "applies", "raised": got.get("raised"),
                                    "targets": got["targets"]})
    _finding(patch, judge_applies(patch, got), record_property)


@pytest.mark.parametrize("patch", PATCHES, ids=_ids)
def test_idempotent(patch: DeclaredPatch, run_on_npu, record_property) -> None:  # type: ignore[no-untyped-def]
    _needs(patch)
    _applied(patch, run_on_npu, record_property)
    got = run_on_npu(check_idempotent, patch).value
    record_property("patch_guard", {"check": "idempotent", **got})
    _finding(patch, judge_idempotent(patch, got), record_property)


@pytest.mark.parametrize("patch", PATCHES, ids=_ids)
def test_propagates(patch: DeclaredPatch, run_on_npu, record_property) -> None:  # type: ignore[no-untyped-def]
    _needs(patch)
    if patch.spawn_entry is None:
        pytest.skip(f"{patch.name} declares no spawn entry")
    _applied(patch, run_on_npu, record_property)
    got = run_on_npu(check_propagates, patch).value
    record_property("patch_guard", {"check": "propagates", **got})
    _finding(patch, judge_propagates(patch, got), record_property)


@pytest.mark.parametrize("kind", ["whitespace", "comments", "meaning"])
@pytest.mark.parametrize(("patch", "target"), [(p, t) for p in PATCHES for t in p.targets],
                         ids=[f"{p.name}-{t.rsplit(':', 1)[-1]}" for p in PATCHES
                              for t in p.targets])
def test_upstream_edit(patch: DeclaredPatch, target: str, kind: str, run_on_npu,  # type: ignore[no-untyped-def]
               record_property) -> None:
    _needs(patch)
    _applied(patch, run_on_npu, record_property)
    got = run_on_npu(check_upstream_edit, patch, target, kind).value
    record_property("patch_guard", {"check": "upstream-edit", "target": target, **got})
    _finding(patch, judge_upstream_edit(patch, target, got), record_property)


@pytest.mark.parametrize(("patch", "behaviour"), [(p, b) for p in PATCHES for b in p.behaviours],
                         ids=[f"{p.name}-{b.target.rsplit(':', 1)[-1]}" for p in PATCHES
                              for b in p.behaviours])
def test_behaviour(patch: DeclaredPatch, behaviour: Any, run_on_npu,  # type: ignore[no-untyped-def]
                   record_property) -> None:
    _needs(patch)
    _applied(patch, run_on_npu, record_property)
    got = run_on_npu(check_behaviour, patch, behaviour).value
    problems, differ = judge_behaviour(behaviour, got)
    record_property("patch_guard", {"check": "behaviour", "target": behaviour.target,
                                    "kept": got["kept"], "differences": differ})
    _finding(patch, problems, record_property)
