"""Render time, peak memory and page size of the nightly report for 10,000, 100,000 and
1,000,000 result lines, side by side.

    python bench/report.py [--lines 10000,100000,1000000] [--nights 0,3] [--chromium]
                           [--realistic]

Each size is one results file of distinct tests (1% failing, 5% skipped, the rest passing)
rendered by the report CLI in a fresh process; peak memory is that process's own maximum
resident set. ``--nights K`` also gives it a history of K earlier nights of the same tests
(so K+1 times the lines, the same distinct tests): memory should follow the tests, not the
lines. ``--chromium`` also times headless Chromium loading and dumping the page (the
target: under 10 s for 1,000,000 lines).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def write_results(path: Path, n: int, day: int = 30) -> None:
    """``n`` tests on 2026-11-``day``; each earlier night fails a slightly different 1%."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as out:
        out.write(json.dumps({"type": "header", "runner": "bench", "start":
                              f"2026-11-{day:02d}T00:00:00+00:00"}) + "\n")
        for i in range(n):
            outcome = "failed" if (i + 30 - day) % 100 == 0 else "skipped" if i % 20 == 1 \
                else "passed"
            record = {"type": "test", "id": f"suites/test_family_{i % 7}.py::test_case[{i}]",
                      "outcome": outcome, "duration": 0.01}
            if outcome == "failed":
                record["longrepr"] = f"AssertionError: case {i} differs"
            if outcome == "skipped":
                record["reason"] = f"needs hardware {i % 3}"
            out.write(json.dumps(record) + "\n")
        out.write(json.dumps({"type": "footer", "exitstatus": 1, "duration": 1.0}) + "\n")


def write_realistic(path: Path, n: int, day: int = 30) -> None:
    """``n`` tests written as the harness writes them (``harness.report.schema.line``:
    every field, a child record with its output tails, dispatch events), about 590 bytes
    a line: 1,000,000 lines make a file of about 590 MB."""
    from harness.report.schema import line as results_line

    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as out:
        out.write(results_line({"type": "header", "runner": "bench", "start":
                                f"2026-11-{day:02d}T00:00:00+00:00", "schema": 1}))
        for i in range(n):
            outcome = "failed" if i % 100 == 0 else "skipped" if i % 20 == 1 else "passed"
            record = {
                "type": "test", "outcome": outcome, "when": "call", "duration": 0.0123,
                "id": f"suites/test_batch_invariant_switch.py::test_switch[vllm_ascend-"
                      f"case{i}-enabled]",
                "device": "npu", "hardware": "A3", "isolation": "forkserver",
                "dispatch_events": {"batch_invariant_ops::npu_mm_batch_invariant": 3,
                                    "aten::mm": 0},
                "logprob_report": None, "dispatcher_footprint": None, "patch_guard": None,
                "category": None, "release_finding": None, "upstream_drift": None,
                "children": [{"pid": 100000 + i, "method": "forkserver", "outcome": "returned",
                              "exitcode": 0, "signal": None, "summary": "returned",
                              "duration": 0.0101, "stdout_tail": "",
                              "stderr_tail": "W1130 01:02:03 npu warning: op fallback\n",
                              "notes": []}]}
            if outcome == "failed":
                record["longrepr"] = f"E   AssertionError: case {i} differs\n" * 3
            if outcome == "skipped":
                record["reason"] = f"needs hardware {i % 3}"
            out.write(results_line(record))
        out.write(results_line({"type": "footer", "exitstatus": 1, "duration": 1.0,
                                "interrupted": False, "collected": n}))


#: ``python -m harness report render`` that prints its own peak resident set (KiB) last
RENDER = ("import resource, sys; from harness.cli import main; rc = main(sys.argv[1:]); "
          "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, file=sys.stderr); "
          "sys.exit(rc)")


def render(results: Path, out: Path, history: Path | None = None) -> tuple[float, float]:
    """Seconds and peak MiB of one render in a fresh process."""
    start = time.perf_counter()
    more = ["--history", str(history)] if history else []
    proc = subprocess.run([sys.executable, "-c", RENDER, "report", "render", str(results),
                           "--out", str(out), *more], cwd=ROOT, capture_output=True, text=True)
    took = time.perf_counter() - start
    if proc.returncode not in (0, 1):  # 1: unreadable lines, said on the page
        raise SystemExit(proc.stderr[-3000:])
    return took, int(proc.stderr.split()[-1]) / 1024


def chromium_load(page: Path) -> float | None:
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        return None
    start = time.perf_counter()
    subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--dump-dom",
                    page.as_uri()], capture_output=True, timeout=300)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lines", default="10000,100000,1000000")
    parser.add_argument("--nights", default="0",
                        help="earlier nights in the history, comma-separated (0: none)")
    parser.add_argument("--chromium", action="store_true")
    parser.add_argument("--realistic", action="store_true",
                        help="lines written as the harness writes them (~590 bytes each)")
    args = parser.parse_args()
    write = write_realistic if args.realistic else write_results
    sizes = [int(n) for n in args.lines.split(",")]
    print(f"{'lines':>10} {'file MB':>8} {'nights':>6} {'render s':>9} {'peak MiB':>9} "
          f"{'page MB':>8} {'chromium s':>11}")
    with tempfile.TemporaryDirectory() as tmp:
        for n in sizes:
            for k in (int(x) for x in args.nights.split(",")):
                history = Path(tmp) / f"history{n}-{k}"
                for day in range(30 - k, 30):
                    write(history / f"2026-11-{day:02d}" / "bench.jsonl", n, day)
                results, out = Path(tmp) / f"r{n}.jsonl", Path(tmp) / f"out{n}-{k}"
                write(results, n)
                mb = results.stat().st_size / 1e6
                took, peak = render(results, out, history if k else None)
                page = out / "report.html"
                size = page.stat().st_size / 1e6
                load = chromium_load(page) if args.chromium else None
                print(f"{n:>10} {mb:>8.0f} {k:>6} {took:>9.1f} {peak:>9.0f} {size:>8.1f} "
                      f"{'-' if load is None else f'{load:.1f}':>11}", flush=True)
                results.unlink()
                shutil.rmtree(history, ignore_errors=True)


if __name__ == "__main__":
    main()
