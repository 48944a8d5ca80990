"""The patch guard (``harness.patches``): each check passes a carefully written patch and
fails the patch broken on purpose for it (``tests/patch_toy.py``), the fingerprints tell
whitespace, comments and meaning apart, and verl 0.9.1's GLM-5.2 patches meet the pinned
releases."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from harness import run_isolated
from harness.patches import checks
from harness.patches import declared as declared_patches
from harness.patches.checks import variant
from harness.patches.fingerprint import classify, fingerprints
from harness.stack.upstream import version
from tests.patch_toy import INTENT, declared

WAKE_UP = "tests.patch_toy:Engine.wake_up"


def _run(check, *args):  # type: ignore[no-untyped-def]
    return run_isolated(check, *args, method="forkserver", timeout=240).value


def test_a_careful_patch_passes_every_check() -> None:
    patch = declared("apply_careful")
    applied = _run(checks.check_applies, patch)
    assert checks.judge_applies(patch, applied) == []
    assert applied["targets"][WAKE_UP]["status"] == "replaced"
    assert applied["targets"]["tests.patch_toy:Engine.run_engine"]["status"] == "replaced"
    assert checks.judge_idempotent(patch, _run(checks.check_idempotent, patch)) == []
    propagated = _run(checks.check_propagates, patch)
    assert checks.judge_propagates(patch, propagated) == []
    assert propagated["ran"] == "engine main ran" and propagated["patched"] == {WAKE_UP: True}
    for kind in ("whitespace", "comments", "meaning"):
        assert checks.judge_upstream_edit(patch, WAKE_UP, _run(checks.check_upstream_edit, patch, WAKE_UP, kind)) == []
    problems, differ = checks.judge_behaviour(patch.behaviours[0],
                                       _run(checks.check_behaviour, patch, patch.behaviours[0]))
    assert problems == [] and set(differ) == INTENT


def test_a_patch_without_a_marker_fails_idempotence() -> None:
    patch = declared("apply_without_marker")
    assert checks.judge_applies(patch, _run(checks.check_applies, patch)) == [
        f"{WAKE_UP} was replaced without the marker _toy_patched"]
    # its fingerprint check then rejects its own replacement
    assert checks.judge_idempotent(patch, _run(checks.check_idempotent, patch)) == [
        "a second apply raised RuntimeError: unknown Engine.wake_up implementation (the "
        "replacement it finds is not recognised as its own: no marker?)"]
    # without a fingerprint either, it wraps its own replacement again
    patch = declared("apply_without_marker_or_fingerprint")
    problems = checks.judge_idempotent(patch, _run(checks.check_idempotent, patch))
    assert len(problems) == 1 and problems[0].startswith(
        f"a second apply replaced {WAKE_UP} again"), problems


def test_a_second_apply_that_wraps_the_spawn_entry_again_fails_idempotence() -> None:
    """The wake-up is marked and kept, the spawn entry (not a target) is wrapped again: the
    check covers the entry as well as the targets."""
    patch = declared("apply_wrapping_its_entry_again")
    problems = checks.judge_idempotent(patch, _run(checks.check_idempotent, patch))
    assert len(problems) == 1 and problems[0].startswith(
        "a second apply replaced tests.patch_toy:Engine.run_engine again"), problems


def test_a_spawn_entry_that_does_not_reapply_fails_propagation() -> None:
    patch = declared("apply_without_reapply_in_entry")
    assert checks.judge_propagates(patch, _run(checks.check_propagates, patch)) == [
        "in a spawned process the entry tests.patch_toy._entry_without_reapply raised "
        "TypeError: 'NoneType' object is not callable (its original is None: the entry did "
        "not re-apply the patch before calling it)"]


def test_a_patch_that_does_not_check_its_target_fails_the_upstream_edit() -> None:
    patch = declared("apply_without_fingerprint")
    got = _run(checks.check_upstream_edit, patch, WAKE_UP, "meaning")
    assert checks.judge_upstream_edit(patch, WAKE_UP, got) == [
        f"{WAKE_UP} changed in meaning, and tests.patch_toy:apply_without_fingerprint did not "
        "raise: it replaced the changed upstream (no fail-fast on a meaning change)"]


def test_a_text_fingerprint_passes_whitespace_and_rejects_comments() -> None:
    """verl's kind of fingerprint (whitespace-free text): a whitespace-only change passes,
    a comment-only one is rejected, and the report says which kind it was."""
    patch = declared("apply_with_text_fingerprint")
    assert checks.judge_upstream_edit(patch, WAKE_UP, _run(checks.check_upstream_edit, patch, WAKE_UP, "whitespace")) == []
    comments = _run(checks.check_upstream_edit, patch, WAKE_UP, "comments")
    assert comments["measured"] == "comments"
    assert checks.judge_upstream_edit(patch, WAKE_UP, comments) == [
        f"a comments-only change of {WAKE_UP} made tests.patch_toy:apply_with_text_fingerprint "
        "raise (RuntimeError: unknown Engine.wake_up implementation (text)): its fingerprint "
        "rejects comments changes, so a reformatted upstream fails start-up"]


def test_an_exact_source_fingerprint_fails_on_whitespace() -> None:
    """A whitespace-only change that makes the apply raise is a problem, never harmless."""
    patch = declared("apply_with_exact_source")
    whitespace = _run(checks.check_upstream_edit, patch, WAKE_UP, "whitespace")
    assert whitespace["measured"] == "whitespace"
    assert checks.judge_upstream_edit(patch, WAKE_UP, whitespace) == [
        f"a whitespace-only change of {WAKE_UP} made tests.patch_toy:apply_with_exact_source "
        "raise (RuntimeError: unknown Engine.wake_up implementation (exact source)): its "
        "fingerprint rejects whitespace changes, so a reformatted upstream fails start-up"]


def test_a_patch_that_changes_more_than_it_means_fails_behaviour() -> None:
    patch = declared("apply_overreaching")
    problems, differ = checks.judge_behaviour(patch.behaviours[0],
                                       _run(checks.check_behaviour, patch, patch.behaviours[0]))
    assert differ == ["tags=None", "tags=['weights']", "tags=[]"]
    assert problems == [f"{WAKE_UP} behaves differently, outside the patch's declared intent, "
                        "for tags=None: upstream \"returned True, calls ['wake None', "
                        "'resume']\", patched \"returned None, calls ['wake None', 'resume']\""]


SOURCE = '''def wake_up(self, tags=None):
    """Wake up."""
    if tags is None or tags:
        self.model_executor.wake_up(tags)
    self.resume_scheduler()
'''


@pytest.mark.parametrize("kind", ["whitespace", "comments", "meaning"])
def test_each_variant_is_the_kind_of_change_it_says(kind: str) -> None:
    assert classify(fingerprints(SOURCE), fingerprints(variant(SOURCE, kind))) == kind


def test_a_docstring_change_is_not_a_change_in_meaning() -> None:
    changed = SOURCE.replace('"""Wake up."""', '"""Wake up, now documented."""')
    assert classify(fingerprints(SOURCE), fingerprints(changed)) == "comments"


# --- verl 0.9.1's GLM-5.2 patches on the pinned releases ------------------------------------

def _needs(*distributions: str) -> None:
    missing = [d for d in distributions if version(d) is None]
    if missing:
        pytest.skip(f"{', '.join(missing)} not installed (bash ci/setup.sh --upstream)")


def test_verl_partial_wake_up_patch_on_the_installed_vllm() -> None:
    """On vLLM 0.23.0 (the default profile: the patch's intended pairing) verl 0.9.1's patch
    replaces both targets and its spawn entry, each marked. vllm 0.33.0's
    EngineCore.wake_up (the forward profile) returns whether the executor is fully awake and
    resumes only then: verl 0.9.1's text checks know neither the old nor this form."""
    _needs("verl", "vllm")
    patch = declared_patches(["verl-glm52-vllm-partial-wake-up"])[0]
    got = _run(checks.check_applies, patch)
    assert set(got["targets"]) == {*patch.targets, patch.spawn_entry}
    assert all(row["fingerprint"] for row in got["targets"].values())
    if version("vllm").startswith("0.33."):
        assert checks.judge_applies(patch, got) == [
            "verl.utils.vllm.npu_vllm_patch:patch_vllm_glm52_partial_wake_up raised on verl "
            f"{version('verl')}, vllm {version('vllm')}: RuntimeError: "
            "VERL_VLLM_ASCEND_GLM52_PATCH found an unsupported EngineCore.wake_up "
            "implementation."]
        return
    assert checks.judge_applies(patch, got) == []
    if version("vllm").startswith("0.23."):
        assert {path: row["status"] for path, row in got["targets"].items()} == \
            dict.fromkeys(got["targets"], "replaced")
        assert all(got["targets"][path]["marked"] for path in patch.targets)


def test_the_fingerprint_report_imports_nothing(tmp_path: Path) -> None:
    """Every declared target of verl's set is read from the installed files by ast, and
    none of vLLM, vllm-ascend or verl is imported on the way; against an earlier report,
    a changed target is classified."""
    _needs("verl", "vllm", "vllm-ascend")

    def rows() -> tuple[list[dict], list[str]]:  # type: ignore[type-arg]
        from harness.patches.fingerprint import report

        found = report(declared_patches())
        return found, [m for m in ("vllm", "vllm_ascend", "verl") if m in sys.modules]

    found, imported = run_isolated(rows, method="forkserver").value
    assert imported == []
    assert [r["status"] for r in found] == ["found"] * 6
    assert found[-1]["file"].endswith("vllm_ascend/device/device_op.py")
    earlier = [dict(r) for r in found]
    earlier[0]["meaning"] = "0" * 16
    earlier[1]["text"] = "0" * 16
    previous = tmp_path / "previous.json"
    previous.write_text(json.dumps(earlier))
    from harness.cli import main

    out = tmp_path / "tonight.json"
    assert main(["patches", "fingerprints", "--against", str(previous), "--json",
                 str(out)]) == 0
    changes = [r.get("change") for r in json.loads(out.read_text())]
    assert changes == ["meaning", "comments", "same", "same", "same", "same"]


def test_fingerprint_report_bad_previous_file(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    from harness.cli import main

    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    assert main(["patches", "fingerprints", "--against", str(bad)]) == 2
    assert f"{bad}: not a fingerprint report" in capsys.readouterr().err


def test_the_standin_names_every_native_symbol_and_runs_none() -> None:
    """For the patch guard's imports of vllm-ascend: any torch_npu name exists (classes for
    annotations), and using one raises naming it."""

    def probe() -> tuple[str, str, str]:
        import importlib

        import torch

        from harness.invariance import standin

        standin.stand_in_native_names()
        import torch_npu

        graph = torch.npu.NPUGraph | None  # type: ignore[attr-defined]
        module = importlib.import_module("torch_npu.contrib.function")
        try:
            torch_npu.npu_fusion_attention(1)
        except standin.NotStoodIn as exc:
            message = str(exc)
        return repr(graph), module.__name__, message

    graph, module, message = run_isolated(probe, method="forkserver").value
    assert "NPUGraph" in graph and module == "torch_npu.contrib.function"
    assert message == ("torch_npu.npu_fusion_attention is native torch_npu code: the CPU "
                       "stand-in does not run it")


def test_a_release_without_the_patch_function_is_an_upstream_api_moved(pytester) -> None:  # type: ignore[no-untyped-def]
    """verl 0.9.0 has no patch_vllm_glm52_partial_wake_up (0.9.1 added it): the guard's
    failure there is an upstream API that moved, not a finding about the release's patch."""
    from harness.stack.upstream import UpstreamApiMoved

    with pytest.raises(UpstreamApiMoved, match="has no tests.patch_toy:apply_gone"):
        checks.prepare(declared("apply_gone"))
    pytester.makepyfile(test_gone="""
        from harness.patches import checks
        from tests.patch_toy import declared

        def test_applies(run_on_npu):
            run_on_npu(checks.check_applies, declared("apply_gone"))
    """)
    pytester.syspathinsert(str(Path(__file__).resolve().parent.parent))
    results = pytester.path / "r.jsonl"
    pytester.runpytest(f"--harness-results={results}").assert_outcomes(failed=1)
    [test] = [json.loads(ln) for ln in results.read_text().splitlines()
              if json.loads(ln)["type"] == "test"]
    assert test["category"] == "upstream-drift"
