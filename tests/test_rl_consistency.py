"""The training side's controls (issue 44): a micro-batch-size-dependent reduction seeded into
the training forward is caught and named by op; a packed row whose sequences see each other
is "not comparable"; the weights digest sees one weight moved by 1 ULP."""

from __future__ import annotations

import torch

from harness import run_isolated
from harness.invariance import switch_env
from harness.logprobs.training import TrainingForward, run_training_case, weights_digest


def _split_head(fwd: TrainingForward) -> None:
    """The output projection computed in two halves, added, from 2 sequences on: a reduction
    whose order follows the micro-batch size (what a split-K kernel picked by the row count
    does)."""
    head = fwd.model.lm_head
    whole = head.forward

    def forward(x: torch.Tensor) -> torch.Tensor:
        if x.dim() == 3 and x.shape[0] > 1:
            h = x.shape[-1] // 2
            return x[..., :h] @ head.weight[:, :h].T + x[..., h:] @ head.weight[:, h:].T
        return whole(x)

    head.forward = forward


def test_a_seeded_micro_batch_reduction_is_caught_and_named() -> None:
    # bf16, right padding, switch on: bit-equal on this CPU (the table's "equal" entry)
    clean = run_isolated(run_training_case, "right", True, "bfloat16", "reference",
                         env=switch_env(True), method="forkserver").value
    assert clean.equal and clean.cases == 32, clean.table()
    seeded = run_isolated(run_training_case, "right", True, "bfloat16", "reference",
                          _split_head, env=switch_env(True), method="forkserver").value
    assert not seeded.equal and not seeded.vacuous, seeded.table()
    where = seeded.first_divergence
    assert where["op"] and where["op"].startswith("aten::"), where
    assert "first divergent op: aten::" in where["sentence"], where


def _unmasked(fwd: TrainingForward) -> None:
    """A packed row without its block mask: each sequence attends to the ones before it."""
    def packed(chunk: list[list[int]]) -> list[torch.Tensor]:
        ids = torch.tensor([t for s in chunk for t in s]).unsqueeze(0)
        positions = torch.cat([torch.arange(len(s)) for s in chunk]).unsqueeze(0)
        logits = fwd.model(input_ids=ids, position_ids=positions).logits[0]
        out, offset = [], 0
        for seq in chunk:
            rows = logits[offset:offset + len(seq) - 1].unsqueeze(0)
            out.append(fwd.logprob_fn(rows, fwd._labels(seq))[0].float())
            offset += len(seq)
        return out

    fwd._packed = packed  # type: ignore[method-assign]


def test_a_packed_row_whose_sequences_see_each_other_is_not_comparable() -> None:
    got = run_isolated(run_training_case, "packed", False, "float32", "reference", _unmasked,
                       env=switch_env(False), method="forkserver").value
    assert got.vacuous.startswith("not comparable: the packed layout moved a logprob by"), \
        got.vacuous


def _digests() -> tuple[str, str, str]:
    fwd = TrainingForward(dtype="float32")
    before = weights_digest(fwd.model)
    with torch.no_grad():
        w = fwd.model.model.layers[1].mlp.down_proj.weight
        w[3, 5] = torch.nextafter(w[3, 5], torch.tensor(float("inf")))
    return fwd.digest, before, weights_digest(fwd.model)


def test_the_weights_digest_sees_one_weight_moved_by_one_ulp() -> None:
    loaded, before, nudged = run_isolated(_digests, method="forkserver").value
    assert loaded == before != nudged
