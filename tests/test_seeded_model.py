"""The engine's model folder (harness.logprobs.seeded_model): real seeded weights (not
vLLM's near-zero dummy ones), a tokenizer that maps words to ids, one folder per content,
rebuilt when damaged."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from harness.logprobs import seeded_model

pytest.importorskip("safetensors")
pytest.importorskip("tokenizers")
SMALL = {"hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
         "num_key_value_heads": 2, "num_hidden_layers": 1, "vocab_size": 64}


def test_weights_are_seeded_and_not_flat(tmp_path: Path) -> None:
    from safetensors.torch import load_file

    folder = seeded_model.build(SMALL, seed=3, root=tmp_path)
    weights = load_file(str(folder / "model.safetensors"))
    lm_head = weights["lm_head.weight"]
    assert tuple(lm_head.shape) == (64, 64)
    assert math.isclose(float(lm_head.std()), 0.02, rel_tol=0.1)  # not U(-1e-3, 1e-3)
    assert float(weights["model.norm.weight"].min()) == 1.0
    config = json.loads((folder / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and config["vocab_size"] == 64
    again = seeded_model.build(SMALL, seed=3, root=tmp_path / "other")
    assert (again / "model.safetensors").read_bytes() == (folder / "model.safetensors").read_bytes()
    other_seed = seeded_model.build(SMALL, seed=4, root=tmp_path)
    assert other_seed != folder


def test_tokenizer_maps_words_to_ids(tmp_path: Path) -> None:
    from tokenizers import Tokenizer

    folder = seeded_model.build(SMALL, root=tmp_path)
    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    assert tok.encode("t5 t9 t63").ids == [5, 9, 63]
    assert tok.encode("nonsense").ids == [0]


def test_cached_by_content_and_rebuilt_when_damaged(tmp_path: Path) -> None:
    folder = seeded_model.build(SMALL, root=tmp_path)
    weights = folder / "model.safetensors"
    stamp = weights.stat().st_mtime_ns
    assert seeded_model.build(SMALL, root=tmp_path) == folder
    assert weights.stat().st_mtime_ns == stamp  # the cache, not a rebuild
    good = weights.read_bytes()
    weights.write_bytes(good[:-8] + b"\0" * 8)  # a damaged checkpoint is never loaded
    assert seeded_model.build(SMALL, root=tmp_path) == folder
    assert weights.read_bytes() == good
    assert [p.name for p in folder.parent.iterdir()] == [folder.name]  # no temp left over
