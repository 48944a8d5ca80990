"""A runner's identity (issue 66): envelopes are keyed by what chooses the kernels, matched
exactly, and a runner of another identity is told which envelope is nearest and what
differs, never judged by it."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.drift.envelope import Envelope
from harness.drift.table import Row, Table, load
from harness.logprobs import expectations
from harness.stack import identity

A2 = {"device": "npu", "soc": "Ascend910B3 (222)", "cann": "8.3.RC1", "driver": "25.2.0",
      "torch_npu": "2.8.0", "threads": "8"}
ROW = ("batch-size", "tiny", "npu", "aarch64", "float32", "off")


def test_this_cpu_is_read_from_its_own_flags() -> None:
    here = identity.runner("cpu", 3)
    assert here["device"] == "cpu" and here["threads"] == "3"
    assert here["arch"] and here["vendor"] and here["features"]
    for feature in here["features"].split():
        assert feature in identity.CPU_FEATURES
    assert identity.matches(here, dict(here))


def test_the_accelerator_fields_come_from_what_the_session_detected() -> None:
    npu = {"hardware": "A2", "soc_name": "Ascend910B3", "soc_version": 222,
           "cann_version": "8.3.RC1", "driver_version": "25.2.0"}
    assert identity.accelerator_fields("npu", npu, {"torch_npu_version": "2.8.0"}) == {
        "soc": "Ascend910B3 (222)", "cann": "8.3.RC1", "driver": "25.2.0", "torch_npu": "2.8.0"}
    cuda = {"accelerator": {"name": "NVIDIA H100 80GB HBM3", "capability": "9.0",
                            "cuda": "12.8"}}
    assert identity.accelerator_fields("cuda", None, cuda) == {
        "name": "NVIDIA H100 80GB HBM3", "capability": "9.0", "cuda": "12.8"}
    # a field the detection could not read is unknown, and unknown matches nothing
    lost = identity.accelerator_fields("npu", {"soc_name": "Ascend910B3"}, {})
    assert lost["cann"] == "unknown"
    assert not identity.matches({**A2, "cann": "unknown"}, {**A2, "cann": "unknown"})


def test_published_fields_reach_the_runner_and_the_override_replaces_them(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(identity.PUBLISHED_ENV, "")  # restored after the test
    identity.publish("npu", {k: v for k, v in A2.items() if k not in ("device", "threads")})
    assert identity.runner("npu", 8) == A2
    # published for another kind: nothing is guessed, every field unknown
    assert identity.runner("cuda", 1)["name"] == "unknown"
    monkeypatch.setenv(identity.OVERRIDE_ENV, "cann=8.2.RC1, threads=4")
    assert identity.runner("npu", 8) == {**A2, "cann": "8.2.RC1", "threads": "4"}
    monkeypatch.setenv(identity.OVERRIDE_ENV, "cann")
    with pytest.raises(ValueError, match="'cann' is not field=value"):
        identity.runner("npu")


def _row(*runners: dict[str, str]) -> Row:
    return Row(ROW, "differ", "e", tuple(
        Envelope({"max_ulp": (n + 1, n + 1)}, 5, f"measured {n}", runner=runner)
        for n, runner in enumerate(runners)))


def test_an_envelope_judges_its_own_runner_only_and_the_others_are_told_the_nearest() -> None:
    a3 = {**A2, "soc": "Ascend910_9391 (250)"}
    row = _row(A2, a3)
    assert row.envelope_for(A2)[0].measured == "measured 0"
    assert row.envelope_for(a3)[0].measured == "measured 1"
    envelope, why = row.envelope_for({**A2, "cann": "8.5.0", "threads": "16"})
    assert envelope is None
    assert why.startswith("no envelope for this runner (npu Ascend910B3 (222) cann 8.5.0 "
                          "driver 25.2.0 torch_npu 2.8.0 16 threads): the nearest, measured on "
                          "npu Ascend910B3 (222) cann 8.3.RC1"), why
    assert why.endswith("differs in cann 8.3.RC1 (the envelope's) vs 8.5.0 (this runner's); "
                        "threads 8 (the envelope's) vs 16 (this runner's)"), why
    # an envelope that names no runner (an older file) judges none
    assert _row({}).envelope_for(A2) == (None, "no envelope for this runner (npu Ascend910B3 "
                                                "(222) cann 8.3.RC1 driver 25.2.0 torch_npu "
                                                "2.8.0 8 threads): the nearest, measured on no "
                                                "runner named (measured before envelopes were "
                                                "keyed by their runner), differs in it names no "
                                                "runner")


def test_a_table_keeps_one_envelope_a_runner_and_reads_an_older_single_one(
        tmp_path: Path) -> None:
    path = tmp_path / "t.toml"
    table = Table(path, expectations.KEY_FIELDS, {})
    table.put(_row(A2, {**A2, "threads": "1"}))
    table.write()
    again = load(path, expectations.KEY_FIELDS)
    assert again.dumps() == path.read_text()
    assert [e.runner["threads"] for e in again.get(ROW).envelopes] == ["8", "1"]
    path.write_text(path.read_text().replace('threads = "1"', 'threads = "8"'))
    with pytest.raises(ValueError, match="two envelopes of one runner; keep one"):
        load(path, expectations.KEY_FIELDS)
    path.write_text('[[row]]\ncheck = "c"\nsource = "s"\ndevice = "npu"\nmachine = "m"\n'
                    'dtype = "d"\nswitch = "off"\noutcome = "differ"\nevidence = "e"\n'
                    '[row.envelope]\nruns = 5\nmeasured = "m"\nmax_ulp = [1, 1]\n')
    [row] = load(path, expectations.KEY_FIELDS).rows.values()
    assert row.envelopes[0].runner == {} and row.envelope_for(A2)[0] is None


def test_the_judge_on_another_runner_says_no_envelope_naming_what_differs(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """An Ascend row measured on CANN 8.3 judges CANN 8.3 only: on 8.5 the same figures are
    recorded ("no envelope for this runner", an XFAIL), never judged within or grown."""
    table = Table(expectations.DATA, expectations.KEY_FIELDS, {})
    table.put(_row(A2))
    monkeypatch.setattr(expectations, "table", lambda: table)
    monkeypatch.setenv(identity.PUBLISHED_ENV, "")  # restored after the test
    identity.publish("npu", {k: v for k, v in A2.items() if k not in ("device", "threads")})

    def judge(**override: str):  # type: ignore[no-untyped-def]
        monkeypatch.setenv(identity.OVERRIDE_ENV, ",".join(f"{k}={v}"
                                                           for k, v in override.items()))
        return expectations.judge_drift("batch-size", False, 42, "tiny", "npu", "float32",
                                        False, machine="aarch64", threads=8,
                                        figures={"max_ulp": 100})

    same = judge()
    assert same.outcome == "failed" and same.why.startswith("drift grew"), same.why
    assert same.drift["runner"] == A2
    other = judge(cann="8.5.0")
    assert other.outcome == "xfailed" and other.drift["judged"] == "no-envelope", other
    assert "differs in cann 8.3.RC1 (the envelope's) vs 8.5.0 (this runner's)" in other.why
    assert other.drift["runner"]["cann"] == "8.5.0"
