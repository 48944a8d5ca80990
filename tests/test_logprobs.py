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
from harness.logprobs.invariance_check import InvarianceReport, Mismatch, slot_positions

PERTURBED_TOKEN = 5


#: batch sizes of the broken-source checks: below, at and above the broken one
SWEEP = (1, 2, 8, 16)


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
    # four batch sizes around the broken one (the suite's row sweeps all eight)
    return check_batch_invariance(OneUlpAtBatch8(source) if wrap else source,
                                  batch_sizes=SWEEP)


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
    assert "6 of 18 batch-size cases differ" in table
    assert "prefill      8   first    0            5       1" in table
    summary = report.summary()
    assert summary["batch_sizes_differing"] == [8] and summary["max_ulp"] == 1


def test_the_same_source_unbroken_is_equal() -> None:
    report = run_isolated(invariant_check, False, method="forkserver", timeout=600).value
    assert report.equal, report.table()
    assert report.cases == 18


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
        # the seeded checkpoint, loaded as vLLM loads any folder (not load_format="dummy")
        assert "load_format" not in kwargs and kwargs["skip_tokenizer_init"] is False
        assert kwargs["enable_prefix_caching"] is False  # each pass computes its batch
        folder = Path(kwargs["model"])
        config = json.loads((folder / "config.json").read_text())
        assert config["architectures"] == ["LlamaForCausalLM"]
        assert (folder / "model.safetensors").is_file() and (folder / "tokenizer.json").is_file()
        self.model = TinyDecoder(dtype=getattr(torch, kwargs["dtype"]))

    def generate(self, prompts: list[dict[str, list[int]]], params: Any, use_tqdm: bool = True):  # type: ignore[no-untyped-def]
        batch = [p["prompt_token_ids"] for p in prompts]
        entry = lambda v: SimpleNamespace(logprob=float(v))  # noqa: E731
        if getattr(params, "prompt_logprobs", None) is not None:
            rows = self.model.prefill(batch)
            return [SimpleNamespace(prompt_logprobs=[None] + [{t: entry(v)} for t, v in
                                                           zip(seq[1:], row.tolist(), strict=True)])
                    for seq, row in zip(batch, rows, strict=True)]
        if getattr(params, "logprobs", 0) == 2:  # ranked top-2, as vLLM gives them
            gaps = self.model.margins(batch, params.max_tokens)
            rank = lambda v, r: SimpleNamespace(logprob=float(v), rank=r)  # noqa: E731
            return [SimpleNamespace(outputs=[SimpleNamespace(
                token_ids=list(range(len(g))),
                logprobs=[{0: rank(-1.0, 1), 1: rank(-1.0 - float(v), 2)} for v in g])])
                for g in gaps]
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
    assert "(float32, seeded 4-layer llama)" in on.source
    off = run_isolated(vllm_check, False, method="forkserver", timeout=600).value
    assert not off.equal  # fp32 mm on this CPU differs from 4 rows on


def test_vllm_unavailable_reasons(monkeypatch: pytest.MonkeyPatch) -> None:
    real_has_module = vllm_source.has_module
    monkeypatch.setattr(vllm_source, "has_module", lambda name: False)
    assert vllm_source.unavailable("cuda").startswith("vllm is not installed (a CPU runner's "
                                                      "engine: bash ci/setup.sh --engine")
    monkeypatch.setattr(vllm_source, "has_module", real_has_module)


# --- the inverse control's expectations -------------------------------------------------------

