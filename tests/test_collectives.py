"""The collectives family's own controls (issue 45), on real gloo ranks:

- the order-varying all-reduce (ranks summed in an order that rotates with the message size)
  fails the size property on 4 ranks, naming the collective and the message size; on 2 ranks
  the same control shows nothing, and the family calls that vacuous, not a pass;
- a rank killed by a signal, a rank that raises and a hung rank are named, and no rank
  process is left behind;
- the ranks start with exactly what the target's switch set: a switch that drops a declared
  setting or sets an undeclared one is caught.
"""

from __future__ import annotations

import functools
import os
import signal
import time
from pathlib import Path

import psutil
import pytest

from harness.collectives import expected, inputs, properties, settings
from harness.collectives.ranks import RankError, run_ranks
from harness.invariance.declared import load as load_declared

SIZES = (1, 2, 3, 7, 16, 17, 64)
DTYPES = ("float32",)


@functools.cache  # one run of 4 ranks per collective and world
def _reading(collective: str, world: int) -> properties.Reading:
    got = run_ranks(properties.measure, (collective, DTYPES, SIZES), world=world,
                    backend="gloo", timeout=120)
    return properties.read(collective, world, [r.value for r in got], SIZES, DTYPES)


def test_order_varying_control_fails_naming_collective_and_size() -> None:
    reading = _reading("order_varying_all_reduce", 4)
    assert expected.vacuous(reading, "gloo") is None
    outcome, message, _ = expected.judge_sizes(reading, expected.CollectiveExpectation("equal", "claimed"))
    assert outcome == "fail"
    assert "order_varying_all_reduce float32, a 2-row message, row 0: differs from the row " \
           "alone in a 1-row message" in message
    # 17 % 4 == 1 % 4: the same rank order as the row alone, so the same bits
    assert 17 not in reading.sizes_differing("float32")
    assert {2, 3, 7, 16, 64} <= set(reading.sizes_differing("float32"))
    # and the suite's own expectation for it
    control = expected.expect("gloo", "order_varying_all_reduce", "switch")
    assert expected.judge_sizes(reading, control)[0] == "xfail"


def test_fixed_order_all_reduce_is_size_invariant() -> None:
    reading = _reading("fixed_order_all_reduce", 4)
    assert reading.mismatches == []
    assert expected.judge_sizes(reading, expected.expect("gloo", "fixed_order_all_reduce",
                                                         "none"))[0] == "pass"


def test_two_ranks_cannot_show_order_and_are_vacuous() -> None:
    reading = _reading("order_varying_all_reduce", 2)
    assert reading.mismatches == []  # a + b == b + a: the control shows nothing
    why = expected.vacuous(reading, "gloo")
    assert why and why.startswith("vacuous: 2 gloo rank(s) cannot show summation order")
    assert not inputs.order_shows(2, "bfloat16") and inputs.order_shows(4, "bfloat16")


def test_a_difference_the_table_says_is_there_but_is_not_fails() -> None:
    reading = _reading("fixed_order_all_reduce", 4)
    outcome, message, _ = expected.judge_sizes(reading,
                                               expected.CollectiveExpectation("differ", "measured"))
    assert outcome == "fail" and "out of date" in message


def test_the_gloo_row_gone_from_11_sizes_to_none_is_stale() -> None:
    """The data file's measured gloo all-reduce row (every size differs), read against ranks
    that sum in a fixed order (none differs): stale, a failure, never a pass."""
    reading = _reading("fixed_order_all_reduce", 4)
    reading.collective = "all_reduce"
    outcome, message, drift = expected.judge_sizes(reading, expected.expect("gloo",
                                                                            "all_reduce",
                                                                            "none", 4))
    assert outcome == "fail" and "expected.toml is out of date" in message, message
    assert [r["judged"] for r in drift] == ["stale"]


def _low_precision_all_reduce(rank: int, world: int, *args: object) -> object:
    """A regression seeded into the backend: messages of more than one row are all-reduced
    in bf16 and cast back (what a compressed all-reduce for large messages does); the row
    alone keeps fp32. The size property's drift grows from the measured ULPs to thousands."""
    import torch
    import torch.distributed as dist

    native = dist.all_reduce

    def all_reduce(x: torch.Tensor, *a: object, **k: object) -> object:
        if x.dim() > 1 and x.shape[0] > 1 and x.dtype == torch.float32:
            low = x.to(torch.bfloat16)
            out = native(low, *a, **k)
            x.copy_(low.float())
            return out
        return native(x, *a, **k)

    dist.all_reduce = all_reduce
    return properties.measure(rank, world, *args)


