"""A drift has a size (issue 56): the envelope's bound, the data files, the judge by
envelope, and the reviewed adoption of new figures (``npu-regress expectations update``).

These run on figures alone; the controls on real stacks are in test_rl_consistency.py,
test_collectives.py and test_vllm_engine.py."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from harness.drift import adopt as adopt_mod
from harness.drift.envelope import GROWTH_CAP, Envelope, EnvelopeError, from_data
from harness.drift.table import load, with_envelope
from harness.logprobs import expectations
from harness.stack import identity
from tests.fixtures import nights

ROOT = Path(__file__).resolve().parent.parent


def _env(**figures: tuple[float, float]) -> Envelope:
    return Envelope(dict(figures), 5, "5 runs on this test's CPU")


@pytest.mark.parametrize("lo, hi", [(1, 1), (1, 2), (2, 2), (9.5e-7, 9.5e-7), (3e-3, 9e-3),
                                    (113, 159), (1, 30)])
def test_a_tenfold_growth_never_passes(lo: float, hi: float) -> None:
    counts = ("max_ulp",) if float(lo).is_integer() else ()  # a count is a whole number
    for name in (*counts, "max_abs"):
        env = _env(**{name: (lo, hi)})
        assert env.bound(name) >= hi  # every measured run is inside its own envelope
        assert not env.breaches({name: hi})
        assert env.breaches({name: GROWTH_CAP * lo}) or GROWTH_CAP * lo <= hi, (lo, hi)
        assert env.breaches({name: GROWTH_CAP * hi}), (lo, hi)


def test_a_count_keeps_one_unit_of_slack_and_a_zero_has_none() -> None:
    env = _env(max_ulp=(1, 1), max_abs=(0.0, 0.0), differing=(0, 0))
    assert env.bound("max_ulp") == 3 and env.bound("differing") == 1
    assert env.bound("max_abs") == 0.0
    assert [b.figure for b in env.breaches({"max_ulp": 4, "max_abs": 1e-9, "differing": 1})] \
        == ["max_ulp", "max_abs"]
    # figures the envelope does not hold are recorded, not judged
    assert env.breaches({"kl_max": 1e9}) == []


def test_a_tolerance_that_would_let_a_tenfold_drift_pass_is_refused() -> None:
    with pytest.raises(EnvelopeError, match="tolerance 12.0 is outside 1...9.0"):
        Envelope({"max_ulp": (1, 1)}, 5, "here", 12.0, "t.toml row x")
    with pytest.raises(EnvelopeError, match="figure 'speed' is not one the judge reads"):
        Envelope({"speed": (1, 1)}, 5, "here", where="t.toml row x")


def test_a_data_file_row_that_cannot_be_judged_is_named(tmp_path: Path) -> None:
    path = tmp_path / "t.toml"
    path.write_text('[[row]]\ncheck = "c"\noutcome = "differ"\nevidence = "e"\n'
                    '[row.envelope]\nruns = 5\nmeasured = "m"\nmax_ulp = [3, 1]\n')
    with pytest.raises(EnvelopeError, match=r"t.toml row c: figure max_ulp = \[3, 1\]"):
        load(path, ("check",))
    path.write_text('[[row]]\ncheck = "c"\noutcome = "maybe"\nevidence = "e"\n')
    with pytest.raises(EnvelopeError, match="outcome 'maybe': use one of equal, differ"):
        load(path, ("check",))
    path.write_text("[[row]\n")
    with pytest.raises(EnvelopeError, match="not TOML"):
        load(path, ("check",))


def test_the_shipped_data_files_load_and_write_back_unchanged() -> None:
    from harness.collectives import expected

    for table in (expectations.table(), expected.table()):
        assert table.rows
        assert table.dumps() == table.path.read_text(encoding="utf-8"), table.path


# --- the judge by envelope ------------------------------------------------------------

ROW = ("micro-batch", "training-right", "cpu", "x86_64", "float32", "off")


@pytest.fixture
def with_row(monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    """The logprob table with one row's envelope set to 1..2 ULP (max |diff| 9.5e-7)."""
    from harness.drift.table import Row

    table = load(expectations.DATA, expectations.KEY_FIELDS)
    table.put(Row(ROW, "differ", "measured prose",
                  (Envelope({"max_ulp": (1, 2), "max_abs": (4.8e-7, 9.5e-7),
                             "differing": (15, 18)}, 5, "5 runs, 2026-12-06, on a test CPU",
                            where="expectations.toml row " + "/".join(ROW),
                            runner=identity.runner("cpu")),)))
    monkeypatch.setattr(expectations, "table", lambda: table)
    return table