def test_expectation_table() -> None:
    from harness.logprobs.expectations import expectation, judge

    def inside(check, source, dtype, on, machine="x86_64"):  # type: ignore[no-untyped-def]
        """Figures inside the row's envelope (its measured maxima), or None without one."""
        envelope = expectation(check, source, "cpu", dtype, on, machine).envelope
        return {n: hi for n, (_, hi) in envelope.figures.items()} if envelope else None

    def outcome(check, equal, source, dtype, on, machine="x86_64"):  # type: ignore[no-untyped-def]
        figures = None if equal else inside(check, source, dtype, on, machine)
        return judge(check, equal, 42, source, "cpu", dtype, on, machine=machine,
                     figures=figures)

    # the switch-off difference inside its envelope passes; ten times it fails (issue 56)
    verdict, why = judge("batch-size", False, 42, "tiny", "cpu", "float32", False,
                         machine="x86_64", figures={**inside("batch-size", "tiny", "float32",
                                                             False), "max_ulp": 113})
    assert verdict == "passed" and "as expected, within its envelope" in why, why
    verdict, why = judge("batch-size", False, 42, "tiny", "cpu", "float32", False,
                         machine="x86_64", figures={**inside("batch-size", "tiny", "float32",
                                                             False), "max_ulp": 1590})
    assert verdict == "failed" and why.startswith("drift grew: batch-size of tiny float32 "
                                                  "on cpu: max_ulp 1590"), why
    verdict, why = outcome("batch-size", True, "tiny", "float32", False)
    assert verdict == "failed"
    assert why.startswith("inverse control found no difference in 42 batch-size cases, but "
                          "tiny float32 on cpu is known to differ without the switch (measured")
    assert "22 of 42 cases differ" in why and why.endswith("the comparison or the sweep is "
                                                           "broken")
    assert outcome("batch-size", True, "tiny", "bfloat16", False)[0] == "xfailed"
    verdict, why = outcome("batch-size", True, "tiny", "float32", False, "aarch64")
    assert verdict == "xfailed"
    assert "no measurement for batch-size of tiny float32 on cpu (aarch64)" in why
    # switch on: must hold, unless a known gap (which must not silently close)
    assert outcome("batch-size", True, "tiny", "float32", True)[0] == "passed"
    assert outcome("batch-size", False, "tiny", "float32", True)[0] == "failed"
    verdict, why = outcome("decode-vs-prefill", False, "tiny", "float32", True)
    assert verdict == "xfailed" and "aten::bmm" in why
    verdict, why = outcome("decode-vs-prefill", True, "hf-left", "float32", True)
    assert verdict == "failed" and why.endswith("correct harness/logprobs/expectations.toml")
    # an AMX-BF16 CPU: its own bf16 entries first, the architecture's otherwise
    assert outcome("decode-vs-prefill", False, "tiny", "bfloat16", True, "x86_64+amx")[0] == \
        "xfailed"
    assert outcome("decode-vs-prefill", False, "tiny", "bfloat16", True)[0] == "failed"
    assert outcome("batch-size", True, "tiny", "bfloat16", False, "x86_64+amx")[0] == "xfailed"
    assert outcome("batch-size", True, "tiny", "float32", False, "x86_64+amx")[0] == "failed"
    # repeat: equal, switch on or off
    assert outcome("repeat", False, "hf", "float32", False)[0] == "failed"
    assert outcome("repeat", True, "hf", "float32", False)[0] == "passed"


def test_a_diagnosis_fails_while_the_difference_still_starts_in_its_op() -> None:
    """vllm-nosplit (split-KV decode off): equal passes, a difference from another op
    passes and says which, one still from the attention fails, and one not localised fails
    (it cannot tell)."""
    from harness.logprobs.expectations import judge

    def outcome(equal, first_op):  # type: ignore[no-untyped-def]
        return judge("batch-size", equal, 18, "vllm-nosplit", "cpu", "float32", False,
                     machine="x86_64", first_op=first_op)

    assert outcome(True, None) == ("passed", "all 18 batch-size cases bitwise equal: none "
                                             "starts in vllm::unified_attention")
    verdict, why = outcome(False, "aten::silu.default")
    assert verdict == "passed" and why.startswith(
        "batch-size differs, first in aten::silu.default, not in vllm::unified_attention")
    verdict, why = outcome(False, "vllm::unified_attention_with_output.default")
    assert verdict == "failed" and why.startswith(
        "batch-size still differs from vllm::unified_attention_with_output.default")
    verdict, why = outcome(False, None)
    assert verdict == "failed" and "first divergent op was not found" in why


LOGPROB_SUITE = Path(__file__).parent.parent / "suites" / "test_logprob_batch_invariance.py"


def test_inverse_control_fails_when_the_comparison_is_broken(pytester: pytest.Pytester) -> None:
    """A comparison that never sees a difference: where the default path is known to be
    batch-variant (fp32 on this CPU), the switch-off case fails instead of an XFAIL."""
    from harness.logprobs.expectations import expectation

    if expectation("batch-size", "tiny", "cpu", "float32", False).outcome != "differ":
        pytest.skip("no measurement says fp32 on this CPU is batch-variant")
    pytester.makepyfile(test_lp_copy=LOGPROB_SUITE.read_text())
    pytester.makeconftest(
        "import pytest\n"
        "@pytest.fixture\n"
        "def run_on_npu(run_on_npu):\n"
        "    def broken(fn, *args, **kwargs):\n"
        "        def blind(*a):\n"
        "            import harness.logprobs.invariance_check as engine\n"
        "            engine.compare_bits = lambda ref, got: None\n"
        "            return fn(*a)\n"
        "        return run_on_npu(blind, *args, **kwargs)\n"
        "    return broken\n")
    result = pytester.runpytest("-k", "batch-size and tiny and off and float32", "-p",
                                "no:cacheprovider")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*inverse control found no difference in 42 batch-size cases, "
                                 "but tiny float32 on cpu is known to differ*"])