def test_a_gloo_row_whose_ulps_grow_fails_as_drift_grew_naming_the_figure() -> None:
    """The same ranks, unchanged, stay inside the row's envelope; with the low-precision
    all-reduce the row fails naming max_ulp and max_abs against the measured envelope."""
    judge = functools.partial(expected.judge_sizes,
                              expectation=expected.expect("gloo", "all_reduce", "none", 4))
    if all(e is None for e in judge.keywords["expectation"].measured.values()):
        pytest.fail("the gloo all_reduce row has no envelope: measure it "
                    "(bash ci/measure-envelopes.sh)", pytrace=False)
    same, _, drift = judge(_reading("all_reduce", 4))
    assert same == "xfail" and [r["judged"] for r in drift] == ["within"], drift
    got = run_ranks(_low_precision_all_reduce, ("all_reduce", DTYPES, SIZES), world=4,
                    backend="gloo", timeout=120)
    grown = properties.read("all_reduce", 4, [r.value for r in got], SIZES, DTYPES)
    outcome, message, drift = judge(grown)
    assert outcome == "fail" and message.startswith("drift grew: all_reduce on 4 gloo ranks: "
                                                    "float32: max_ulp "), message
    assert "(largest distance in ULP) is above its envelope" in message, message
    assert drift[0]["judged"] == "grew" and "max_ulp" in drift[0]["grew"], drift


def _pids(folder: str, rank: int) -> None:
    Path(folder, f"pid{rank}").write_text(str(os.getpid()))


def _killed(rank: int, world: int, folder: str) -> None:
    import torch
    import torch.distributed as dist

    _pids(folder, rank)
    dist.barrier()
    if rank == 2:
        os.kill(os.getpid(), signal.SIGKILL)
    dist.all_reduce(torch.ones(4))
    dist.barrier()


def _raises(rank: int, world: int, folder: str) -> None:
    import torch.distributed as dist

    _pids(folder, rank)
    dist.barrier()
    if rank == 3:
        raise ValueError("rank 3's own error")
    dist.barrier()


def _hangs(rank: int, world: int, folder: str) -> None:
    import torch
    import torch.distributed as dist

    _pids(folder, rank)
    if rank == 1:
        time.sleep(600)
    dist.all_reduce(torch.ones(4))


def _left(folder: Path) -> list[int]:
    pids = [int(p.read_text()) for p in folder.glob("pid*")]
    assert len(pids) == 4, pids
    return [pid for pid in pids if psutil.pid_exists(pid)
            and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE]


