"""TinyDecoder: a small decoder batched the way serving engines batch, as a logprob source.

RMSNorm, rotary embeddings, grouped-query attention and a SwiGLU MLP, with weights drawn
from a seed (about 3.4 M parameters). Sequences are packed into one token dimension with no
padding, so every linear layer sees the whole batch's tokens at once (the row count M of
each matmul is the batch's token count); attention runs per sequence over its own keys.
That is exactly where batch-size dependence creeps in on real engines, so a batch-variant
``mm`` shows up here as a logprob difference, and a batch-invariant one removes it.

Plain torch ops only (``@``, ``log_softmax``...): the batch-invariance switch acts on them
through the dispatcher, as it does on a real model.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from harness.logprobs.greedy import GreedyDecoding, Step


@dataclass(frozen=True)
class TinyConfig:
    vocab: int = 1024
    hidden: int = 256
    layers: int = 4
    heads: int = 8
    kv_heads: int = 2
    intermediate: int = 688
    rope_theta: float = 10000.0
    eps: float = 1e-6
    max_positions: int = 512


class TinyDecoder(GreedyDecoding):
    """``prefill`` and ``decode`` over packed batches of token-id lists (``LogprobSource``)."""

    def __init__(self, seed: int = 0, dtype: torch.dtype = torch.float32,
                 device: Any = "cpu", config: TinyConfig | None = None) -> None:
        self.config = cfg = config or TinyConfig()
        self.dtype = dtype
        self.device = torch.device(device)
        self.name = f"TinyDecoder(seed={seed}, {str(dtype).removeprefix('torch.')})"
        gen = torch.Generator().manual_seed(seed)
        head_dim = cfg.hidden // cfg.heads
        self.head_dim = head_dim

        def weight(rows: int, cols: int, scale: float | None = None) -> torch.Tensor:
            w = torch.randn(rows, cols, generator=gen) * (scale or rows ** -0.5)
            return w.to(dtype).to(self.device)

        self.embed = weight(cfg.vocab, cfg.hidden, 1.0)
        self.layers = []
        for _ in range(cfg.layers):
            self.layers.append({
                "attn_norm": torch.ones(cfg.hidden, dtype=dtype, device=self.device),
                "wq": weight(cfg.hidden, cfg.heads * head_dim),
                "wk": weight(cfg.hidden, cfg.kv_heads * head_dim),
                "wv": weight(cfg.hidden, cfg.kv_heads * head_dim),
                "wo": weight(cfg.heads * head_dim, cfg.hidden),
                "mlp_norm": torch.ones(cfg.hidden, dtype=dtype, device=self.device),
                "w_gate": weight(cfg.hidden, cfg.intermediate),
                "w_up": weight(cfg.hidden, cfg.intermediate),
                "w_down": weight(cfg.intermediate, cfg.hidden),
            })
        self.final_norm = torch.ones(cfg.hidden, dtype=dtype, device=self.device)
        self.lm_head = weight(cfg.hidden, cfg.vocab, 4 * cfg.hidden ** -0.5)
        inv = 1.0 / cfg.rope_theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64)
                                        / head_dim)
        angles = torch.outer(torch.arange(cfg.max_positions, dtype=torch.float64), inv)
        self.cos = angles.cos().to(dtype).to(self.device)
        self.sin = angles.sin().to(dtype).to(self.device)

    # --- building blocks ----------------------------------------------------------------

    def _rms(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.config.eps)
                ).to(x.dtype) * w

    def _rope(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """x: [T, heads, head_dim]; rotate pairs (first half, second half)."""
        cos = self.cos[positions].unsqueeze(1)
        sin = self.sin[positions].unsqueeze(1)
        half = x.shape[-1] // 2
        x1, x2 = x[..., :half], x[..., half:]
        return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)

    def _attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                q_positions: torch.Tensor) -> torch.Tensor:
        """One sequence: q [Tq, H, D], k/v [Tk, KV, D]; causal by absolute position."""
        cfg = self.config
        rep = cfg.heads // cfg.kv_heads
        k = k.repeat_interleave(rep, dim=1).transpose(0, 1)  # [H, Tk, D]
        v = v.repeat_interleave(rep, dim=1).transpose(0, 1)
        qh = q.transpose(0, 1)  # [H, Tq, D]
        # attention uses bmm, as engines use a dedicated attention kernel: its shapes are
        # the sequence's own, whatever the batch
        scores = torch.bmm(qh, k.transpose(1, 2)).float() / self.head_dim ** 0.5
        key_pos = torch.arange(k.shape[1], device=self.device)
        mask = key_pos.unsqueeze(0) > q_positions.unsqueeze(1)
        scores = scores.masked_fill(mask, float("-inf"))
        probs = torch.softmax(scores, dim=-1).to(v.dtype)
        return torch.bmm(probs, v).transpose(0, 1).reshape(q.shape[0], -1)

    def _forward(self, tokens: torch.Tensor, positions: torch.Tensor, spans: list[tuple[int, int]],
                 caches: list[list[dict[str, torch.Tensor]]]) -> torch.Tensor:
        """Packed forward over all sequences' new tokens; appends to each sequence's cache.
        Returns final hidden states [T, hidden]."""
        cfg, hd = self.config, self.head_dim
        x = self.embed[tokens]
        for li, layer in enumerate(self.layers):
            h = self._rms(x, layer["attn_norm"])
            q = (h @ layer["wq"]).view(-1, cfg.heads, hd)
            k = (h @ layer["wk"]).view(-1, cfg.kv_heads, hd)
            v = (h @ layer["wv"]).view(-1, cfg.kv_heads, hd)
            q, k = self._rope(q, positions), self._rope(k, positions)
            outs = []
            for si, (start, end) in enumerate(spans):
                cache = caches[si][li]
                cache["k"] = torch.cat([cache["k"], k[start:end]]) if "k" in cache else k[start:end]
                cache["v"] = torch.cat([cache["v"], v[start:end]]) if "v" in cache else v[start:end]
                outs.append(self._attend(q[start:end], cache["k"], cache["v"],
                                         positions[start:end]))
            x = x + torch.cat(outs) @ layer["wo"]
            h = self._rms(x, layer["mlp_norm"])
            gate = h @ layer["w_gate"]
            x = x + (torch.nn.functional.silu(gate) * (h @ layer["w_up"])) @ layer["w_down"]
        return self._rms(x, self.final_norm)

    def _logprobs(self, hidden: torch.Tensor) -> torch.Tensor:
        return torch.log_softmax((hidden @ self.lm_head).float(), dim=-1)

    # --- LogprobSource ---------------------------------------------------------------------

    def _prefill(self, batch: list[list[int]]) -> tuple[list[torch.Tensor], torch.Tensor, list]:
        lengths = [len(s) for s in batch]
        if min(lengths) < 1 or max(lengths) > self.config.max_positions:
            raise ValueError(f"sequence lengths must be 1..{self.config.max_positions}: {lengths}")
        tokens = torch.tensor([t for s in batch for t in s], device=self.device)
        positions = torch.cat([torch.arange(n, device=self.device) for n in lengths])
        spans, start = [], 0
        for n in lengths:
            spans.append((start, start + n))
            start += n
        caches: list[list[dict[str, torch.Tensor]]] = [[{} for _ in self.layers] for _ in batch]
        logprobs = self._logprobs(self._forward(tokens, positions, spans, caches))
        return [logprobs[a:b] for a, b in spans], tokens, caches

    @torch.no_grad()
    def prefill(self, batch: list[list[int]]) -> list[torch.Tensor]:
        """Prompt logprobs: for each sequence, log p(token[t] | tokens[:t]) for t >= 1."""
        rows, tokens, _ = self._prefill(batch)
        out = []
        for seq, lp in zip(batch, rows, strict=True):
            nxt = torch.tensor(seq[1:], device=self.device, dtype=torch.long)
            out.append(lp[:-1].gather(1, nxt.unsqueeze(1)).squeeze(1).cpu())
        return out

    def _start(self, batch: list[list[int]]) -> tuple[torch.Tensor, Step]:
        """Decoding with a KV cache: the prompts' last rows, and a step a token each."""
        rows, _, caches = self._prefill(batch)
        lengths = [len(s) for s in batch]

        def step(nxt: torch.Tensor) -> torch.Tensor:
            positions = torch.tensor(lengths, device=self.device)
            spans = [(i, i + 1) for i in range(len(batch))]
            for i in range(len(lengths)):
                lengths[i] += 1
            return self._logprobs(self._forward(nxt, positions, spans, caches))

        return torch.stack([lp[-1] for lp in rows]), step