# --- decode versus prefill, repeat, padding: negative controls -------------------------------

class _OneUlpAtStep3(TinyDecoder):
    """Broken on purpose: its decode path moves one logprob one ULP at decode step 3."""

    def generate(self, batch, steps):  # type: ignore[no-untyped-def]
        out = []
        for tokens, lp in super().generate(batch, steps):
            lp = lp.clone()
            lp[3] = torch.nextafter(lp[3], torch.tensor(float("inf")))
            out.append((tokens, lp))
        return out


def test_decode_perturbed_one_ulp_at_one_step_fails_at_that_step() -> None:
    from harness.logprobs.properties import check_decode_matches_prefill

    sweep = {"batch_sizes": (1, 2), "decode_steps": 5}
    clean = check_decode_matches_prefill(TinyDecoder(dtype=torch.bfloat16), **sweep)
    if not clean.equal:
        pytest.skip("decode-vs-prefill of tiny bf16 does not hold on this CPU: no clean "
                    "baseline to perturb")
    report = check_decode_matches_prefill(_OneUlpAtStep3(dtype=torch.bfloat16), **sweep)
    assert report.cases == 6 and len(report.mismatches) == 6
    assert {(m.phase, m.token_index, m.max_ulp, m.differing_tokens) for m in report.mismatches} \
        == {("decode-vs-prefill", 3, 1, 1)}
    assert {m.detail for m in report.mismatches} == {"prefill alone", "prefill in the same batch"}
    assert report.failing_pass_ops  # the failing pass was recorded for the coverage report


class _HiddenNoise(TinyDecoder):
    """Broken on purpose: one prompt logprob moves by a random amount on some calls."""

    def prefill(self, batch):  # type: ignore[no-untyped-def]
        import random

        out = super().prefill(batch)
        out[0] = out[0] + random.SystemRandom().choice([0.0, 1e-3])
        return out


def test_hidden_random_perturbation_fails_repeat() -> None:
    from harness.logprobs.properties import check_repeatable

    assert check_repeatable(TinyDecoder(), runs=3, batch_size=2, decode_steps=2).equal
    for _ in range(10):  # the noise is random: 10 tries of 5 runs, one must see it
        report = check_repeatable(_HiddenNoise(), runs=5, batch_size=2, decode_steps=2)
        if not report.equal:
            break
    assert not report.equal
    assert {(m.phase, m.position) for m in report.mismatches} == {("repeat", 0)}
    assert report.mismatches[0].detail.startswith("prefill, run ")


def test_repeat_across_processes_is_compared() -> None:
    from harness.logprobs.properties import check_repeatable, compare_repeat

    first = check_repeatable(TinyDecoder(), runs=1, batch_size=2, decode_steps=2)
    second = check_repeatable(TinyDecoder(), runs=1, batch_size=2, decode_steps=2)
    assert compare_repeat(first, second).equal
    second.outputs[3] = second.outputs[3] + 1e-3
    bad = compare_repeat(first, check_repeatable(TinyDecoder(), runs=1, batch_size=2,
                                                 decode_steps=2))
    assert bad.equal
    broken = compare_repeat(first, second)
    assert [(m.phase, m.position, m.detail) for m in broken.mismatches] == [
        ("repeat", 1, "decode, process 2 vs process 1")]



def test_two_processes_under_other_threads_are_not_comparable() -> None:
    """The repeat across processes compares bits only between processes under the same
    kernel-choosing conditions: a child given 1 intra-op thread against one given 2 is "not
    comparable" (the harness's doing, never the stack's), naming the condition; two alike
    are compared as before."""
    from harness.logprobs.cases import run_logprob_case
    from harness.logprobs.properties import compare_repeat
    from harness.stack.devices import THREADS_ENV

    def once(threads: str) -> InvarianceReport:
        return run_isolated(run_logprob_case, "tiny", False, "float32", "reference",
                            "repeat", runs=1, batch_size=2, decode_steps=2,
                            method="forkserver",
                            env={THREADS_ENV: threads, "OMP_NUM_THREADS": threads}).value

    first = once("1")
    assert first.conditions["threads"] == "1" and "torch" in first.conditions
    alike = compare_repeat(first, once("1"))
    assert alike.not_comparable == [] and alike.equal
    apart = compare_repeat(first, once("2"))
    assert len(apart.not_comparable) == 1
    assert "threads: 1 vs 2" in apart.not_comparable[0]
    assert apart.summary()["not_comparable"] == apart.not_comparable


