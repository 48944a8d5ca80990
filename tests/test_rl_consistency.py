"""The training side's controls (issue 44): a micro-batch-size-dependent reduction seeded into
the training forward is caught and named by op; a gap grown from its measured ULPs to 200
and a packed row whose sequences see each other fail as "drift grew" against the row's
envelope (issue 56: a large difference on the same inputs is a drift, not "not
comparable"); the weights digest sees one weight moved by 1 ULP."""

from __future__ import annotations

import pytest
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
    # bf16, right padding, switch on: bit-equal on an AVX512_BF16 CPU (the table's "equal"
    # entry); on an AMX-BF16 one 6 of 32 differ by the padding width alone, no op between
    # the micro-batch and the sequence padded to its width (the table's AMX gap)
    clean = run_isolated(run_training_case, "right", True, "bfloat16", "reference",
                         env=switch_env(True), method="forkserver").value
    assert clean.cases == 32 and (clean.equal or clean.first_divergent_op is None), \
        clean.table()
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


def _judged(layout: str, report):  # type: ignore[no-untyped-def]
    from harness.logprobs.expectations import judge_drift

    return judge_drift("micro-batch", report.equal, report.cases, f"training-{layout}", "cpu",
                       "float32", False, threads=report.threads,
                       first_op=report.first_divergent_op, figures=report.figures())


def test_a_packed_row_whose_sequences_see_each_other_is_a_drift_that_grew() -> None:
    got = run_isolated(run_training_case, "packed", False, "float32", "reference", _unmasked,
                       env=switch_env(False), method="forkserver").value
    assert not got.vacuous, got.vacuous  # the same inputs: comparable
    outcome, why, drift = _judged("packed", got)
    assert outcome == "failed" and why.startswith(
        "drift grew: micro-batch of training-packed float32 on cpu: "), why
    assert "max_abs" in drift["grew"] and "max_ulp" in drift["grew"], drift


def _temperature_by_micro_batch(fwd: TrainingForward) -> None:
    """A regression seeded into the training forward: the logits of a micro-batch of 2 or
    more scaled by 1 + 2^-13 (a temperature applied per micro-batch, off by 1.2e-4), the
    sequence alone left as it was: the micro-batch gap grows from its measured 1-2 ULP to
    hundreds."""
    head = fwd.model.lm_head
    whole = head.forward

    def forward(x: torch.Tensor) -> torch.Tensor:
        out = whole(x)
        return out * (1 + 2 ** -13) if x.dim() == 3 and x.shape[0] > 1 else out

    head.forward = forward


def test_a_micro_batch_gap_grown_to_hundreds_of_ulp_fails_by_name() -> None:
    """fp32, right padding, switch off: the case as measured stays inside its envelope; the
    seeded temperature makes it fail as "drift grew", naming max_ulp with its figure."""
    same = run_isolated(run_training_case, "right", False, "float32", "reference",
                        env=switch_env(False), method="forkserver").value
    outcome, why, drift = _judged("right", same)
    assert outcome == "passed" and drift["judged"] == "within", why
    grown = run_isolated(run_training_case, "right", False, "float32", "reference",
                         _temperature_by_micro_batch, env=switch_env(False),
                         method="forkserver").value
    assert grown.figures()["max_ulp"] >= 100, grown.figures()
    outcome, why, drift = _judged("right", grown)
    assert outcome == "failed" and "max_ulp" in drift["grew"], why
    assert f"max_ulp {grown.figures()['max_ulp']} (largest distance in ULP) is above its " \
        "envelope" in why, why


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


# --- rollout vs training: the comparison's controls, without an engine -------------------

def _own_rollout(dtype: str) -> dict[str, object]:
    """A rollout record whose engine side is the trainer itself (the same checkpoint, its
    greedy tokens): what ``rollout.compare`` needs, with no engine."""
    from pathlib import Path

    from harness.logprobs import rollout
    from harness.logprobs.training import TrainingForward

    fwd = TrainingForward(dtype=dtype)
    requests = []
    with torch.no_grad():
        for prompt in rollout.prompts()[:2]:
            tokens = fwd.model.generate(torch.tensor([prompt]), max_new_tokens=4,
                                        do_sample=False)[0, len(prompt):].tolist()
            requests.append({"prompt": prompt, "tokens": tokens})
    side = {"engine": "the trainer itself", "requests": requests,
            "checkpoint": rollout.checkpoint_digest(Path(fwd.folder))}
    recomputed = rollout.recompute(side, dtype)
    for req, got in zip(requests, recomputed["requests"], strict=True):
        req.update(logprobs=got["logprobs"], rows=got["rows"])
    return side