@pytest.mark.parametrize(("body", "rank", "says"), [
    (_killed, 2, "rank 2 of 4 (gloo) was killed by SIGKILL"),
    (_raises, 3, "rank 3 of 4 (gloo) exited with status 1: ValueError: rank 3's own error"),
    (_hangs, 1, "rank 1 of 4 (gloo) hung: after 5 s it was at"),
])
def test_a_failed_rank_is_named_and_none_survives(body, rank: int, says: str,
                                                  tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(RankError) as caught:
        run_ranks(body, (str(tmp_path),), world=4, backend="gloo", timeout=5)
    assert caught.value.rank == rank
    assert str(caught.value).startswith(says), str(caught.value)
    if body is _hangs:  # the others are named where they waited: in the all-reduce
        assert "time.sleep" not in str(caught.value).splitlines()[0]
        assert "test_collectives.py" in str(caught.value).splitlines()[0]
        assert "waited at" in str(caught.value).splitlines()[0]
    assert _left(tmp_path) == []


class _Target:
    """A target whose switch sets what ``sets`` says (a fake of the *interface*, to drive
    the settings judge; the real targets run in the suite)."""

    name = "fake"

    def __init__(self, sets: dict[str, str]) -> None:
        self.sets = sets

    def declared(self):  # type: ignore[no-untyped-def]
        return load_declared("vllm_ascend", "0.23.0.post1")

    def device(self) -> None:
        return None

    def load(self) -> None:
        return None

    def set_switch(self, enabled: bool) -> None:
        os.environ.update(self.sets)


def test_the_ranks_start_with_exactly_what_the_switch_set(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    # the fake switches write the environment: a copy of it, so nothing leaks into the
    # tests after this one (an "off" case there would see HCCL_DETERMINISTIC set)
    monkeypatch.setattr(os, "environ", dict(os.environ))
    for name in ("HCCL_DETERMINISTIC", "LCCL_DETERMINISTIC", "NCCL_ALGO"):
        monkeypatch.delitem(os.environ, name, raising=False)
    good = settings.apply(_Target({"HCCL_DETERMINISTIC": "strict",
                                   "LCCL_DETERMINISTIC": "1"}), "switch")
    assert good.env == {"HCCL_DETERMINISTIC": "strict", "LCCL_DETERMINISTIC": "1"}
    assert settings.judge(good, "vllm-ascend 0.23.0.post1", [good.env] * 4) == []
    # a rank that saw something else at init: the check did not run what it claims
    seen = [good.env, good.env, {**good.env, "HCCL_DETERMINISTIC": None}, good.env]
    assert "rank 2 started its process group with" in settings.judge(good, "r", seen)[0]
    # a release that drops a declared setting, and one that sets an undeclared variable
    del os.environ["HCCL_DETERMINISTIC"], os.environ["LCCL_DETERMINISTIC"]
    bad = settings.apply(_Target({"LCCL_DETERMINISTIC": "1", "NCCL_ALGO": "ring"}), "switch")
    problems = settings.judge(bad, "vllm-ascend 0.23.0.post1", [bad.env] * 4)
    assert any(p.startswith("with the switch on, vllm-ascend 0.23.0.post1 did not set "
                            "HCCL_DETERMINISTIC=strict") and "batch_invariant.py:83" in p
               for p in problems), problems
    assert any("also set NCCL_ALGO=ring" in p for p in problems), problems
    # "none": every declared setting removed from the ranks
    assert settings.apply(_Target({}), "none").env == {"HCCL_DETERMINISTIC": None,
                                                       "LCCL_DETERMINISTIC": None}


def test_the_ranks_see_the_settings_at_init(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("LCCL_DETERMINISTIC", "0")  # inherited: must be removed
    got = run_ranks(_env_seen, (), world=4, backend="gloo",
                    env={"HCCL_DETERMINISTIC": "strict", "LCCL_DETERMINISTIC": None})
    assert [r.env_at_init for r in got] == [{"HCCL_DETERMINISTIC": "strict",
                                             "LCCL_DETERMINISTIC": None}] * 4
    assert [r.value for r in got] == [("strict", None)] * 4


def _env_seen(rank: int, world: int) -> tuple[str | None, str | None]:
    return os.environ.get("HCCL_DETERMINISTIC"), os.environ.get("LCCL_DETERMINISTIC")


def test_every_declared_collective_setting_names_its_library() -> None:
    import tomllib

    from harness.invariance.declared import DATA

    data = tomllib.loads(DATA.read_text())
    marked = [e for e in data["override"] if e.get("collective")]
    assert {e["collective"] for e in marked} <= {"hccl", "lccl", "nccl", "custom-allreduce"}
    assert all(e["kind"] == "env" for e in marked)
    names = {(e["target"], e["name"]) for e in marked}
    assert {("vllm_ascend", "HCCL_DETERMINISTIC"), ("vllm_ascend", "LCCL_DETERMINISTIC"),
            ("vllm", "NCCL_ALGO"), ("vllm", "NCCL_PROTO"), ("vllm", "NCCL_MAX_NCHANNELS"),
            ("reference", "HCCL_DETERMINISTIC")} <= names


def _case_with_a_killed_rank(folder: str) -> None:
    """Child: a check whose rank 2 is killed; the check's own process reports it."""
    run_ranks(_killed, (folder,), world=4, backend="gloo", timeout=30)


def test_a_killed_rank_fails_its_isolated_check_naming_the_rank(tmp_path: Path) -> None:
    from harness import run_isolated

    with pytest.raises(RankError) as caught:  # what the check's test shows, rebuilt whole
        run_isolated(_case_with_a_killed_rank, str(tmp_path), method="forkserver")
    assert caught.value.rank == 2
    assert str(caught.value).startswith("rank 2 of 4 (gloo) was killed by SIGKILL")
    assert _left(tmp_path) == []


def test_a_tensor_parallel_source_whose_workers_did_not_run_is_vacuous() -> None:
    """The engine's TP rows prove their ranks from the worker processes seen, not from the
    configuration: one worker for a 2-rank claim is vacuous."""
    from harness.logprobs.cases import _check_ranks
    from harness.logprobs.invariance_check import InvarianceReport

    class _Src:
        tp_workers = ["VLLM::Worker_TP0"]

    report = InvarianceReport("vllm-cpu", (1, 2), ("first",), 2, 8)
    _check_ranks("vllm-tp2", _Src(), report)
    assert report.vacuous.startswith("vllm-tp2 claims tensor parallel at 2 ranks, but 1 "
                                     "worker process(es) ran (VLLM::Worker_TP0)")
    both = InvarianceReport("vllm-cpu", (1, 2), ("first",), 2, 8)
    _Src.tp_workers = ["VLLM::Worker_TP0", "VLLM::Worker_TP1"]
    _check_ranks("vllm-tp2", _Src(), both)
    assert not both.vacuous and "[2 TP workers: VLLM::Worker_TP0, VLLM::Worker_TP1]" in \
        both.source
    plain = InvarianceReport("vllm-cpu", (1, 2), ("first",), 2, 8)
    _check_ranks("vllm", object(), plain)
    assert plain.source == "vllm-cpu" and not plain.vacuous