def _judge(figures: dict[str, float], equal: bool = False):  # type: ignore[no-untyped-def]
    return expectations.judge_drift("micro-batch", equal, 32, "training-right", "cpu",
                                    "float32", False, machine="x86_64", figures=figures)


def test_a_gap_grown_from_2_ulp_to_200_fails_naming_the_figure(with_row) -> None:  # type: ignore[no-untyped-def]
    inside = _judge({"max_ulp": 2, "max_abs": 9.5e-7, "differing": 17})
    assert inside.outcome == "passed", inside.why
    assert inside.why.startswith("the switch-off run differs (micro-batch) as expected, "
                                 "within its envelope (max_ulp 2, max_abs 9.5e-07, differing 17; bounds max_ulp 6")
    assert inside.drift["judged"] == "within" and inside.drift["envelope"]["bounds"][
        "max_ulp"] == 6
    grown = _judge({"max_ulp": 200, "max_abs": 9.5e-5, "differing": 17})
    assert grown.outcome == "failed"
    assert grown.why.startswith("drift grew: micro-batch of training-right float32 on cpu: "
                                "max_ulp 200 (largest distance in ULP) is above its envelope "
                                "1..2 (bound 6, 100 times its measured maximum); envelope "
                                "measured: 5 runs, 2026-12-06, on a test CPU"), grown.why
    assert "max_abs 9.5e-05" in grown.why and grown.drift["grew"] == ["max_ulp", "max_abs"]
    # a switch-off row that became equal is stale, as before
    stale = _judge({}, equal=True)
    assert stale.outcome == "failed" and "inverse control found no difference" in stale.why
    assert stale.drift["judged"] == "stale"


def test_the_judge_fails_closed_on_a_figure_it_cannot_read(with_row) -> None:  # type: ignore[no-untyped-def]
    """Issue 66: a judged figure missing (a renamed upstream metric), NaN, infinite (a shape
    mismatch) or negative, or no figure at all, is never within: the row fails as ours,
    naming the figure."""
    full = {"max_ulp": 2, "max_abs": 9.5e-7, "differing": 17}
    assert _judge(full).outcome == "passed"
    for figures, said in (({"max_ulp": 2, "differing": 17}, "max_abs is missing"),
                          ({**full, "max_abs": float("nan")}, "max_abs is NaN"),
                          ({**full, "max_abs": float("inf")}, "max_abs is infinite"),
                          ({**full, "max_ulp": -1}, "max_ulp is negative (-1)"),
                          ({**full, "max_ulp": None}, "max_ulp is not a number (None)"),
                          ({}, "max_ulp is missing; max_abs is missing; differing is "
                               "missing")):
        found = _judge(figures)
        assert found.outcome == "failed" and found.why.startswith(
            "harness: micro-batch of training-right float32 on cpu (row micro-batch/"
            "training-right/cpu/x86_64/float32/off): cannot be judged against its "
            f"envelope, {said}"), found.why
        assert found.drift["judged"] == "unjudgeable", found.drift
    # a figure that grew beside one that is missing: the release's drift, the loss said too
    both = _judge({"max_ulp": 200, "differing": 17})
    assert both.outcome == "failed" and both.why.startswith("drift grew: ")
    assert both.why.endswith("; not judged: max_abs is missing"), both.why


def test_a_count_s_bound_never_reaches_its_total() -> None:
    """Issue 66: 22 of 42 cases measured; 3x (66) would be past the 42 compared, so the
    bound is the largest measured plus one, and the record says so. An exact count (greedy
    tokens changed) measured as 0 fails on the first."""
    envelope = Envelope({"differing": (20, 22), "tokens_changed": (0, 0)}, 5, "test")
    record: dict = {}
    assert envelope.judge({"differing": 23, "tokens_changed": 0,
                           "totals": {"differing": 42}}, record) == []
    assert record["envelope"]["bounds"]["differing"] == 23
    assert "the largest measured count plus one" in record["envelope"]["capped"]["differing"]
    [grew] = envelope.judge({"differing": 24, "tokens_changed": 0,
                             "totals": {"differing": 42}}, {})
    assert (grew.figure, grew.bound) == ("differing", 23)
    # without a total, the old bound (3x)
    assert envelope.judge({"differing": 60, "tokens_changed": 0}, {}) == []
    [flip] = envelope.judge({"differing": 20, "tokens_changed": 1,
                             "totals": {"differing": 42}}, {})
    assert (flip.figure, flip.value, flip.bound) == ("tokens_changed", 1, 0)


