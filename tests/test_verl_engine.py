"""The trainer as verl runs it (issue 58, part 0): verl 0.9.1's own FSDP engine computes the
micro-batch rows' logprobs, on the CPU through a platform registered in verl's own registry.

- The engine is the one an Ascend runner gets (``FSDPEngineWithLMHead``), it holds the
  checkpoint's weights bit for bit, and a sequence alone through it gives the same bits as
  transformers' forward plus verl's function on that sequence: the stand-in changed no math.
- The control the issue asks for: verl's logprob function changed so that it computes
  differently from 128 rows up (four sequences' worth here: the micro-batches of 4 and 8,
  never a sequence alone nor two) fails the ``verl-rmpad`` row as "drift grew"; the same change
  passes our loop's row unseen, because that loop hands the function one sequence at a time.
"""

from __future__ import annotations

import sys

import pytest
import torch

from harness import run_isolated
from harness.invariance import switch_env
from harness.logprobs import verl_engine
from harness.logprobs.training import run_training_case

pytestmark = pytest.mark.skipif(verl_engine.unavailable() is not None,
                                reason=f"verl's engine: {verl_engine.unavailable()}")

#: the seeded change takes effect from this many logit rows up
ROWS = 128


def _from_many_rows(fwd) -> None:  # type: ignore[no-untyped-def]
    """verl's ``logprobs_from_logits`` with its logsumexp in bf16 once it is given ``ROWS``
    rows or more (a kernel picked by the row count), wherever the forward calls it: the
    engine module's binding, and our loop's ``logprob_fn``."""
    import verl.utils.torch_functional as verl_f

    original = verl_f.logprobs_from_logits

    def changed(logits: torch.Tensor, labels: torch.Tensor, inplace_backward: bool = True
                ) -> torch.Tensor:
        if logits.numel() // logits.shape[-1] < ROWS:
            return original(logits, labels, inplace_backward=inplace_backward)
        picked = logits.gather(-1, labels.unsqueeze(-1)).squeeze(-1).float()
        return picked - torch.logsumexp(logits.to(torch.bfloat16), dim=-1).float()

    engine = sys.modules.get(verl_engine.ENGINE)
    if engine is not None:
        engine.logprobs_from_logits = changed
    fwd.logprob_fn = changed


def _judged(layout: str, report):  # type: ignore[no-untyped-def]
    from harness.logprobs.expectations import judge_drift

    return judge_drift("micro-batch", report.equal, report.cases, f"training-{layout}", "cpu",
                       "float32", False, threads=report.threads,
                       first_op=report.first_divergent_op, figures=report.figures())


def _one_alone(_: object = None) -> dict[str, object]:
    from harness.logprobs.training import TrainingForward, sequences
    from harness.logprobs.verl_engine import VerlEngineForward

    seqs = sequences()
    engine = VerlEngineForward(dtype="float32", temperature=1.0)
    loop = TrainingForward(dtype="float32", folder=engine.folder)
    return {"engine": type(engine.engine).__name__, "platform": engine.platform,
            "same_weights": engine.digest == loop.digest,
            "equal": [torch.equal(a, b) for a, b in zip(
                engine.logprobs(seqs, 1), loop.logprobs(seqs, 1, "right"), strict=True)]}


def test_verl_engine_holds_the_checkpoint_and_a_sequence_alone_matches_transformers() -> None:
    got = run_isolated(_one_alone, method="forkserver").value
    assert got["engine"] == "FSDPEngineWithLMHead" and got["platform"] == "cpu", got
    assert got["same_weights"], got
    assert got["equal"] == [True] * 8, got


def test_a_logprob_change_from_many_rows_up_is_caught_by_verls_rows_not_by_our_loop() -> None:
    seeded = run_isolated(run_training_case, "verl-rmpad", False, "float32", "reference",
                          _from_many_rows, env=switch_env(False), method="forkserver").value
    outcome, why, drift = _judged("verl-rmpad", seeded)
    assert outcome == "failed" and why.startswith(
        "drift grew: micro-batch of training-verl-rmpad float32 on cpu: "), why
    assert "max_abs" in drift["grew"], drift
    # only the micro-batches the change reaches moved far: 4 and 8 (and old_log_prob at 2
    # against log_prob at 4), never 2
    moved = {(m.phase, m.batch_size) for m in seeded.mismatches if m.max_ulp > 1000}
    assert moved == {("verl-rmpad", 4), ("verl-rmpad", 8), ("old-vs-new", 4)}, sorted(moved)
    # today's loop: one sequence per call, never 128 rows; the row stays within its envelope
    loop = run_isolated(run_training_case, "right", False, "float32", "reference",
                        _from_many_rows, env=switch_env(False), method="forkserver").value
    outcome, why, _ = _judged("right", loop)
    assert outcome != "failed", why


def test_a_layout_names_its_forward() -> None:
    from harness.logprobs.training import forward

    with pytest.raises(ValueError, match="layout='diagonal': use one of right, left, packed, "
                                         "verl-rmpad, verl-padded"):
        forward("diagonal", "float32")
