"""The training side, in the training stack's environment: the trainer's recompute of the
engine's sampled tokens."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from harness.logprobs.rollout.inputs import checkpoint_digest


def recompute(side: dict[str, Any], dtype: str, nudge: Any = None) -> dict[str, Any]:
    """The trainer's logprobs of the engine's sampled tokens, each sequence alone and
    unpadded (micro-batch 1: the micro-batch's own effect is the micro-batch check's), and the
    full next-token distributions at those positions."""
    from harness.logprobs.training import TrainingForward, weights_digest
    from harness.stack import devices

    fwd = TrainingForward(dtype=dtype, device=devices.device())
    if nudge is not None:
        nudge(fwd)
    # what the trainer holds now against what it loaded (``TrainingForward.digest``, taken
    # right after loading the checkpoint): a nudge or an in-place update since shows here
    held = weights_digest(fwd.model)
    out = []
    with torch.no_grad():
        for req in side["requests"]:
            seq = req["prompt"] + req["tokens"]
            ids = torch.tensor([seq], device=fwd.device)
            logits = fwd.model(input_ids=ids).logits[0]
            start = len(req["prompt"]) - 1
            rows = logits[start:start + len(req["tokens"])]
            labels = torch.tensor([req["tokens"]], device=fwd.device)
            sampled = fwd.logprob_fn(rows.unsqueeze(0), labels)[0].float().cpu()
            out.append({"tokens": list(req["tokens"]), "logprobs": sampled,
                        "rows": torch.log_softmax(rows.float(), dim=-1).cpu()})
    return {"trainer": fwd.name, "checkpoint": checkpoint_digest(Path(fwd.folder)),
            "weights_match_checkpoint": held == fwd.digest, "requests": out}