def test_an_envelope_of_no_figure_or_of_infinity_is_refused() -> None:
    with pytest.raises(EnvelopeError, match="an envelope with no figure judges nothing"):
        Envelope({}, 5, "test")
    with pytest.raises(EnvelopeError, match=r"figure max_abs = \[0.1, inf\]"):
        Envelope({"max_abs": (0.1, float("inf"))}, 5, "test")


def test_a_row_without_an_envelope_records_and_says_so() -> None:
    found = expectations.judge_drift("batch-size", False, 18, "tiny", "cpu", "float32", False,
                                     machine="aarch64", figures={"max_ulp": 7})
    assert found.outcome == "xfailed" and found.why.startswith(
        "no envelope: batch-size of tiny float32 on cpu differs (max_ulp 7)")
    assert "npu-regress expectations update" in found.why
    assert found.drift == {"table": "logprobs", "row": "record", "figures": {"max_ulp": 7},
                           "judged": "no-envelope", "runner": identity.runner("cpu"),
                           "key": {"check": "batch-size", "source": "tiny", "device": "cpu",
                                   "machine": "aarch64", "dtype": "float32", "switch": "off"}}


# --- adopting figures: the reviewed act ---------------------------------------------------

def _results(path: Path, tests: list[dict], cpu: str = "Test CPU (x86_64)") -> Path:
    """A night of ``tests`` (each ``id``, ``outcome`` and fields) cut from a real one
    (tests/fixtures/nights.py), on a CPU named ``cpu``."""
    records = [nights.result(t["id"], t["outcome"], **{k: v for k, v in t.items()
                                                        if k not in ("id", "outcome")})
               for t in tests]
    return nights.write(path, [nights.header("cpu", "2026-12-06", cpu=cpu), *records,
                               nights.footer()])


def _drift(judged: str, **figures: float) -> dict:
    return {"table": "logprobs", "row": "differ", "judged": judged, "figures": figures,
            "key": dict(zip(expectations.KEY_FIELDS, ROW, strict=True)), "runner": RUNNER}


#: the runner of the hand-made records and the pytest runs below (a test CPU, 2 threads)
RUNNER = {"device": "cpu", "arch": "x86_64", "vendor": "TestVendor", "features": "avx2",
          "threads": "2"}


@pytest.fixture
def as_runner(monkeypatch: pytest.MonkeyPatch) -> None:
    """The pytest runs of this test are RUNNER's (the documented override)."""
    monkeypatch.setenv(identity.OVERRIDE_ENV, ",".join(f"{k}={v}" for k, v in RUNNER.items()))


