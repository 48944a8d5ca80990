"""verl-glm52-dummy-batch-exact-source: verl 0.9.1's GLM-5.2 partial-wake-up patch compares
vLLM's ``DPEngineCoreProc.execute_dummy_batch`` with an exact whitespace-stripped text, so a
vLLM 0.23.x that only adds a comment there makes the patch raise (an engine with
``VERL_VLLM_ASCEND_GLM52_PATCH`` set fails at start-up). Runs on a CPU: the patch reads and
replaces Python source only."""

from __future__ import annotations

from collections.abc import Mapping

from harness.repro.recipe import Recipe, template

_SCRIPT = '''"""Reproducer: verl's GLM-5.2 partial-wake-up patch (VERL_VLLM_ASCEND_GLM52_PATCH=1)
refuses a vLLM whose DPEngineCoreProc.execute_dummy_batch differs from the released one by a
comment only: patch_vllm_glm52_partial_wake_up() raises RuntimeError "found an unsupported
DPEngineCoreProc dummy-batch implementation".

Exit 1 while the bug is there, 0 when fixed, 2 when this script cannot run (verl or vLLM
missing). `python repro.py --no-comment` is the control: the same function without the
comment, which the patch accepts.

Inputs: vLLM's released execute_dummy_batch body, written to a file with one comment line
added (a file, so that inspect.getsource reads it as verl does), set on DPEngineCoreProc;
then verl's patch, as verl applies it when the variable is set.
"""
import importlib.util
import os
import sys
import tempfile

COMMENT = "    # the same call, commented: no change of behaviour\\n"
FUNCTION = ("def execute_dummy_batch(self):\\n" + "{{comment}}"
            + "    self.model_executor.execute_dummy_batch()\\n")


def main():
    os.environ["VERL_VLLM_ASCEND_GLM52_PATCH"] = "1"
    try:
        from vllm.v1.engine import core
        from verl.utils.vllm import npu_vllm_patch
    except Exception as exc:  # verl or vLLM missing, or not importable here
        print(f"cannot run: {{type(exc).__name__}}: {{exc}} (see requirements.txt)")
        return 2
    comment = "" if "--no-comment" in sys.argv[1:] else COMMENT
    path = os.path.join(tempfile.mkdtemp(), "vllm_dummy_batch.py")
    with open(path, "w") as f:
        f.write(FUNCTION.replace("{{comment}}", comment))
    spec = importlib.util.spec_from_file_location("vllm_dummy_batch", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    core.DPEngineCoreProc.execute_dummy_batch = module.execute_dummy_batch
    print(f"vllm's DPEngineCoreProc.execute_dummy_batch: the released body"
          f"{{', with a comment line added' if comment else ''}}")
    print("expected: verl's patch applies (the behaviour is the released one's)")
    try:
        npu_vllm_patch.patch_vllm_glm52_partial_wake_up()
    except RuntimeError as exc:
        print(f"observed: RuntimeError: {{exc}}")
        return 1
    print("observed: the patch applied")
    return 0
'''


def requirements(versions: Mapping[str, str]) -> list[str]:
    """verl and the vLLM its patch targets (0.23.x), as the manifest has them."""
    return [f"verl=={versions.get('verl', '0.9.1')}", f"vllm=={versions.get('vllm', '0.23.0')}"]


RECIPE = Recipe(
    finding="verl-glm52-dummy-batch-exact-source", script=template(_SCRIPT),
    requirements=requirements,
    inputs="vLLM's released DPEngineCoreProc.execute_dummy_batch with one comment line added "
           "(from a file, so inspect.getsource reads it), then verl's "
           "patch_vllm_glm52_partial_wake_up() with VERL_VLLM_ASCEND_GLM52_PATCH=1",
    expected="the patch applies: a comment changes no behaviour",
    observed="RuntimeError: VERL_VLLM_ASCEND_GLM52_PATCH found an unsupported DPEngineCoreProc "
             "dummy-batch implementation",
    control=("--no-comment",))
