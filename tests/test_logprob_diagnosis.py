"""What a logprob failure says: the first divergent op, found by seeding a row-count-dependent
kernel into torch (each in its own child: the seeds are global), and the vacuity guard,
which fails a flat distribution (a real model with its output layer scaled to near zero,
as ``load_format="dummy"`` makes vLLM's) instead of letting it pass."""

from __future__ import annotations

import math

import torch

from harness import run_isolated
from harness.logprobs import TinyDecoder, check_batch_invariance
from harness.logprobs.divergence import locate

SWEEP = {"batch_sizes": (1, 4, 16), "slots": ("first",), "decode_steps": 2}


def _seeded_case(which: str) -> dict[str, object]:
    """Child: the reference switch on, then one seed over it; the report's diagnosis."""
    import harness.logprobs.cases as cases
    from harness.invariance import reference as ref

    released = cases.build_source
    keep = []

    def build(*args, **kwargs):  # type: ignore[no-untyped-def]
        src, invariant = released(*args, **kwargs)
        lib = torch.library.Library("aten", "IMPL")
        keep.append(lib)
        if which == "log_softmax-python":  # an extra op from 16 rows on, above aten
            log_softmax = torch.log_softmax

            def wrapped(x, *args, **kwargs):  # type: ignore[no-untyped-def]
                out = log_softmax(x, *args, **kwargs)
                if x.shape[0] >= 16:
                    out = torch.nextafter(out, torch.full_like(out, -math.inf))
                return out
            torch.log_softmax = wrapped
        elif which == "matmul-python":  # the product in two halves from 4 rows on
            matmul = torch.Tensor.__matmul__

            def split(a, b):  # type: ignore[no-untyped-def]
                if a.dim() == 2 and a.shape[0] >= 4:
                    h = a.shape[1] // 2
                    return matmul(a[:, :h], b[:h]) + matmul(a[:, h:], b[h:])
                return matmul(a, b)
            torch.Tensor.__matmul__ = split
        elif which == "log_softmax":  # 1 ULP lower from 16 rows on
            def log_softmax(x, dim, half_to_float):  # type: ignore[no-untyped-def]
                out = ref._log_softmax_impl(x, dim)
                if x.shape[0] >= 16:
                    out = torch.nextafter(out, torch.full_like(out, -math.inf))
                return out
            lib.impl("_log_softmax", log_softmax, "CPU")
        else:  # another rounding from 4 rows on: the reduction split in two halves
            def matmul(a, b):  # type: ignore[no-untyped-def]
                a2 = a.reshape(-1, a.shape[-1])
                if a2.shape[0] >= 4:
                    h = a2.shape[1] // 2
                    out = ref._mm_impl(a2[:, :h].contiguous(), b[:h].contiguous()) + \
                        ref._mm_impl(a2[:, h:].contiguous(), b[h:].contiguous())
                else:
                    out = ref._mm_impl(a2, b)
                return out.reshape(*a.shape[:-1], b.shape[-1])
            lib.impl("matmul", matmul, "CPU")
        return src, invariant

    cases.build_source = build
    report = cases.run_logprob_case("tiny", True, "float32", "reference", **SWEEP)
    return {"summary": report.summary(), "divergence": report.first_divergence,
            "table": report.table()}


def test_a_seeded_log_softmax_is_named_as_the_first_divergent_op() -> None:
    got = run_isolated(_seeded_case, "log_softmax", method="forkserver").value
    div = got["divergence"]
    assert div["op"] == "aten::_log_softmax.default", got["table"]
    assert div["max_ulp"] == 1 and div["batch_size"] == 16 and div["dtype"] == "float32"
    assert div["shape_alone"] == [1, 1024] or tuple(div["shape_alone"]) == (1, 1024)
    assert "first divergent op: aten::_log_softmax.default" in got["table"]
    # the old diagnosis could only list what ran outside the switch's set
    assert "aten::_log_softmax" not in got["summary"]["outside_invariant_set"]


