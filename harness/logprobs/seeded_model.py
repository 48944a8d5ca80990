"""A small Llama checkpoint with real, seeded random weights and a local tokenizer, for
engines that load a model from a folder (vLLM, vllm-ascend).

Why not ``load_format="dummy"``: vLLM's dummy weights are U(-1e-3, 1e-3), so every logprob
is -ln(vocab) +- a few ULP, a flat distribution where greedy decoding picks among near-ties
and a bit-equality check proves nothing (the vacuity guard fails it). These weights are
N(0, std) from a seeded ``torch.Generator`` (norms 1), the scale of a trained model's init,
written as safetensors with a Hugging Face ``config.json`` and a WordLevel tokenizer: a
complete model folder that needs no hub. The folder is built once per content and cached
under ``$NPU_REGRESS_CACHE`` (default ``~/.cache/npu-regress``) by the hash of everything
that decides its bytes; a folder whose files do not match its manifest is rebuilt.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

#: bump when the bytes written for the same spec change
FORMAT = 1
#: a Llama about the size of TinyDecoder (3.3 M parameters)
SMALL_LLAMA: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256,
    "intermediate_size": 688, "num_attention_heads": 8, "num_key_value_heads": 2,
    "num_hidden_layers": 4, "vocab_size": 1024, "max_position_embeddings": 512,
    "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "tie_word_embeddings": False,
    "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu",
}
MANIFEST = "npu-regress-model.json"


def cache_root() -> Path:
    return Path(os.environ.get("NPU_REGRESS_CACHE") or Path.home() / ".cache" / "npu-regress")


def spec(config: dict[str, Any] | None = None, seed: int = 0, std: float = 0.02
         ) -> dict[str, Any]:
    return {"format": FORMAT, "config": {**SMALL_LLAMA, **(config or {})}, "seed": seed,
            "std": std}


def spec_hash(model_spec: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(model_spec, sort_keys=True).encode()).hexdigest()[:16]


def _tensors(config: dict[str, Any], seed: int, std: float) -> dict[str, Any]:
    """Llama's parameter names and shapes, filled from one seeded generator in a fixed
    order (so the bytes depend on the spec and torch's normal sampler only)."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    hidden, inter, vocab = (config["hidden_size"], config["intermediate_size"],
                            config["vocab_size"])
    head = hidden // config["num_attention_heads"]
    kv = config["num_key_value_heads"] * head

    def normal(*shape: int) -> Any:
        return torch.randn(*shape, generator=gen, dtype=torch.float32) * std

    out: dict[str, Any] = {"model.embed_tokens.weight": normal(vocab, hidden)}
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        out[p + "self_attn.q_proj.weight"] = normal(hidden, hidden)
        out[p + "self_attn.k_proj.weight"] = normal(kv, hidden)
        out[p + "self_attn.v_proj.weight"] = normal(kv, hidden)
        out[p + "self_attn.o_proj.weight"] = normal(hidden, hidden)
        out[p + "mlp.gate_proj.weight"] = normal(inter, hidden)
        out[p + "mlp.up_proj.weight"] = normal(inter, hidden)
        out[p + "mlp.down_proj.weight"] = normal(hidden, inter)
        out[p + "input_layernorm.weight"] = torch.ones(hidden)
        out[p + "post_attention_layernorm.weight"] = torch.ones(hidden)
    out["model.norm.weight"] = torch.ones(hidden)
    out["lm_head.weight"] = normal(vocab, hidden)
    return out


