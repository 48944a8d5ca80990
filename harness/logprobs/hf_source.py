"""A ``LogprobSource`` over a Hugging Face transformers causal LM: the model code users run
in production (``LlamaForCausalLM``, or ``Qwen2ForCausalLM``), built from a config with
seeded random weights (no download, ever), the size of TinyDecoder.

Prefill is the model's forward over a padded batch with an attention mask and position ids
from the mask, the way trainers compute logprobs; ``padding`` says which side ("right", as
most trainers pad, or "left"). Decode is ``generate``-style greedy decoding with the
model's KV cache, one token a step, over a left-padded batch (the only way to decode a
batch of different lengths together). transformers is a dependency of the suites' setup
(the ``[upstream]`` extra), not of the harness core: this module imports it on use.
"""

from __future__ import annotations

import types
from typing import Any

import torch

from harness.logprobs.greedy import GreedyDecoding, Step

ARCHITECTURES = {"llama": ("LlamaConfig", "LlamaForCausalLM"),
                 "qwen2": ("Qwen2Config", "Qwen2ForCausalLM")}
#: a model about TinyDecoder's size (3.3 M parameters)
SMALL = {"vocab_size": 1024, "hidden_size": 256, "intermediate_size": 688,
         "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 2,
         "max_position_embeddings": 512, "rms_norm_eps": 1e-6, "tie_word_embeddings": False}
PAD_ID = 0


def pad(batch: list[list[int]], side: str, pad_id: int = PAD_ID, width: int | None = None
        ) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids and attention mask of ``batch`` padded on ``side`` to ``width`` (default:
    the longest sequence), as trainers and ``generate`` pad."""
    width = width or max(len(s) for s in batch)
    ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(batch), width), dtype=torch.long)
    for i, seq in enumerate(batch):
        cols = slice(width - len(seq), width) if side == "left" else slice(0, len(seq))
        ids[i, cols] = torch.tensor(seq)
        mask[i, cols] = 1
    return ids, mask


def positions(mask: torch.Tensor) -> torch.Tensor:
    """Position ids from an attention mask: 0 at each sequence's first real token."""
    return (mask.cumsum(-1) - 1).clamp(min=0)


def unavailable() -> str | None:
    from harness.stack.devices import has_module

    return None if has_module("transformers") else (
        "transformers is not installed (bash ci/setup.sh --upstream installs it)")


class HfSource(GreedyDecoding):
    """``prefill`` / ``decode`` / ``generate`` through a transformers model."""

    def __init__(self, *, seed: int = 0, dtype: torch.dtype = torch.float32,
                 device: Any = "cpu", padding: str = "right", arch: str = "llama",
                 attn: str = "sdpa", pad_id: int = PAD_ID, **config: Any) -> None:
        import transformers

        if padding not in ("left", "right"):
            raise ValueError(f"padding={padding!r}: use 'left' or 'right'")
        if arch not in ARCHITECTURES:
            raise ValueError(f"arch={arch!r}: use one of {', '.join(ARCHITECTURES)}")
        config_cls, model_cls = (getattr(transformers, n) for n in ARCHITECTURES[arch])
        cfg = config_cls(**{**SMALL, **config}, attn_implementation=attn)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = model_cls(cfg)
        self.model = model.to(dtype=dtype, device=torch.device(device)).eval()
        self.device = torch.device(device)
        self.padding = padding
        self.pad_id = pad_id
        self.config = types.SimpleNamespace(vocab=cfg.vocab_size)
        self.name = (f"hf {model_cls.__name__}(seed={seed}, "
                     f"{str(dtype).removeprefix('torch.')}, {attn}, {padding} padding)")

    def _padded(self, batch: list[list[int]], side: str) -> tuple[torch.Tensor, torch.Tensor]:
        ids, mask = pad(batch, side, self.pad_id)
        return ids.to(self.device), mask.to(self.device)

    _positions = staticmethod(positions)

    def _logprobs(self, logits: torch.Tensor) -> torch.Tensor:
        return torch.log_softmax(logits.float(), dim=-1)

    @torch.no_grad()
    def prefill(self, batch: list[list[int]]) -> list[torch.Tensor]:
        """Prompt logprobs of each sequence, from one padded forward."""
        ids, mask = self._padded(batch, self.padding)
        logits = self.model(input_ids=ids, attention_mask=mask,
                            position_ids=self._positions(mask)).logits
        lp = self._logprobs(logits)
        out = []
        for i, seq in enumerate(batch):
            cols = mask[i].nonzero().squeeze(1)
            nxt = torch.tensor(seq[1:], device=self.device).unsqueeze(1)
            out.append(lp[i, cols[:-1]].gather(1, nxt).squeeze(1).cpu())
        return out

    def _start(self, batch: list[list[int]]) -> tuple[torch.Tensor, Step]:
        """``generate``-style decoding with the KV cache, left-padded: the prompts' last
        rows, and a step a token each."""
        ids, mask = self._padded(batch, "left")
        positions = self._positions(mask)
        out = self.model(input_ids=ids, attention_mask=mask, position_ids=positions,
                         use_cache=True)
        state = {"past": out.past_key_values, "mask": mask, "positions": positions}

        def step(nxt: torch.Tensor) -> torch.Tensor:
            mask = state["mask"] = torch.cat(
                [state["mask"], state["mask"].new_ones((len(batch), 1))], dim=1)
            positions = state["positions"] = state["positions"][:, -1:] + 1
            out = self.model(input_ids=nxt.unsqueeze(1), attention_mask=mask,
                             position_ids=positions, past_key_values=state["past"],
                             use_cache=True)
            state["past"] = out.past_key_values
            return self._logprobs(out.logits[:, -1])

        return self._logprobs(out.logits[:, -1]), step