def test_an_op_that_runs_only_in_the_batch_pass_is_named() -> None:
    """Issue 43 item 7: a path that only the batch takes. log_softmax wrapped above aten so
    that 16 rows or more get one more op: every op of the alone run is in the batch pass
    bit for bit (the old answer: "none found"); the extra op is named, with where it sits."""
    got = run_isolated(_seeded_case, "log_softmax-python", method="forkserver").value
    div = got["divergence"]
    assert div["op"] == "aten::nextafter.default", got["table"]
    assert div["index"] == -1 and div["only_in_batch_count"] == 1, div
    assert div["only_in_batch_after"].startswith("aten::_log_softmax.default #"), div
    assert div["batch_size"] == 16
    assert "ran only in the batch pass (aten::nextafter.default #" in got["table"]
    assert "every op of the alone run" in got["table"]


def test_an_extra_path_is_named_not_its_consumer() -> None:
    """The product split in two halves and added from 4 rows on, above aten: the alone
    run's product has no counterpart and its consumer differs (the old answer named the
    consumer, aten::mul.Tensor); now the ops only the batch ran, the consumer beside them."""
    got = run_isolated(_seeded_case, "matmul-python", method="forkserver").value
    div = got["divergence"]
    assert div["batch_size"] == 4, got["table"]
    assert div["op"] == "aten::matmul.default", got["table"]
    assert any(x.startswith("aten::add.Tensor #") for x in div["only_in_batch"]), div
    assert div["read_by"], div
    assert "ran only in the batch pass" in got["table"]


def _unrelated_extra_op() -> object:
    """Child: the batch pass runs an op the alone pass does not, on rows that are not the
    probe's data (another request's sampling): not a cause, nothing is named."""
    gen = torch.Generator().manual_seed(0)
    w, rows = torch.randn(64, 32, generator=gen), torch.randn(8, 64, generator=gen)
    noise = torch.randn(7, 32, generator=gen)

    def layer(x: torch.Tensor) -> torch.Tensor:
        return torch.log_softmax(torch.relu(x @ w), dim=-1)

    def batch() -> None:
        layer(rows[:1])
        torch.exp(noise)  # (the others' sampling: the probe's data never reaches it)

    return locate(lambda: layer(rows[:1]), batch)


def test_an_extra_op_off_the_probes_data_is_not_named() -> None:
    assert run_isolated(_unrelated_extra_op, method="forkserver").value is None


def test_a_seeded_matmul_is_named_as_the_first_divergent_op() -> None:
    got = run_isolated(_seeded_case, "matmul", method="forkserver").value
    div = got["divergence"]
    # the reference switch overrides aten::matmul, so linear layers reach it, not aten::mm
    assert div["op"] == "aten::matmul.default", got["table"]
    assert div["batch_size"] == 4 and div["max_ulp"] > 0


def _native_mm_seeded() -> dict[str, object]:
    """Child: native torch (matmul decomposes to aten::mm), aten::mm seeded from 4 rows on."""
    lib = torch.library.Library("aten", "IMPL")

    def mm(a, b):  # type: ignore[no-untyped-def]
        out = (a.double().unsqueeze(-1) * b.double().unsqueeze(0)).sum(1)
        if a.shape[0] >= 4:
            h = a.shape[1] // 2
            out = (a[:, :h].double().unsqueeze(-1) * b[:h].double().unsqueeze(0)).sum(1) \
                .float().double() + \
                (a[:, h:].double().unsqueeze(-1) * b[h:].double().unsqueeze(0)).sum(1)
        return out.float()

    lib.impl("mm", mm, "CPU")
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(64, 32, generator=gen)
    rows = torch.randn(8, 64, generator=gen)

    def layer(x: torch.Tensor) -> torch.Tensor:
        return torch.log_softmax(torch.relu(x @ w), dim=-1)

    found = locate(lambda: layer(rows[:1]), lambda: layer(rows))
    equal = locate(lambda: layer(rows[:1]), lambda: layer(rows[:1].clone()))
    return {"found": None if found is None else found.op, "equal": equal}


def test_with_native_matmul_the_seeded_mm_is_named() -> None:
    got = run_isolated(_native_mm_seeded, method="forkserver").value
    assert got == {"found": "aten::mm.default", "equal": None}


