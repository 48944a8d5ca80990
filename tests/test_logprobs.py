"""The logprob check engine: bit comparison, the one-ULP negative control, the report, and
the vLLM adapter against a fake engine built on TinyDecoder."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from harness import run_isolated
from harness.logprobs import TinyDecoder, check_batch_invariance, compare_bits, vllm_source
from harness.logprobs.engine import InvarianceReport, Mismatch, slot_positions

PERTURBED_TOKEN = 5


class OneUlpAtBatch8:
    """Broken on purpose: nudges every sequence's logprob at one token by one ULP, only when
    the batch holds 8 sequences."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.name, self.config = inner, "one-ulp-at-8", inner.config

    def _nudge(self, batch: list[list[int]], rows: list[torch.Tensor]) -> list[torch.Tensor]:
        if len(batch) != 8:
            return rows
        out = []
        for r in rows:
            r = r.clone()
            r[PERTURBED_TOKEN] = torch.nextafter(r[PERTURBED_TOKEN], torch.tensor(0.0))
            out.append(r)
        return out

    def prefill(self, batch: list[list[int]]) -> list[torch.Tensor]:
        return self._nudge(batch, self.inner.prefill(batch))

    def decode(self, batch: list[list[int]], steps: int) -> list[torch.Tensor]:
        return self._nudge(batch, self.inner.decode(batch, steps))


def invariant_check(wrap: bool) -> InvarianceReport:
    """In a child: reference switch on, TinyDecoder (optionally broken), the default check."""
    import os

    os.environ["VLLM_BATCH_INVARIANT"] = "1"
    from harness.invariance import reference

    reference.init_batch_invariance()
    source: Any = TinyDecoder()
    return check_batch_invariance(OneUlpAtBatch8(source) if wrap else source)


def test_one_ulp_at_batch_size_8_is_caught_and_located() -> None:
    report = run_isolated(invariant_check, True, method="forkserver", timeout=600).value
    assert not report.equal
    assert {m.batch_size for m in report.mismatches} == {8}
    assert {m.phase for m in report.mismatches} == {"prefill", "decode"}
    assert {m.slot for m in report.mismatches} == {"first", "middle", "last"}
    assert {m.token_index for m in report.mismatches} == {PERTURBED_TOKEN}
    assert {m.max_ulp for m in report.mismatches} == {1}
    assert {m.differing_tokens for m in report.mismatches} == {1}
    table = report.table()
    assert "6 of 42 cases differ" in table
    assert "prefill      8   first    0            5       1" in table
    summary = report.summary()
    assert summary["batch_sizes_differing"] == [8] and summary["max_ulp"] == 1


def test_the_same_source_unbroken_is_equal() -> None:
    report = run_isolated(invariant_check, False, method="forkserver", timeout=600).value
    assert report.equal, report.table()
    assert report.cases == 42


def test_compare_bits() -> None:
    a = torch.tensor([-1.5, 0.25, 3.0])
    assert compare_bits(a, a.clone()) is None
    b = a.clone()
    b[1] = torch.nextafter(b[1], torch.tensor(1.0))
    first, diff, ulp, count = compare_bits(a, b)
    assert (first, ulp, count) == (1, 1, 1) and diff > 0
    c = a.clone()
    c[0] = torch.nextafter(torch.nextafter(c[0], torch.tensor(0.0)), torch.tensor(0.0))
    assert compare_bits(a, c)[2] == 2  # ULPs across the negative range
    assert compare_bits(torch.tensor([0.0]), torch.tensor([-0.0])) == (0, 0.0, 0, 1)
    h = torch.tensor([1.0, 2.0], dtype=torch.bfloat16)
    h2 = h.clone()
    h2[1] = torch.nextafter(h2[1], torch.tensor(3.0, dtype=torch.bfloat16))
    assert compare_bits(h, h2)[2] == 1
    assert compare_bits(a, a[:2])[0] == 2  # different lengths are a mismatch, not a crash


def test_slots_are_not_repeated() -> None:
    assert slot_positions(1, ("first", "middle", "last")) == [("first", 0)]
    assert slot_positions(2, ("first", "middle", "last")) == [("first", 0), ("middle", 1)]
    assert slot_positions(8, ("first", "middle", "last")) == [("first", 0), ("middle", 4),
                                                              ("last", 7)]
    with pytest.raises(ValueError, match="slot 'end'"):
        slot_positions(4, ("end",))


