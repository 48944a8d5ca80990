"""The comparison, in the parent or an isolated child: rollout against training (bit-equal
fraction, ULP, KL over the vocabulary, verl's own metrics), and two engines against each
other."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from harness.logprobs.bits import compare_bits
from harness.logprobs.rollout.trainer_side import recompute

#: verl's metrics an envelope judges (each grows with the mismatch), and those shown
VERL_JUDGED = ("k3_kl", "log_ppl_abs_diff", "rollout_probs_diff_max", "rollout_probs_diff_mean")
VERL_SHOWN = ("k3_kl", "kl", "chi2_token", "chi2_seq", "log_ppl_abs_diff",
              "rollout_probs_diff_max", "rollout_probs_diff_mean", "rollout_probs_diff_std")

#: why rollout vs training names no op: the dispatch recorder pairs ops one by one, and the
#: engine fuses what the trainer runs apart
NOT_LOCATED = ("the engine's ops (fused projections, its attention backend) do not line up "
               "with the trainer's")


@dataclass
class Consistency:
    """Rollout vs training for one dtype: the figures, and why it is not comparable."""

    engine: str
    trainer: str
    dtype: str
    tokens: int = 0
    bit_equal: int = 0
    max_abs: float = 0.0
    mean_abs: float = 0.0
    max_ulp: int = 0
    kl_mean: float = 0.0
    kl_max: float = 0.0
    vocab: int = 0
    #: verl's own metrics of the sampled tokens' logprobs, by the names its dashboard logs
    #: (``compute_offpolicy_metrics``: kl, k3_kl, chi2_token...; ``calculate_debug_metrics``:
    #: rollout_probs_diff_max...); empty where verl is not installed (``verl_missing`` says)
    verl: dict[str, float] = field(default_factory=dict)
    verl_missing: str = ""
    not_comparable: list[str] = field(default_factory=list)
    #: the first op whose output differs (None: not located, ``not_located`` says why)
    first_divergent_op: str | None = None
    not_located: str = NOT_LOCATED
    #: where the two sides part by module boundary (``layer_states.LayerReport.to_dict``):
    #: empty where the engine side captured no layer states
    layers: dict[str, Any] = field(default_factory=dict)

    def where(self) -> str:
        """Where the two sides part, as the failure text says it."""
        if self.layers:
            return str(self.layers["sentence"])
        return (f"first divergent op: "
                f"{self.first_divergent_op or f'not located ({self.not_located})'}")

    @property
    def fraction(self) -> float:
        return self.bit_equal / self.tokens if self.tokens else 0.0

    def figures(self) -> dict[str, Any]:
        """The size of the mismatch (``harness.drift.figures``): ours, and verl's own."""
        ours = {"not_bit_equal": self.tokens - self.bit_equal, "max_ulp": self.max_ulp,
                "max_abs": self.max_abs, "mean_abs": self.mean_abs, "kl_max": self.kl_max,
                "kl_mean": self.kl_mean}
        # verl's figures where its helper gave them: one that did not is missing, and a row
        # whose envelope judges it fails closed (harness.drift.envelope)
        return {**ours, **{name: self.verl[name] for name in VERL_JUDGED if name in self.verl},
                "totals": {"not_bit_equal": self.tokens}}

    def summary(self) -> str:
        if self.not_comparable:
            return "not comparable: " + "; ".join(self.not_comparable)
        verl = (", ".join(f"{k} {self.verl[k]:.3g}" for k in VERL_SHOWN if k in self.verl)
                if self.verl else self.verl_missing)
        return (f"{self.bit_equal} of {self.tokens} sampled tokens' logprobs bit-equal "
                f"({self.fraction:.1%}); max |diff| {self.max_abs:.3g}, mean {self.mean_abs:.3g}, "
                f"max {self.max_ulp} ULP; KL(rollout || training) over the {self.vocab}"
                f"-token vocabulary: mean {self.kl_mean:.3g}, max {self.kl_max:.3g}; "
                f"verl's metrics: {verl}")

    def to_dict(self) -> dict[str, Any]:
        """The results file's ``logprob_report`` (``harness.report.schema.ROLLOUT_CHECK``: the
        report compares its figures night to night)."""
        return {**asdict(self), "fraction": self.fraction, "check": "rollout-vs-training",
                "figures": self.figures()}


def compare(rollout_side: dict[str, Any], training: dict[str, Any], dtype: str) -> Consistency:
    found = Consistency(rollout_side["engine"], training["trainer"], dtype)
    if rollout_side["checkpoint"] != training["checkpoint"]:
        found.not_comparable.append(
            f"the engine loaded checkpoint {rollout_side['checkpoint'][:12]}, the trainer "
            f"{training['checkpoint'][:12]}")
    if not training["weights_match_checkpoint"]:
        found.not_comparable.append("the trainer's parameters are not the checkpoint's "
                                    "(its weights digest differs from a fresh load)")
    diffs, kls = [], []
    for i, (r, t) in enumerate(zip(rollout_side["requests"], training["requests"], strict=True)):
        if r["tokens"] != t["tokens"]:
            found.not_comparable.append(f"request {i}: the trainer scored other tokens")
            continue
        found.tokens += len(r["tokens"])
        differ = compare_bits(r["logprobs"], t["logprobs"])
        found.bit_equal += len(r["tokens"]) - (differ[3] if differ else 0)
        if differ:
            found.max_ulp = max(found.max_ulp, differ[2])
        diffs.append((r["logprobs"].double() - t["logprobs"].double()).abs())
        p = r["rows"].double()
        q = t["rows"].double()
        kls.append((p.exp() * (p - q)).nan_to_num(0.0).sum(-1))
        found.vocab = int(p.shape[-1])
    if diffs:
        every = torch.cat(diffs)
        found.max_abs, found.mean_abs = float(every.max()), float(every.mean())
        kl = torch.cat(kls)
        found.kl_mean, found.kl_max = float(kl.mean()), float(kl.max())
    if not found.not_comparable and found.tokens:
        found.verl, found.verl_missing = verl_metrics(
            [r["logprobs"] for r in rollout_side["requests"]],
            [t["logprobs"] for t in training["requests"]])
    return found


