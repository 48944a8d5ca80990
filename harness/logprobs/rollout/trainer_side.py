"""The training side, in the training stack's environment: the trainer's recompute of the
engine's sampled tokens, through verl's own engine where verl is installed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from harness.logprobs.rollout.inputs import checkpoint_digest

#: the temperature the engine sampled with (``engine_side``): verl's actor divides its logits
#: by the rollout's temperature before ``logprobs_from_logits``
ROLLOUT_TEMPERATURE = 1.0


def _trainer(dtype: str) -> Any:
    """verl's FSDP engine (remove-padding, the rollout's temperature) where verl can run,
    else our loop (transformers' forward and the same log_softmax + gather)."""
    from harness.logprobs import verl_engine

    if verl_engine.unavailable() is None:
        return verl_engine.VerlEngineForward(dtype=dtype, temperature=ROLLOUT_TEMPERATURE)
    from harness.logprobs.training import TrainingForward
    from harness.stack import devices

    return TrainingForward(dtype=dtype, device=devices.device())


def _scored(fwd: Any, seqs: list[list[int]]) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Each whole sequence's logprobs (positions 0..n-2) and logits, one sequence per
    micro-batch (the micro-batch's own effect is the micro-batch check's)."""
    if hasattr(fwd, "run"):
        return fwd.run(seqs, 1, logits=True)
    lps, logits = [], []
    with torch.no_grad():
        for seq in seqs:
            ids = torch.tensor([seq], device=fwd.device)
            rows = fwd.model(input_ids=ids).logits[0, :-1]
            labels = torch.tensor([seq[1:]], device=fwd.device)
            lps.append(fwd.logprob_fn(rows.unsqueeze(0), labels)[0].float().cpu())
            logits.append(rows.float().cpu())
    return lps, logits


def recompute(side: dict[str, Any], dtype: str, nudge: Any = None) -> dict[str, Any]:
    """The trainer's logprobs of the engine's sampled tokens, each sequence alone and
    unpadded, and the full next-token distributions at those positions."""
    from harness.logprobs.seeded_model import weights_digest

    fwd = _trainer(dtype)
    if nudge is not None:
        nudge(fwd)
    # what the trainer holds now against what it loaded (``digest``, taken right after
    # loading the checkpoint): a nudge or an in-place update since shows here
    held = weights_digest(fwd.model)
    seqs = [req["prompt"] + req["tokens"] for req in side["requests"]]
    lps, logits = _scored(fwd, seqs)
    out = []
    for req, lp, rows in zip(side["requests"], lps, logits, strict=True):
        start, steps = len(req["prompt"]) - 1, len(req["tokens"])
        out.append({"tokens": list(req["tokens"]), "logprobs": lp[start:start + steps],
                    "rows": torch.log_softmax(rows[start:start + steps].float(), dim=-1)})
    return {"trainer": fwd.name, "checkpoint": checkpoint_digest(Path(fwd.folder)),
            "weights_match_checkpoint": held == fwd.digest, "requests": out}