def test_a_third_process_says_which_went_its_own_way() -> None:
    from harness.logprobs.properties import check_repeatable, processes_agreeing

    runs = [check_repeatable(TinyDecoder(), runs=1, batch_size=2, decode_steps=2)
            for _ in range(3)]
    assert processes_agreeing(runs) == "all 3 processes agree"
    runs[1].outputs[0] = runs[1].outputs[0] + 1e-3
    assert processes_agreeing(runs) == "processes 1 and 3 agree; process 2 alone"


def test_conditions_name_what_differs_and_leave_out_where_it_ran() -> None:
    from harness.stack.conditions import differences, process_conditions

    here = process_conditions(weights="abc")
    assert here["weights"] == "abc" and here["threads"] == str(torch.get_num_threads())
    # plain str, never a subclass (torch.__version__ is a TorchVersion): pytest-xdist sends
    # a report's properties through execnet, which refuses anything else
    assert all(type(k) is str and type(v) is str for k, v in here.items()), here
    assert differences(here, {**here, "cpu": "99"}) == []
    assert differences(here, {**here, "OMP_NUM_THREADS": "7"}) == [
        f"OMP_NUM_THREADS: {here.get('OMP_NUM_THREADS', 'unset')} vs 7"]

def _hf_or_skip():  # type: ignore[no-untyped-def]
    from harness.logprobs import hf_source

    reason = hf_source.unavailable()
    if reason:
        pytest.skip(reason)
    return hf_source.HfSource


def test_a_mask_that_leaks_one_padded_position_is_caught() -> None:
    HfSource = _hf_or_skip()

    class LeakyMask(HfSource):  # type: ignore[misc, valid-type]
        """Broken on purpose: the first padded column of each left-padded row is unmasked."""

        def _padded(self, batch, side):  # type: ignore[no-untyped-def]
            ids, mask = super()._padded(batch, side)
            for row in range(mask.shape[0]):
                if side == "left" and mask[row, 0] == 0:
                    mask[row, 0] = 1
            return ids, mask

    sweep = {"batch_sizes": (1, 3), "decode_steps": 0}
    clean = check_batch_invariance(HfSource(padding="left"), **sweep)
    assert not [m for m in clean.mismatches if m.phase == "padding"]
    report = check_batch_invariance(LeakyMask(padding="left"), **sweep)
    leaks = [m for m in report.mismatches if m.phase == "padding"]
    assert leaks and {m.detail for m in leaks} == {"pad id 0 vs 7"}


def test_hf_source_builds_without_a_download_and_pads_both_ways() -> None:
    HfSource = _hf_or_skip()
    batch = [[5, 6, 7, 8], [9, 10]]
    right, left = HfSource(padding="right"), HfSource(padding="left")
    assert [t.shape[0] for t in right.prefill(batch)] == [3, 1]
    assert [t.shape[0] for t in left.prefill(batch)] == [3, 1]
    tokens, lps = zip(*right.generate(batch, 3), strict=True)
    assert [len(t) for t in tokens] == [3, 3] and all(lp.shape == (3,) for lp in lps)
    with pytest.raises(ValueError, match="padding='middle'"):
        HfSource(padding="middle")
    qwen = HfSource(arch="qwen2")
    assert qwen.name.startswith("hf Qwen2ForCausalLM(seed=0, float32, sdpa, right padding)")
    assert [t.shape[0] for t in qwen.prefill(batch)] == [3, 1]
    # seeded: the same weights, so the same bits, in another instance
    assert torch.equal(right.prefill(batch)[0], HfSource(padding="right").prefill(batch)[0])


def test_coverage_names_the_ops_outside_the_invariant_set() -> None:
    """Switch on, decode versus prefill of tiny fp32 fails: the report says attention's bmm
    and softmax ran outside the reference's invariant set (its mm/matmul/mean did not)."""
    from harness.logprobs.cases import run_logprob_case

    report = run_isolated(run_logprob_case, "tiny", True, "float32", "reference",
                          "decode-vs-prefill", batch_sizes=(2,), decode_steps=3,
                          method="forkserver", env={"VLLM_BATCH_INVARIANT": "1"}).value
    if report.equal:
        pytest.skip("decode-vs-prefill of tiny fp32 holds on this CPU with the switch on")
    assert set(report.outside_invariant_set) == {"aten::bmm", "aten::_softmax"}
    assert "ran outside the target's invariant set during the first failing pass: " \
        in report.table()