def verl_metrics(rollout_lp: list[torch.Tensor], training_lp: list[torch.Tensor]
                 ) -> tuple[dict[str, float], str]:
    """verl's own off-policy metrics of the sampled tokens' logprobs, computed by verl's own
    functions as its trainer logs them (the training side is verl's ``old_log_prob``): a
    (batch, response) pair of tensors and the response mask. ({}, why) without verl."""
    try:
        from verl.protocol import DataProto
        from verl.trainer.ppo.rollout_corr_helper import compute_offpolicy_metrics
        from verl.utils.debug.metrics import calculate_debug_metrics
    except ImportError as exc:
        return {}, f"not computed (verl's metrics need verl: {exc})"
    width = max(len(t) for t in rollout_lp)
    rollout = torch.zeros(len(rollout_lp), width)
    old = torch.zeros(len(rollout_lp), width)
    mask = torch.zeros(len(rollout_lp), width)
    for i, (r, t) in enumerate(zip(rollout_lp, training_lp, strict=True)):
        rollout[i, :len(r)], old[i, :len(t)], mask[i, :len(r)] = r.float(), t.float(), 1.0
    metrics = dict(compute_offpolicy_metrics(old, rollout, mask))
    batch = DataProto.from_dict(tensors={"rollout_log_probs": rollout, "old_log_probs": old,
                                         "response_mask": mask,
                                         "responses": torch.zeros(mask.shape, dtype=torch.long)})
    for key, value in calculate_debug_metrics(batch).items():
        metrics[key.removeprefix("training/")] = value
    return {k: float(v) for k, v in metrics.items() if isinstance(v, (int, float))}, ""


def score(side: dict[str, Any], dtype: str, nudge: Any = None) -> Consistency:
    """In an isolated child: the trainer's recompute of the engine's tokens, compared (verl's
    metrics are computed where verl is, not in pytest's process), and where the engine side
    captured its layer states, where the two part (``layers``)."""
    found = compare(side, recompute(side, dtype, nudge), dtype)
    if side.get("layers") and not found.not_comparable:
        found.layers = layers_report(side, dtype, nudge).to_dict()
    return found


def layers_report(side: dict[str, Any], dtype: str, nudge: Any = None) -> Any:
    """The engine's boundary states against transformers' Llama on the same tokens (the
    trainer's model: verl's engine runs it, and on a sequence alone gives the same bits,
    ``tests/test_verl_engine.py``); ``nudge(forward)`` as for ``recompute``."""
    from harness.logprobs import layer_states
    from harness.logprobs.training import TrainingForward
    from harness.stack import devices

    captured = side["layers"]
    fwd = TrainingForward(dtype=dtype, device=devices.device())
    if nudge is not None:
        nudge(fwd)
    seqs = [r["prompt"] + r["tokens"] for r in side["requests"]]
    trainer = [layer_states.trainer_states(fwd.model, seq) for seq in seqs]
    local = [layer_states.local_states(fwd.model, states) for states in captured["states"]]
    report = layer_states.compare(captured["states"], trainer, local, captured["layers"],
                                  engine_name=side["engine"], trainer_name=fwd.name,
                                  dtype=dtype)
    report.not_captured = captured.get("not_captured") or ""
    return report


def two_engines(first: dict[str, Any], second: dict[str, Any]) -> list[str]:
    """Two fresh engines (two processes), same seeds, same requests: every token, sampled
    logprob and distribution row the same bits (verl PR #6572's first checks)."""
    problems = []
    if first["pid"] == second["pid"]:
        problems.append("vacuous: both rollouts ran in one process")
    for dtype, a in first["dtypes"].items():
        b = second["dtypes"][dtype]
        for i, (x, y) in enumerate(zip(a["requests"], b["requests"], strict=True)):
            if x["tokens"] != y["tokens"]:
                problems.append(f"{dtype} request {i}: the second engine sampled other tokens")
                continue
            for name in ("logprobs", "rows"):
                differ = compare_bits(x[name], y[name])
                if differ:
                    problems.append(f"{dtype} request {i}: {name} differ between the engines "
                                    f"(max |diff| {differ[1]:.3g}, {differ[2]} ULP, "
                                    f"{differ[3]} values)")
        same = [x["tokens"] == y["tokens"] for x, y in zip(a["requests"], b["requests"],
                                                             strict=True)]
        problems += _layers_agree(dtype, a.get("layers"), b.get("layers"), same)
    return problems


def _layers_agree(dtype: str, first: Any, second: Any, same: list[bool]) -> list[str]:
    """The two engines' layer states (``layer_states.engine_states``) of the requests that
    sampled the same tokens, boundary by boundary: the same bits, or the first boundary
    where they part."""
    if not first or not second:
        return []
    for i, (x, y) in enumerate(zip(first["states"], second["states"], strict=True)):
        if not same[i]:
            continue
        for name in [*x, *(k for k in y if k not in x)]:  # in the order a token passes
            differ = compare_bits(x[name], y[name]) if name in x and name in y else (0, 0, 0, 1)
            if differ:
                return [f"{dtype} request {i}: the engines' layer states part at {name}"]
    return []
