"""The stack manifest: read from the real installed packages, in an isolated child."""

from __future__ import annotations

import importlib.metadata

import pytest

from harness.hardware import AscendHardwareVersion, NpuVersions
from harness.plugin import stack_manifest as manifest
from harness.report import manifest_diff
from harness.stack.devices import has_module


def test_the_manifest_reads_the_installed_stack_in_a_child() -> None:
    stack = manifest.collect(NpuVersions(AscendHardwareVersion.NONE))
    assert stack["torch"]["version"] == importlib.metadata.version("torch")
    assert stack["torch"]["source"] == "package metadata of torch"
    assert stack["batch_invariant_ops"]["version"] is None  # not on a CPU runner
    assert stack["family"]["version"] == "NONE" and stack["cann"]["version"] == "not detected"
    # the harness itself is installed from this checkout: its git revision comes along
    assert len(stack["npu-regress"].get("revision", "")) == 40


@pytest.mark.skipif(not has_module("vllm_ascend"), reason="the upstream set is not installed")
def test_a_package_without_metadata_is_read_from_its_generated_version_file() -> None:
    entry = manifest.read_packages()["vllm_ascend"]
    assert entry["version"][0].isdigit() and entry["source"].endswith("_version.py (no metadata)")


def test_differences_name_what_changed_and_only_that() -> None:
    then = {"torch": {"version": "2.13.0"}, "cann": {"version": "8.3.RC1"},
            "verl": {"version": "0.9.1", "revision": "a" * 40}}
    now = {"torch": {"version": "2.13.0"}, "cann": {"version": "8.5.0"},
           "verl": {"version": "0.9.1", "revision": "b" * 40}, "vllm": {"version": None}}
    assert manifest_diff.differences(then, then) == []
    assert manifest_diff.differences(then, now) == [
        {"name": "cann", "then": "8.3.RC1", "now": "8.5.0"},
        {"name": "verl", "then": f"0.9.1 @ {'a' * 12}", "now": f"0.9.1 @ {'b' * 12}"},
        {"name": "vllm", "then": "absent", "now": "not installed"}]
    assert manifest_diff.differences(None, now) == [] and manifest_diff.differences(then, "x") == []
