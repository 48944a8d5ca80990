"""The event recorder under load: counted checks through pytest while busy processes hold
twice the machine's cores, once per recorder, side by side in one run.

    python bench/recorder_under_load.py [--checks 200] [--recorders record-function,kineto]

Each check is one isolated child (``run_on_npu(fn, events=["aten::mm"])``) that must count
exactly one ``aten::mm``. Printed per recorder: checks run, failed, crashed children (a
recorder that dies takes the child with it), the median check duration, the wall time, and
the load average the run saw.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

CHECKS = '''
import pytest
import torch


def _one_mm():
    a = torch.ones(8, 8)
    return float(torch.mm(a, a).sum())


@pytest.mark.parametrize("i", range({n}))
def test_counted(i, run_on_npu):
    res = run_on_npu(_one_mm, events=["aten::mm"])
    assert res.events == {{"aten::mm": 1}}, (res.events, res.recorder)
'''


def _burn(stop: multiprocessing.synchronize.Event) -> None:  # type: ignore[name-defined]
    x = 0
    while not stop.is_set():
        for _ in range(100_000):
            x += 1


def run(recorder: str, checks: int, tmp: Path) -> dict[str, object]:
    test = tmp / f"test_counted_{recorder.replace('-', '_')}.py"
    test.write_text(CHECKS.format(n=checks))
    results = tmp / f"{recorder}.jsonl"
    env = dict(os.environ, HARNESS_RECORDER=recorder)
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "pytest", str(test), "-q", "-p",
                           "no:cacheprovider", "--device", "cpu",
                           f"--harness-results={results}", "--rootdir", str(tmp)],
                          cwd=tmp, env=env, capture_output=True, text=True, check=False)
    wall = time.monotonic() - start
    records = [json.loads(line) for line in results.read_text().splitlines()]
    tests = [r for r in records if r["type"] == "test"]
    children = [c for r in tests for c in r.get("children") or []]
    return {"recorder": recorder, "checks": len(tests),
            "failed": sum(r["outcome"] != "passed" for r in tests),
            "crashed": sum(c.get("outcome") == "crashed" for c in children),
            "median_check_s": round(statistics.median(r["duration"] for r in tests), 4),
            "wall_s": round(wall, 1), "load_avg_1m": round(os.getloadavg()[0], 1),
            "recorders_seen": sorted({str(c.get("recorder")) for c in children}),
            "exit": proc.returncode}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checks", type=int, default=200)
    parser.add_argument("--recorders", default="record-function,kineto")
    args = parser.parse_args()
    stop = multiprocessing.Event()
    burners = [multiprocessing.Process(target=_burn, args=(stop,), daemon=True)
               for _ in range(2 * (os.cpu_count() or 1))]
    for b in burners:
        b.start()
    time.sleep(5)  # let the load average see them
    try:
        with tempfile.TemporaryDirectory() as tmp:
            rows = [run(r, args.checks, Path(tmp)) for r in args.recorders.split(",")]
    finally:
        stop.set()
        for b in burners:
            b.join(5)
    print(f"{len(burners)} busy processes on {os.cpu_count()} cores")
    for row in rows:
        print(json.dumps(row))
    return 0


if __name__ == "__main__":
    sys.exit(main())
