"""Where two sides part, by module boundary (issue 58, part 1), without an engine: the
seeded Llama against itself names nothing; a regression seeded into one decoder layer's MLP
on one side is named at that layer and that module, end to end and locally; a boundary one
side did not capture is said, never taken as equal. The engine's side (vLLM's deferred
residual, its own hooks) is checked in tests/test_vllm_engine.py."""

from __future__ import annotations

import pytest
import torch

from harness import run_isolated
from harness.logprobs import hf_source, layer_states

pytestmark = pytest.mark.skipif(hf_source.unavailable() is not None,
                                reason=f"{hf_source.unavailable()}")


def _scale_mlp(model: object, layer: int = 2) -> None:
    mlp = model.model.layers[layer].mlp  # type: ignore[attr-defined]
    mlp.register_forward_hook(lambda _m, _i, out: out * (1.0 + 2.0 ** -5))


def _compare(seeded: bool) -> dict[str, object]:
    from harness.logprobs.training import TrainingForward, sequences

    seqs = sequences()[:2]
    engine_side = TrainingForward(dtype="float32")
    trainer_side = TrainingForward(dtype="float32", folder=engine_side.folder)
    if seeded:
        _scale_mlp(trainer_side.model)
    engine = [layer_states.trainer_states(engine_side.model, s) for s in seqs]
    trainer = [layer_states.trainer_states(trainer_side.model, s) for s in seqs]
    local = [layer_states.local_states(trainer_side.model, e) for e in engine]
    report = layer_states.compare(engine, trainer, local, 4, dtype="float32")
    return report.to_dict()


@pytest.fixture(scope="module")
def compared() -> dict[bool, dict[str, object]]:
    """Both comparisons, in one child (one model load each, one import)."""
    return run_isolated(_both, method="forkserver").value


def _both() -> dict[bool, dict[str, object]]:
    return {seeded: _compare(seeded) for seeded in (False, True)}


def test_a_model_against_itself_parts_nowhere(compared: dict[bool, dict[str, object]]
                                             ) -> None:
    got = compared[False]
    assert got["first"] is None and got["largest_local"] is None, got["sentence"]
    assert len(got["rows"]) == 1 + 4 * 5 + 2
    assert got["sentence"].startswith("first divergent layer: none (23 boundaries bit-equal")


def test_a_seeded_mlp_change_is_named_at_its_layer_and_module(
        compared: dict[bool, dict[str, object]]) -> None:
    got = compared[True]
    assert got["first"] == "layer2.mlp" and got["largest_local"] == "layer2.mlp", got["sentence"]
    assert got["sentence"].startswith("first divergent layer: layer 2, mlp ("), got["sentence"]
    assert "bit-equal before it: embedding, layer0.input_norm, " in got["sentence"]
    assert "the trainer's modules that differ: mlp (layer 2); most at layer 2, mlp" \
        in got["sentence"], got["sentence"]


def test_a_boundary_not_captured_is_said() -> None:
    one = {"embedding": torch.zeros(2, 3)}
    report = layer_states.compare([one], [one], [one], 1)
    assert [b.name for b in report.rows if not b.captured] == [
        "layer0.input_norm", "layer0.attention", "layer0.post_attention_norm", "layer0.mlp",
        "layer0", "final_norm", "logits"]
    report.not_captured = "the engine's hooks saw no layer0"
    assert report.sentence() == ("first divergent layer: not captured (the engine's hooks "
                                 "saw no layer0)")


def test_uncaptured_is_not_equal() -> None:
    """Issue 67: a boundary without a reading in one sequence is "not captured" for that
    sequence, never bit-equal; a first difference past it says it could sit there; a local
    reading that is missing is never the engine's own state; with nothing captured that
    differs, "none" is not said."""
    a, b = torch.zeros(2, 3), torch.ones(2, 3)
    full = {"embedding": a, "layer0.input_norm": a, "layer0.attention": a}
    lacking = {"embedding": a, "layer0.attention": a}  # sequence 1 lost its input norm
    trainer = [{**full, "layer0.attention": b}, {**lacking, "layer0.attention": b}]
    report = layer_states.compare([full, lacking], trainer, [full, {"embedding": a}], 1)
    rows = {r.name: r for r in report.rows}
    assert rows["layer0.input_norm"].not_captured_in == [1]
    assert not rows["layer0.input_norm"].captured
    assert rows["layer0.attention"].local_not_captured_in == [1]
    sentence = report.sentence()
    assert sentence.startswith("first divergent layer seen: layer 0, attention ("), sentence
    assert "bit-equal before it: embedding; not captured before it: layer0.input_norm " \
        "(sequence 1): the first difference could sit there)" in sentence
    same = layer_states.compare([full, lacking], [full, lacking], [full, lacking], 1)
    assert same.sentence().startswith("first divergent layer: none among the captured "
                                      "boundaries, but layer0.input_norm (sequence 1)"), \
        same.sentence()