def _copy_tables(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict:
    from harness.cli import _expectation_tables
    from harness.collectives import expected

    log, coll = tmp_path / "expectations.toml", tmp_path / "expected.toml"
    shutil.copy(expectations.DATA, log)
    shutil.copy(expected.DATA, coll)
    monkeypatch.setattr(expectations, "DATA", log)
    monkeypatch.setattr(expected, "DATA", coll)
    return _expectation_tables()


def test_update_adopts_the_spread_of_the_runs_and_refuses_other_failures(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tables = _copy_tables(tmp_path, monkeypatch)
    runs = [_results(tmp_path / f"r{i}.jsonl", [
        {"id": "a", "outcome": "xfailed", "drift": [_drift("no-envelope", max_ulp=u,
                                                            max_abs=u * 4.8e-7)]},
        {"id": "b", "outcome": "failed", "category": "harness",
         "drift": [_drift("no-envelope", max_ulp=999)]},
        {"id": "c", "outcome": "failed", "drift": [_drift("stale")]},
    ]) for i, u in enumerate((1, 2, 2, 1, 2))]
    done = adopt_mod.adopt(runs, tables)
    assert done.written == [("logprobs", ROW, 5)] and done.notes == []
    row = tables["logprobs"].get(ROW)
    envelope = row.envelope_for(RUNNER)[0]
    assert envelope.figures == {"max_abs": (4.8e-7, 9.6e-7), "max_ulp": (1, 2)}
    # the real night's packages, as its header names them
    assert envelope.measured.startswith("5 runs, 2026-12-06, on Test CPU (x86_64) (cpu; "
                                        "torch 2.13.0+cpu, verl 0.9.1, vllm ")
    assert envelope.measured.endswith(", 2 torch threads)")
    assert envelope.runner == RUNNER
    # the row's other runners' envelopes are kept beside it
    assert len(row.envelopes) > 1
    assert row.outcome == "differ" and row.evidence.startswith("measured on the CI CPU")
    assert sum("test failed for another reason than a drift (harness)" in r
               for r in done.refused) == 5
    assert sum("stale" in r for r in done.refused) == 5


def test_update_never_adopts_an_infinite_or_nan_figure(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 66: a shape mismatch gives max_abs = inf; adopted once, [inf, inf] could never
    fail again. The run is refused, naming the figure; the finite runs are adopted."""
    tables = _copy_tables(tmp_path, monkeypatch)
    runs = [_results(tmp_path / f"r{i}.jsonl", [
        {"id": "a", "outcome": "xfailed", "drift": [_drift("no-envelope", max_ulp=2,
                                                            max_abs=value)]}])
        for i, value in enumerate((9.5e-7, float("inf"), float("nan"), 9.6e-7, 9.5e-7))]
    done = adopt_mod.adopt(runs, tables)
    assert done.written == [("logprobs", ROW, 3)], done
    assert tables["logprobs"].get(ROW).envelope_for(RUNNER)[0].figures["max_abs"] == \
        (9.5e-7, 9.6e-7)
    assert [r.split(": ", 2)[2] for r in done.refused] == [
        "not adopted: max_abs is infinite", "not adopted: max_abs is NaN"], done.refused



def test_a_recorded_only_figure_is_kept_shown_and_never_judged(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A row whose count of differing values follows a non-reproducible schedule (HTTP
    arrivals) judges the size of a value's drift only; adopting new runs keeps that."""
    envelope = Envelope({"differing": (1, 1), "mean_abs": (1.5e-8, 1.5e-8), "max_ulp": (1, 1)},
                        1, "1 run", recorded_only=("differing", "mean_abs"))
    assert envelope.breaches({"differing": 5, "mean_abs": 7.5e-8, "max_ulp": 1}) == []
    assert [b.figure for b in envelope.breaches({"differing": 5, "max_ulp": 30})] == ["max_ulp"]
    assert "differing" not in envelope.to_record()["bounds"]
    with pytest.raises(EnvelopeError, match="recorded_only"):
        from_data({"runs": 1, "max_ulp": [1, 1], "recorded_only": ["nonsense"]}, "row x")
    tables = _copy_tables(tmp_path, monkeypatch)
    table = tables["logprobs"]
    table.put(with_envelope(table.get(ROW), Envelope({"max_ulp": (1, 1)}, 1, "1 run",
                                                     recorded_only=("mean_abs",),
                                                     runner=RUNNER)))
    runs = [_results(tmp_path / f"r{i}.jsonl", [
        {"id": "a", "outcome": "xfailed", "drift": [_drift("no-envelope", max_ulp=u,
                                                            mean_abs=u * 1e-8)]}])
        for i, u in enumerate((1, 2))]
    adopt_mod.adopt(runs, tables)
    assert table.get(ROW).envelope_for(RUNNER)[0].recorded_only == ("mean_abs",)
    assert "recorded_only = [" in table.dumps()

def test_update_through_the_command_line_prints_a_diff_and_check_writes_nothing(
        tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    shutil.copytree(ROOT / "harness", tree / "harness",
                    ignore=shutil.ignore_patterns("__pycache__"))
    result = _results(tmp_path / "r.jsonl", [
        {"id": "a", "outcome": "failed", "category": "drift-grew",
         "drift": [_drift("grew", max_ulp=200)]}])
    before = (tree / "harness/logprobs/expectations.toml").read_text()

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        # this project's own tables, from a checkout; a grown run, accepted
        return subprocess.run([sys.executable, "-m", "harness", "expectations", "update",
                               *args, "--package-tables", "--min-runs", "1",
                               "--accept-growth", "a test's growth"], cwd=tree,
                              capture_output=True, text=True,
                              env={"PYTHONPATH": str(tree), "PATH": "/usr/bin:/bin"})

    checked = cli(str(result), "--check")
    assert checked.returncode == 1, checked.stderr
    assert "+max_ulp = [" in checked.stdout and "200," in checked.stdout, checked.stdout
    assert (tree / "harness/logprobs/expectations.toml").read_text() == before
    assert "measured over 1 run(s); docs/drift.md asks for 5" in checked.stderr
    written = cli(str(result))
    assert written.returncode == 0 and ": review the diff" in written.stderr
    assert (tree / "harness/logprobs/expectations.toml").read_text() != before
    bad = cli(str(tmp_path / "missing.jsonl"))
    assert bad.returncode == 2 and "missing.jsonl: no such results file" in bad.stderr
    # a line that cannot be read is named and counted as the report names it, and the
    # file is not adopted (never an envelope from part of a night)
    cut = tmp_path / "cut.jsonl"
    cut.write_text(result.read_text() + '{"type": "test", "id": "b", "outc\n')
    bad = cli(str(cut))
    assert bad.returncode == 2 and "cut.jsonl: 1 line(s) could not be read (cut.jsonl:" \
        in bad.stderr and "not readable" in bad.stderr, bad.stderr


DRIFT_TEST = '''
import pytest
from harness.logprobs.expectations import judge_drift

ROW = ("micro-batch", "training-right", "cpu", "x86_64", "float32", "off")

def test_grown(record_property):
    found = judge_drift("micro-batch", False, 32, "training-right", "cpu", "float32", False,
                        machine="x86_64", figures={"max_ulp": 5000, "max_abs": 2e-3})
    record_property("drift", [found.drift])
    assert found.outcome == "failed"
    pytest.fail(found.why, pytrace=False)
'''


def _baselines(folder: Path) -> Path:
    """A user's baselines folder holding ROW measured on RUNNER: 2..2 ULP, max |diff|
    4.8e-7..9.5e-7 (what the shipped table's row says, whatever CPU runs this test)."""
    from harness.drift.table import Row, Table

    table = Table(folder / "logprobs.toml", expectations.KEY_FIELDS, {})
    table.put(Row(ROW, "differ", "a test's row", (Envelope(
        {"max_ulp": (2, 2), "max_abs": (4.8e-7, 9.5e-7)}, 5, "5 runs on a test CPU",
        runner=RUNNER),)))
    table.write()
    return folder


def _one_failed_line(pytester: pytest.Pytester, source: str) -> dict:
    """Run ``source`` as a test file through pytest and the plugin, as RUNNER, judged by
    ``_baselines``: its one failed test's line of the results file."""
    pytester.makepyfile(test_d=source)
    results = pytester.path / "results.jsonl"
    run = pytester.runpytest_subprocess(f"--harness-results={results}",
                                        f"--harness-baselines={_baselines(pytester.path / 'b')}")
    run.assert_outcomes(failed=1)
    return next(json.loads(x) for x in results.read_text().splitlines()
                if json.loads(x)["type"] == "test")


def test_a_drift_that_grew_is_filed_as_drift_grew_with_its_record(
        pytester: pytest.Pytester, as_runner: None) -> None:
    """Through pytest and the plugin: the failure's category is "drift-grew" where a drift
    record says the drift grew, and the results line carries the record (figures, envelope,
    how judged) for the report's trends and for expectations update."""
    line = _one_failed_line(pytester, DRIFT_TEST)
    record = line["drift"][0]
    assert record["key"]["source"] == "training-right" and record["figures"]["max_ulp"] == 5000
    assert record["judged"] == "grew" and record["envelope"]["runs"] >= 5, record
    assert line["category"] == "drift-grew", line
    assert line["verdict"]["reason"].startswith(
        "drift grew: micro-batch/training-right/cpu/x86_64/float32/off: max_ulp"), line
    assert "drift grew: micro-batch of training-right float32 on cpu: max_ulp 5000 " \
        "(largest distance in ULP) is above its envelope 2..2" in line["longrepr"], line


LOST_TEST = '''
import pytest
from harness.logprobs.expectations import judge_drift

def test_lost(record_property):
    # verl's figures gone (its helper renamed upstream): what the rollout row judges is absent
    found = judge_drift("micro-batch", False, 32, "training-right", "cpu", "float32", False,
                        machine="x86_64", figures={"max_ulp": 2, "differing": 17})
    record_property("drift", [found.drift])
    assert found.outcome == "failed"
    pytest.fail(found.why, pytrace=False)
'''


def test_a_lost_figure_is_filed_as_ours_through_pytest(pytester: pytest.Pytester, as_runner: None) -> None:
    """Issue 66, through pytest and the plugin: the category comes from the check's drift
    record (judged "unjudgeable"), "harness", naming the figure; never "drift grew", never
    a pass."""
    line = _one_failed_line(pytester, LOST_TEST)
    assert line["drift"][0]["judged"] == "unjudgeable", line["drift"]
    assert line["category"] == "harness", line
    assert line["verdict"]["reason"].startswith(
        "a judged figure could not be read: micro-batch/training-right/cpu/x86_64/float32/off: "
        "max_abs is missing"), line["verdict"]


def test_adoption_refuses_a_grown_run_unless_accepted_and_keeps_the_reason(
        pytester: pytest.Pytester, tmp_path: Path, as_runner: None) -> None:
    """Issue 66: ``update`` on a results file the plugin wrote for a row that grew (2 ULP to
    5000): refused, naming the figure and the way out; with --accept-growth the row is
    written into the user's baselines folder (never the package), with the reason and the
    envelope it replaced in its history, and the figures' old and new ranges said. Fewer runs
    than --min-runs, or runs of two runners, are never one envelope."""
    pytester.makepyfile(test_d=DRIFT_TEST)
    results = pytester.path / "results.jsonl"
    base = _baselines(tmp_path / "repo" / "baselines")
    before = (base / "logprobs.toml").read_text()
    pytester.runpytest_subprocess(f"--harness-results={results}",
                                  f"--harness-baselines={base}").assert_outcomes(failed=1)
    shipped = expectations.DATA.read_text()

    def cli(*args: str, runs: tuple[Path, ...] = (results,)) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "harness", "expectations", "update",
                               *map(str, runs), "--baselines", str(base), *args], cwd=tmp_path,
                              capture_output=True, text=True, check=False)

    refused = cli("--min-runs", "1")
    assert refused.returncode == 0, refused.stderr
    assert (base / "logprobs.toml").read_text() == before
    assert "not adopted: its row grew (max_ulp, max_abs above its bound)" in refused.stderr, \
        refused.stderr
    assert "--accept-growth" in refused.stderr and "nothing changed" in refused.stderr
    few = cli("--accept-growth", "torch 2.14 reorders the reduction")
    assert "not written: measured over 1 run(s), --min-runs asks for 5" in few.stderr
    assert (base / "logprobs.toml").read_text() == before
    accepted = cli("--min-runs", "1", "--accept-growth", "torch 2.14 reorders the reduction")
    assert accepted.returncode == 0, accepted.stderr
    assert "max_ulp: 2..2 -> 5000..5000 (x2.5e+03)" in accepted.stderr, accepted.stderr
    written = (base / "logprobs.toml").read_text()
    assert 'accepted_growth = "torch 2.14 reorders the reduction"' in written, written
    assert "[[row.history]]" in written and "max_ulp = [" in written
    assert expectations.DATA.read_text() == shipped  # the package's table is untouched
    # another runner's run (its threads) never joins this runner's envelope: each runner's
    # runs make its own, and a record that names no runner is refused
    lines = [json.loads(x) for x in results.read_text().splitlines()]
    for line in lines:
        for record in line.get("drift") or ():
            record["runner"] = {**record["runner"], "threads": "1"}
    other = pytester.path / "other.jsonl"
    other.write_text("".join(json.dumps(x) + "\n" for x in lines))
    for record in (r for x in lines for r in x.get("drift") or ()):
        del record["runner"]
    unnamed = pytester.path / "unnamed.jsonl"
    unnamed.write_text("".join(json.dumps(x) + "\n" for x in lines))
    mixed = cli("--min-runs", "2", "--accept-growth", "x", "--check",
                runs=(results, other, unnamed))
    assert mixed.stderr.count("not written: measured over 1 run(s), --min-runs asks for 2") \
        == 2, mixed.stderr
    assert "2 threads: not written" in mixed.stderr and "1 threads: not written" in \
        mixed.stderr, mixed.stderr
    assert "the record names no runner" in mixed.stderr, mixed.stderr