def _tokenizer_files(folder: Path, vocab: int) -> None:
    """A WordLevel tokenizer over ``<unk> <s> </s> t3 .. t{vocab-1}``: text "t5 t9" is
    tokens [5, 9] (written as tokenizer.json by the ``tokenizers`` library)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"t{i}": i for i in range(3, vocab)}}
    tok = Tokenizer(models.WordLevel(words, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>",
        "eos_token": "</s>", "unk_token": "<unk>", "model_max_length": 512}, indent=1))


def file_digests(folder: Path, names: list[str]) -> dict[str, str]:
    """sha256 of each named file of the model folder (what its manifest records)."""
    return {n: hashlib.sha256((folder / n).read_bytes()).hexdigest() for n in names}


def checkpoint_digest(folder: Path) -> str:
    """The checkpoint's identity: the sha256 of its files, computed from the files (a changed
    file changes the digest), over the names its manifest records."""
    from hashlib import sha256

    manifest = json.loads((folder / MANIFEST).read_text())
    files = file_digests(folder, sorted(manifest["files"]))
    return sha256(json.dumps(files, sort_keys=True).encode()).hexdigest()


def _intact(folder: Path) -> bool:
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
        return file_digests(folder, sorted(manifest["files"])) == manifest["files"]
    except (OSError, ValueError, KeyError, TypeError):
        return False


def build(config: dict[str, Any] | None = None, seed: int = 0, std: float = 0.02,
          root: Path | None = None) -> Path:
    """The model folder for this spec: from the cache when intact, else built there (in a
    temporary folder first, then renamed: two processes never see a half-written one). The
    checkpoint is fp32; an engine casts it to the case's dtype."""
    from safetensors.torch import save_file

    model_spec = spec(config, seed, std)
    folder = (root or cache_root()) / "models" / f"llama-{spec_hash(model_spec)}"
    if not _intact(folder):
        folder.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=folder.name + ".", dir=folder.parent))
        cfg = {**model_spec["config"], "torch_dtype": "float32"}
        (tmp / "config.json").write_text(json.dumps(cfg, indent=1))
        save_file(_tensors(cfg, seed, std), str(tmp / "model.safetensors"),
                  metadata={"format": "pt"})
        _tokenizer_files(tmp, cfg["vocab_size"])
        names = sorted(p.name for p in tmp.iterdir())
        (tmp / MANIFEST).write_text(json.dumps({"spec": model_spec,
                                                "files": file_digests(tmp, names)}, indent=1))
        shutil.rmtree(folder, ignore_errors=True)
        try:
            tmp.rename(folder)
        except OSError:  # another process renamed its copy first
            shutil.rmtree(tmp, ignore_errors=True)
    return folder


#: the LoRA adapters' target modules and rank (small, as a serving test's adapters are)
LORA_TARGETS = ("q_proj", "v_proj", "down_proj")
LORA_RANK = 8


def build_lora(model: Path, seed: int, scale: float = 0.05) -> Path:
    """A LoRA adapter of the seeded model in PEFT's layout (``adapter_config.json``,
    ``adapter_model.safetensors``), beside the model in the cache: A and B both drawn from
    ``seed`` (PEFT starts B at zero, an adapter that changes nothing; a served adapter must
    change the logprobs, which the LoRA case checks)."""
    import torch
    from safetensors.torch import save_file

    cfg = json.loads((model / "config.json").read_text())
    folder = model.parent / f"{model.name}-lora{seed}"
    if (folder / "adapter_model.safetensors").exists():
        return folder
    gen = torch.Generator().manual_seed(10_000 + seed)
    hidden, inter = cfg["hidden_size"], cfg["intermediate_size"]
    kv = cfg["num_key_value_heads"] * (hidden // cfg["num_attention_heads"])
    shapes = {"q_proj": (hidden, hidden), "v_proj": (kv, hidden), "down_proj": (hidden, inter)}
    tensors = {}
    for i in range(cfg["num_hidden_layers"]):
        for name in LORA_TARGETS:
            out, inp = shapes[name]
            where = "self_attn" if name != "down_proj" else "mlp"
            key = f"base_model.model.model.layers.{i}.{where}.{name}"
            tensors[f"{key}.lora_A.weight"] = torch.randn(LORA_RANK, inp, generator=gen) * scale
            tensors[f"{key}.lora_B.weight"] = torch.randn(out, LORA_RANK, generator=gen) * scale
    tmp = Path(tempfile.mkdtemp(prefix=folder.name + ".", dir=model.parent))
    save_file(tensors, str(tmp / "adapter_model.safetensors"), metadata={"format": "pt"})
    (tmp / "adapter_config.json").write_text(json.dumps({
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "r": LORA_RANK,
        "lora_alpha": 2 * LORA_RANK, "lora_dropout": 0.0, "bias": "none",
        "target_modules": list(LORA_TARGETS), "base_model_name_or_path": str(model)},
        indent=1))
    shutil.rmtree(folder, ignore_errors=True)
    try:
        tmp.rename(folder)
    except OSError:  # another process renamed its copy first
        shutil.rmtree(tmp, ignore_errors=True)
    return folder


def weights_digest(model: Any) -> str:
    """sha256 over the parameters a side holds (name, dtype, shape, bytes, in name order)."""
    import torch

    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        if hasattr(tensor, "full_tensor"):  # an FSDP2 (verl engine) parameter: the whole
            tensor = tensor.full_tensor()
        t = tensor.detach().cpu().contiguous()
        digest.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        digest.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return digest.hexdigest()