def _nudge_one_weight(fwd: TrainingForward) -> None:
    with torch.no_grad():
        w = fwd.model.model.layers[0].mlp.down_proj.weight
        w[0, 0] = torch.nextafter(w[0, 0], torch.tensor(1.0, dtype=w.dtype))


def _compare(side: dict[str, object], nudge: object = None):  # type: ignore[no-untyped-def]
    from harness.logprobs import rollout

    return rollout.compare(side, rollout.recompute(side, "float32", nudge), "float32")


@pytest.fixture(scope="module")
def own_side() -> dict[str, object]:
    return run_isolated(_own_rollout, "float32", method="forkserver").value


def test_rollout_vs_training_is_bit_equal_against_itself_and_measures_a_difference(
        own_side: dict[str, object]) -> None:
    from harness.logprobs import rollout

    training = run_isolated(rollout.recompute, own_side, "float32", method="forkserver").value
    same = rollout.compare(own_side, training, "float32")
    assert same.not_comparable == [] and same.tokens == 8 and same.bit_equal == 8, same
    assert same.kl_max == 0.0 and same.vocab == 1024, same
    # a sampled logprob moved on the engine side by 1 ULP, a distribution row by 0.01:
    # counted, in ULP, and in the KL
    moved = {**own_side, "requests": [dict(r) for r in own_side["requests"]]}
    first = moved["requests"][0]
    first["logprobs"] = first["logprobs"].clone()
    first["logprobs"][1] = torch.nextafter(first["logprobs"][1], torch.tensor(0.0))
    first["rows"] = first["rows"].clone()
    first["rows"][1] = first["rows"][1] + 0.01
    found = rollout.compare(moved, training, "float32")
    assert found.bit_equal == 7 and found.max_ulp == 1 and found.kl_max > 0, found.summary()
    # other tokens, another checkpoint: not comparable, never a figure
    other = {**own_side, "checkpoint": "0" * 64,
             "requests": [{**own_side["requests"][0],
                           "tokens": own_side["requests"][0]["tokens"][::-1]},
                          own_side["requests"][1]]}
    found = rollout.compare(other, training, "float32")
    assert any(p.startswith("the engine loaded checkpoint 000000000000") for p in
               found.not_comparable), found.not_comparable
    assert "request 0: the trainer scored other tokens" in found.not_comparable


def test_a_trainer_with_one_weight_nudged_is_not_comparable(own_side: dict[str, object]) -> None:
    found = run_isolated(_compare, own_side, _nudge_one_weight, method="forkserver").value
    assert found.not_comparable == ["the trainer's parameters are not the checkpoint's (its "
                                    "weights digest differs from a fresh load)"], found
    assert found.summary().startswith("not comparable: ")


def test_the_figures_are_marked_for_the_report() -> None:
    """The report compares a ``logprob_report`` night to night by its ``check``
    (``harness.report.schema.ROLLOUT_CHECK``); the writer's side must say the same."""
    from harness.logprobs.rollout import Consistency
    from harness.report import schema

    report = Consistency("e", "t", "float32").to_dict()
    assert report["check"] == schema.ROLLOUT_CHECK
    assert set(schema.FIGURES) <= set(report)



def test_two_engines_must_agree_on_their_layer_states_too() -> None:
    """The layer states of requests that sampled the same tokens must be the same bits; the
    first boundary where two engines part is named (a request with other tokens is not
    compared: its tokens already are the problem)."""
    from harness.logprobs import rollout

    def record(bump: float, tokens: list[int]) -> dict[str, object]:
        states = {"embedding": torch.zeros(3, 4), "layer0.input_norm": torch.ones(3, 4) + bump}
        request = {"prompt": [5], "tokens": tokens, "logprobs": torch.zeros(2),
                   "rows": torch.zeros(2, 8)}
        return {"pid": 1 + int(bump * 10), "dtypes": {"float32": {
            "requests": [request], "layers": {"layers": 1, "states": [states]}}}}

    assert rollout.two_engines(record(0.0, [1, 2]), record(0.0, [1, 2]) | {"pid": 9}) == []
    assert rollout.two_engines(record(0.0, [1, 2]), record(0.5, [1, 2])) == [
        "float32 request 0: the engines' layer states part at layer0.input_norm"]
    other = rollout.two_engines(record(0.0, [1, 2]), record(0.5, [2, 1]))
    assert other == ["float32 request 0: the second engine sampled other tokens"], other
