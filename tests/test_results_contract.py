"""The results file's contract (issue 67): one typed module (``harness.report.schema``)
that the plugin writes and every reader reads, the JSON Schema the docs point to generated
from it (and checked for staleness), and files the plugin really wrote valid against it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from harness.report import schema

ROOT = Path(__file__).resolve().parent.parent


def invalid_lines(path: Path) -> list[str]:
    """Each line of the results file ``path`` that the generated schema refuses, named."""
    from tests.fixtures.nights import schema_errors

    found = []
    for number, text in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        errors = schema_errors(json.loads(text))
        if errors:
            found.append(f"{path.name}:{number}: {errors[0]}")
    return found


def test_the_schema_file_is_generated_from_the_contract() -> None:
    """docs/results.schema.json is ``python -m harness.report.schema``'s output: a field
    added to the contract without regenerating it fails here."""
    generated = subprocess.run([sys.executable, "-m", "harness.report.schema"], cwd=ROOT,
                               capture_output=True, text=True, check=True).stdout
    assert (ROOT / schema.SCHEMA_FILE).read_text() == generated, (
        f"{schema.SCHEMA_FILE} is stale: python -m harness.report.schema > "
        f"{schema.SCHEMA_FILE}")


DRIFT = '''
import pytest
from harness.logprobs.expectations import judge_drift
from harness.plugin.verdicts import file_as

def test_recorded(record_property):
    found = judge_drift("batch-size", False, 18, "tiny", "cpu", "float32", False,
                        machine="riscv64", figures={"max_ulp": 7, "totals": {"max_ulp": 18}})
    record_property("drift", [found.drift])
    pytest.xfail(found.why)

def test_vacuous(record_property):
    file_as(record_property, "vacuous", "vacuous: no shared step")
    pytest.fail("vacuous: no shared step", pytrace=False)

def test_skipped():
    pytest.skip("no NPU")
'''


def test_a_file_the_plugin_wrote_is_valid_and_a_broken_line_is_not(
        pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_c=DRIFT)
    results = pytester.path / "results.jsonl"
    pytester.runpytest_subprocess(f"--harness-results={results}").assert_outcomes(
        failed=1, skipped=1, xfailed=1)
    lines = [json.loads(x) for x in results.read_text().splitlines()]
    assert {x["type"] for x in lines} == set(schema.LINE_TYPES)
    assert invalid_lines(results) == []
    [drift] = next(x for x in lines if x.get("id", "").endswith("test_recorded"))["drift"]
    assert set(drift) <= set(schema.DriftRecord.__annotations__), drift
    header = lines[0]
    assert all(set(entry) <= set(schema.ManifestEntry.__annotations__)
               for entry in header["manifest"].values()), header["manifest"]
    # the control: an outcome or a category the contract does not know is refused
    broken = pytester.path / "broken.jsonl"
    test_line = next(x for x in lines if x["type"] == "test")
    broken.write_text(json.dumps({**test_line, "outcome": "probably-passed"}) + "\n"
                      + json.dumps({**test_line, "category": "greenish"}) + "\n")
    assert len(invalid_lines(broken)) == 2


def test_the_fixture_nights_are_real_current_and_valid() -> None:
    """The nights the readers' unit tests read (tests/fixtures/night-*.jsonl) are files the
    plugin wrote on a real run of the suites, under the contract as it is now: a contract
    changed since fails here, naming the command that writes them again."""
    from tests.fixtures import make_nights

    for name in make_nights.NIGHTS:
        night = make_nights.night_path(name)
        assert night.is_file(), f"{night} is missing: python tests/fixtures/make_nights.py"
        recorded = make_nights.digest_path(name).read_text().strip()
        assert recorded == make_nights.schema_digest(), (
            f"{night.name} was written under another results contract: "
            f"python tests/fixtures/make_nights.py {name}")
        assert invalid_lines(night) == []
        lines = [json.loads(x) for x in night.read_text().splitlines()]
        # a real run: the plugin's header (its manifest read from the installed stack) and
        # its footer, and the suite's own test ids
        assert lines[0]["type"] == "header" and lines[0]["manifest"]["torch"]["version"]
        assert lines[-1]["type"] == "footer"
        assert all(x["id"].startswith("suites/") for x in lines if x["type"] == "test")


def test_a_line_cut_from_a_real_night_is_checked_and_a_wrong_one_refused(
        tmp_path: Path) -> None:
    """The readers' unit tests write their lines through tests/fixtures/nights.py: a line
    the plugin could not write (an outcome, a category or a manifest entry outside the
    contract) is refused before any reader sees it; one marked Unchecked is written as
    given (the tests of unreadable input)."""
    from tests.fixtures import nights

    good = nights.write(tmp_path / "good.jsonl", [
        nights.header("a3", "2026-12-01", npu=True), nights.result("t::a", "failed"),
        nights.footer()])
    assert invalid_lines(good) == []
    footer = json.loads(good.read_text().splitlines()[-1])
    assert (footer["collected"], footer["counts"]) == (1, {"failed": 1})
    for wrong in (nights.result("t::a", "exploded"),
                  nights.result("t::a", "failed", category="the-weather"),
                  nights.header("a3", "2026-12-01", manifest={"vllm": "0.24.0"})):
        with pytest.raises(AssertionError, match="a line the plugin could not write"):
            nights.write(tmp_path / "bad.jsonl", [wrong])
    kept = nights.write(tmp_path / "hostile.jsonl",
                        [nights.Unchecked(nights.result("t::a", "exploded"))])
    assert len(invalid_lines(kept)) == 1
