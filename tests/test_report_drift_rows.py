"""The report's trends and the bisect's signature read the drift record that decided a test,
never a merge of its rows (issue 66): a collectives case judges one row per dtype, and the
largest figure of one dtype beside the tightest bound of another would be neither's. Read
from a results file the suite really wrote."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from harness.report.load import JUDGED_ORDER, load_any

ROOT = Path(__file__).resolve().parent.parent
CASE = "suites/test_collectives.py::test_collective[reference-all_reduce-none]"


def test_a_test_s_figures_are_its_deciding_row_s_never_a_merge(tmp_path: Path) -> None:
    results = tmp_path / "results.jsonl"
    subprocess.run([sys.executable, "-m", "pytest", CASE, "-q", "-p", "no:cacheprovider",
                    f"--harness-results={results}"], cwd=ROOT, capture_output=True,
                   check=False)
    line = next(json.loads(x) for x in results.read_text().splitlines()
                if json.loads(x)["type"] == "test")
    records = [r for r in line.get("drift") or [] if isinstance(r, dict)]
    assert len(records) >= 2, line  # one row per dtype: the case that could be merged
    # the rows' sizes differ (gloo's bf16 max_abs is 16, its fp32 one 0.0005): a merge would
    # draw bf16's figure under fp32's bound
    assert len({json.dumps(r["figures"], sort_keys=True) for r in records}) > 1, records
    worst = min(records, key=lambda r: JUDGED_ORDER.index(r.get("judged", "none")))
    result = load_any(results).tests[CASE]
    numbers = {k: float(v) for k, v in worst["figures"].items()
               if isinstance(v, (int, float)) and not isinstance(v, bool)}
    assert {k: result.figures[k] for k in numbers} == numbers, (result.figures, worst)
    assert result.bounds == ({k: float(v) for k, v in worst["envelope"]["bounds"].items()}
                             if "envelope" in worst else None)
    assert result.judged == worst.get("judged")
    assert result.drift_row == "/".join(str(v) for v in worst["key"].values())
    assert worst["key"]["dtype"] in result.drift_row
