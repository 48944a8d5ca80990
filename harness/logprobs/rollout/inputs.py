"""What the two sides agree on: the prompts, the steps sampled, and the checkpoint's
identity (each side computes it from the files it loaded)."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from harness.logprobs import seeded_model

#: prompts of mixed lengths, sampled continuations of STEPS tokens
PROMPT_LENGTHS = (12, 30, 23, 41)
STEPS = 12


def prompts(seed: int = 11, vocab: int = 1024) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(3, vocab, (n,), generator=gen).tolist() for n in PROMPT_LENGTHS]


def checkpoint_digest(folder: Path) -> str:
    """The checkpoint's identity: the sha256 of its files, computed from the files (a changed
    file changes the digest), over the names its manifest records."""
    from hashlib import sha256

    manifest = json.loads((folder / seeded_model.MANIFEST).read_text())
    files = seeded_model.file_digests(folder, sorted(manifest["files"]))
    return sha256(json.dumps(files, sort_keys=True).encode()).hexdigest()