class NudgeAtIndex:
    """Broken on purpose: one ULP on the row at one index of every batch of 2 or more (the
    reference, batch size 1, stays clean), so only the probe placed at that index differs."""

    name = "nudge-at-index"

    def __init__(self, index_of: Any) -> None:
        self.index_of = index_of

    def _rows(self, batch: list[list[int]], width: int) -> list[torch.Tensor]:
        rows = [torch.tensor(s[:width], dtype=torch.float32) / 7 for s in batch]
        if len(batch) > 1:
            i = self.index_of(len(batch))
            rows[i] = torch.nextafter(rows[i], torch.full_like(rows[i], 1e9))
        return rows

    def prefill(self, batch: list[list[int]]) -> list[torch.Tensor]:
        return self._rows(batch, 4)

    def decode(self, batch: list[list[int]], steps: int) -> list[torch.Tensor]:
        return self._rows(batch, steps)


@pytest.mark.parametrize("where, index_of", [
    ("first", lambda bs: 0), ("middle", lambda bs: bs // 2), ("last", lambda bs: bs - 1)])
def test_the_probe_really_sits_at_its_slot(where: str, index_of: Any) -> None:
    """Only the batch row at ``index_of(bs)`` is perturbed: every mismatch must be the probe at
    exactly that position, in every batch size of 2 or more."""
    sizes = (1, 2, 3, 4, 5, 8, 16, 32)
    report = check_batch_invariance(NudgeAtIndex(index_of), batch_sizes=sizes, decode_steps=4,
                                    vocab=50)
    assert all(m.position == index_of(m.batch_size) for m in report.mismatches)
    assert sorted({m.batch_size for m in report.mismatches}) == [2, 3, 4, 5, 8, 16, 32]
    assert {m.phase for m in report.mismatches} == {"prefill", "decode"}
    if where != "first":  # at bs 2 'middle' and 'last' are the same index, named 'middle'
        assert {m.slot for m in report.mismatches if m.batch_size > 2} == {where}


def test_explicit_probe_and_fillers() -> None:
    class Echo:
        name = "echo"

        def prefill(self, batch):  # type: ignore[no-untyped-def]
            return [torch.tensor(s[1:], dtype=torch.float32) for s in batch]

        def decode(self, batch, steps):  # type: ignore[no-untyped-def]
            return [torch.zeros(steps) for _ in batch]

    report = check_batch_invariance(Echo(), probe=[1, 2, 3], fillers=[[4, 5]] * 3,
                                    batch_sizes=(1, 4))
    assert report.equal and report.probe_length == 3 and report.cases == 8
    with pytest.raises(ValueError, match="2 fillers given; batch size 4 needs 3"):
        check_batch_invariance(Echo(), probe=[1, 2], fillers=[[1]] * 2, batch_sizes=(4,))


def test_report_table_and_summary_when_equal() -> None:
    r = InvarianceReport("s", (1,), ("first",), 0, 3, cases=2)
    assert r.table() == "s: all 2 cases bitwise equal"
    assert r.summary()["equal"] is True
    r.mismatches.append(Mismatch("decode", 4, "last", 3, 0, 1e-6, 7, 2))
    assert r.summary()["first"]["batch_size"] == 4


# --- the vLLM adapter against a fake engine ------------------------------------------------

class FakeSamplingParams(SimpleNamespace):
    pass


class FakeLLM:
    """Answers like vllm.LLM.generate (prompt_logprobs, outputs[0].token_ids / logprobs),
    computing with TinyDecoder; checks the adapter's engine arguments."""

    def __init__(self, **kwargs: Any) -> None:
        assert kwargs["load_format"] == "dummy" and kwargs["skip_tokenizer_init"] is True
        config = json.loads((Path(kwargs["model"]) / "config.json").read_text())
        assert config["architectures"] == ["LlamaForCausalLM"]
        self.model = TinyDecoder(dtype=getattr(torch, kwargs["dtype"]))

    def generate(self, prompts: list[dict[str, list[int]]], params: Any, use_tqdm: bool = True):  # type: ignore[no-untyped-def]
        batch = [p["prompt_token_ids"] for p in prompts]
        entry = lambda v: SimpleNamespace(logprob=float(v))  # noqa: E731
        if getattr(params, "prompt_logprobs", None) is not None:
            rows = self.model.prefill(batch)
            return [SimpleNamespace(prompt_logprobs=[None] + [{t: entry(v)} for t, v in
                                                           zip(seq[1:], row.tolist(), strict=True)])
                    for seq, row in zip(batch, rows, strict=True)]
        rows = self.model.decode(batch, params.max_tokens)
        return [SimpleNamespace(outputs=[SimpleNamespace(token_ids=list(range(len(row))),
                                                         logprobs=[{i: entry(v)} for i, v in
                                                                   enumerate(row.tolist())])])
                for row in rows]


def vllm_check(on: bool) -> InvarianceReport:
    import os

    os.environ["VLLM_BATCH_INVARIANT"] = "1" if on else "0"
    from harness.invariance import reference

    reference.init_batch_invariance()
    source = vllm_source.VllmSource(dtype="float32", llm_factory=FakeLLM,
                                    sampling_params_cls=FakeSamplingParams)
    return check_batch_invariance(source, batch_sizes=(1, 4, 8), decode_steps=4)


def test_vllm_adapter_on_a_fake_engine() -> None:
    on = run_isolated(vllm_check, True, method="forkserver", timeout=600).value
    assert on.equal, on.table()
    assert on.source.startswith("vllm(float32, dummy 4-layer llama)")
    off = run_isolated(vllm_check, False, method="forkserver", timeout=600).value
    assert not off.equal  # fp32 mm on this CPU differs from 4 rows on


def test_vllm_unavailable_reasons(monkeypatch: pytest.MonkeyPatch) -> None:
    real_has_module = vllm_source.has_module
    monkeypatch.setattr(vllm_source, "has_module", lambda name: False)
    assert vllm_source.unavailable("cuda") == "vllm is not installed"
    monkeypatch.setattr(vllm_source, "has_module", real_has_module)


# --- the inverse control's expectations -------------------------------------------------------

def test_inverse_control_table() -> None:
    from harness.logprobs.expectations import judge_inverse

    assert judge_inverse(False, 42, "tiny", "cpu", "float32", "x86_64")[0] == "passed"
    outcome, why = judge_inverse(True, 42, "tiny", "cpu", "float32", "x86_64")
    assert outcome == "failed"
    assert why.startswith("inverse control found no difference in 42 cases, but tiny float32 "
                          "on cpu is known to be batch-variant without the switch (measured")
    assert "22 of 42 cases differ" in why and why.endswith("the comparison or the batch-size "
                                                           "sweep is broken")
    assert judge_inverse(True, 42, "tiny", "cpu", "bfloat16", "x86_64")[0] == "xfailed"
    outcome, why = judge_inverse(True, 42, "tiny", "cpu", "float32", "aarch64")
    assert outcome == "xfailed"
    assert "no measurement for tiny float32 on cpu (aarch64) says it is batch-variant" in why


LOGPROB_SUITE = Path(__file__).parent.parent / "suites" / "test_logprob_batch_invariance.py"


def test_inverse_control_fails_when_the_comparison_is_broken(pytester: pytest.Pytester) -> None:
    """A comparison that never sees a difference: where the default path is known to be
    batch-variant (fp32 on this CPU), the switch-off case fails instead of an XFAIL."""
    from harness.logprobs.expectations import inverse_expectation

    if not inverse_expectation("tiny", "cpu", "float32").variant:
        pytest.skip("no measurement says fp32 on this CPU is batch-variant")
    pytester.makepyfile(test_lp_copy=LOGPROB_SUITE.read_text())
    pytester.makeconftest(
        "import pytest\n"
        "@pytest.fixture\n"
        "def run_on_npu(run_on_npu):\n"
        "    def broken(fn, *args, **kwargs):\n"
        "        def blind(*a):\n"
        "            import harness.logprobs.engine as engine\n"
        "            engine.compare_bits = lambda ref, got: None\n"
        "            return fn(*a)\n"
        "        return run_on_npu(blind, *args, **kwargs)\n"
        "    return broken\n")
    result = pytester.runpytest("-k", "tiny and off and float32", "-p", "no:cacheprovider")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*inverse control found no difference in 42 cases, but tiny "
                                 "float32 on cpu is known to be batch-variant*"])