def _chunked(nudge_row: int | None, logits_too: bool = True
             ) -> tuple[str | None, str | None, int]:
    """A prompt of 64 rows prefilled in chunks of 32 alone, and of 10 and 54 beside other
    rows in the batch (chunked prefill's shared budget moves the split): a row-wise op,
    then each chunk's "logits" of its last row (an mm, a log_softmax), which only the final
    chunk's are the same rows in both. ``nudge_row``: that probe row 1 ULP off in the batch
    run. (op, "occurrence [shape]", calls passed over) of the first divergence."""
    torch.manual_seed(0)
    probe, other, head = torch.randn(64, 48), torch.randn(22, 48), torch.randn(48, 40)

    def logits(rows: torch.Tensor) -> None:
        if logits_too:
            torch.log_softmax(rows @ head, dim=-1)

    def alone() -> None:
        logits(torch.sin(probe[:32].clone())[-1:])
        logits(torch.sin(probe[32:].clone())[-1:])

    nudged = probe.clone()  # (outside the recorder: an op there is a path of its own)
    if nudge_row is not None:
        nudged[nudge_row] = torch.nextafter(nudged[nudge_row], torch.tensor(math.inf))

    def batch() -> None:
        rows = nudged
        first = torch.sin(torch.cat([other, rows[:10]]))
        logits(first[[21, 31]])
        second = torch.sin(torch.cat([rows[10:], other[:3]]))
        logits(second[[53]])

    split = locate(alone, batch)
    if split is None:
        return None, None, 0
    return split.op, f"{split.occurrence} {list(split.shape_alone)}", split.passed_over


def test_a_prompt_chunked_otherwise_in_the_batch_is_not_a_divergence() -> None:
    assert _chunked(None, logits_too=False) == (None, None, 0)
    # the negative controls: one probe row changed, in either chunk of the alone run
    assert _chunked(40, logits_too=False) == ("aten::sin.default", "2 [32, 48]", 0)
    assert _chunked(3, logits_too=False) == ("aten::sin.default", "1 [32, 48]", 0)


def test_rows_only_one_schedule_computed_are_passed_over_for_a_rounding() -> None:
    """The first chunk's logits (and their log_softmax) are rows the batch never computed:
    the first divergent op is the later rounding difference, which does not read them."""
    assert _chunked(40) == ("aten::sin.default", "2 [32, 48]", 1)
    assert _chunked(63) == ("aten::sin.default", "2 [32, 48]", 1)
    assert _chunked(3) == ("aten::sin.default", "1 [32, 48]", 0)
    # nothing else differs (locate runs only once the logprobs did): the far row is named
    op, where, over = _chunked(None)
    assert (op, where, over) == ("aten::mm.default", "1 [1, 40]", 0)


def test_a_flat_distribution_fails_as_vacuous_input() -> None:
    flat = TinyDecoder(seed=0)
    flat.lm_head = flat.lm_head * 1e-7  # every logit ~0: every logprob ~ -ln(1024)
    report = check_batch_invariance(flat, batch_sizes=(1, 2), slots=("first",),
                                    decode_steps=2)
    assert report.vacuous.startswith("vacuous input: all 25 logprobs are within"), \
        report.vacuous
    assert "-ln(1024) = -6.93147" in report.vacuous
    assert report.vacuous in report.table()
    real = check_batch_invariance(TinyDecoder(seed=0), batch_sizes=(1, 2), slots=("first",),
                                  decode_steps=2)
    assert real.vacuous == ""


def test_tied_top_tokens_fail_as_vacuous_input() -> None:
    """Not flat, but every token has a twin with its output weights: each greedy step's
    best token ties with the second best, which the flatness test alone passes."""
    twins = TinyDecoder(seed=0)
    twins.lm_head[:, 1::2] = twins.lm_head[:, 0::2]
    report = check_batch_invariance(twins, batch_sizes=(1, 2), slots=("first",),
                                    decode_steps=3)
    assert "within" in report.vacuous and "of the top-2" in report.vacuous, report.vacuous
    assert report.vacuous.startswith("vacuous input: in all 3 greedy steps"), report.vacuous
    margins = TinyDecoder(seed=0).margins([[1, 2, 3]], 3)[0]
    assert margins.shape == (3,) and float(margins.min()) > 0
