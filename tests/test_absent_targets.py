"""One skip per absent target (harness.plugin.absent), the vLLM target's device support
read from its release's own registrations, and the stand-in's native namespaces."""

from __future__ import annotations

import pytest

from harness.invariance.adapters import registration_keys

pytest_plugins = ["pytester"]


def test_an_absent_target_is_one_skip(pytester: pytest.Pytester) -> None:
    pytester.makeconftest('''
import pytest

@pytest.hookimpl(optionalhook=True)
def pytest_harness_absent_target(item):
    impl = item.callspec.params.get("impl") if hasattr(item, "callspec") else None
    return ("impl gone", "release 1.0 has no gone module") if impl == "gone" else None
''')
    pytester.makepyfile(test_t='''
import pytest

@pytest.mark.parametrize("impl", ["here", "gone"])
@pytest.mark.parametrize("case", range(5))
def test_it(case, impl):
    assert impl == "here"
''')
    run = pytester.runpytest("-rs", "-p", "no:cacheprovider")
    run.assert_outcomes(passed=5, skipped=1, deselected=4)
    run.stdout.fnmatch_lines(["*impl gone: release 1.0 has no gone module; this one skip "
                              "stands for its 5 cases (4 deselected)*"])


def test_the_vllm_target_reads_its_release_dispatch_keys() -> None:
    old = 'lib.impl("aten::mm", f, "CUDA")\nlib.impl("aten::bmm", g, "CUDA")\n'
    new = 'key = platform.key\nlib.impl("aten::mm", f, key)\n'
    assert registration_keys(old) == {"CUDA"}
    assert registration_keys(new) == {"<platform>"}


def test_the_standin_answers_native_namespaces_in_annotations() -> None:
    import harness

    def probe() -> str:
        from harness.invariance import standin

        standin.stand_in_native_names()
        import torch_npu

        class GraphParams:  # vllm-ascend 0.23.0 compilation/acl_graph.py
            handles: dict[int, list[torch_npu._C._NPUTaskGroupHandle]]

        try:
            torch_npu._C._NPUTaskGroupHandle()
        except standin.NotStoodIn as exc:
            return str(exc)
        return "no refusal"

    said = harness.run_isolated(probe).value
    assert "torch_npu._C._NPUTaskGroupHandle is native torch_npu code" in said


def test_the_target_option_names_every_built_in_target(pytester: pytest.Pytester) -> None:
    """``--bi-target``'s help lists the targets the registry builds, all of them."""
    from harness.invariance import BUILTIN_TARGETS, _builtin

    assert tuple(_builtin()) == BUILTIN_TARGETS
    text = " ".join(" ".join(pytester.runpytest("--help").stdout.lines).split())
    option = text[text.index("--bi-target=NAME"):].split(" --", 1)[0]
    assert f"(repeatable): {', '.join(BUILTIN_TARGETS)}, or one added" in option, option
