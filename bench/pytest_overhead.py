"""What isolating each test costs through pytest, against the peers a user would pick.

    python bench/pytest_overhead.py [--tests 100] [--rounds 3] [--profile]

Writes ``--tests`` one-line torch tests to a temporary folder and times one pytest run of
them per mode, side by side in each round: plain (in-process), ``--isolate-all``
(forkserver), ``--isolate-all --isolation spawn``, pytest-forked's ``--forked`` and
pytest-isolate's ``--isolate`` (a mode whose plugin is not installed is shown as such).
Prints, per mode, the median wall time of the run and the median added cost per test over
plain, and the ratio of that cost to ``--forked``'s. ``--profile`` runs ``--isolate-all``
once under cProfile and prints where the parent's time goes.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HEADER = "import torch\n"
TEST = """
def test_{i}():
    assert float((torch.ones(4, 4) @ torch.ones(4, 4)).sum()) == 64.0
"""
BASE = ["-p", "no:cacheprovider", "-q", "-p", "no:randomly"]
MODES: dict[str, tuple[list[str], str | None]] = {
    "plain": (["-p", "no:pytest_isolate"], None),
    "--isolate-all (forkserver)": (["--isolate-all", "-p", "no:pytest_isolate"], None),
    "--isolate-all --isolation spawn": (
        ["--isolate-all", "--isolation", "spawn", "-p", "no:pytest_isolate"], None),
    "--forked (pytest-forked)": (["--forked", "-p", "no:pytest_isolate"], "pytest_forked"),
    "--isolate (pytest-isolate)": (["--isolate"], "pytest_isolate"),
}


def write_tests(folder: Path, n: int) -> None:
    (folder / "test_many.py").write_text(HEADER + "".join(TEST.format(i=i) for i in range(n)))


def run(folder: Path, args: list[str], n: int) -> float:
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "pytest", *BASE, *args, "."], cwd=folder,
                          capture_output=True, text=True)
    took = time.perf_counter() - start
    if f"{n} passed" not in proc.stdout:
        raise SystemExit(f"pytest {' '.join(args)} did not pass all {n} tests:\n"
                         f"{proc.stdout[-3000:]}{proc.stderr[-2000:]}")
    return took


def profile(folder: Path) -> None:
    import cProfile
    import pstats

    import pytest

    prof = cProfile.Profile()
    prof.enable()
    pytest.main([*BASE, "--isolate-all", "-p", "no:pytest_isolate", str(folder)])
    prof.disable()
    pstats.Stats(prof).sort_stats("cumulative").print_stats(30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tests", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        write_tests(folder, args.tests)
        if args.profile:
            profile(folder)
            return
        modes = {name: argv for name, (argv, needs) in MODES.items()
                 if needs is None or importlib.util.find_spec(needs) is not None}
        times: dict[str, list[float]] = {name: [] for name in modes}
        for _ in range(args.rounds):
            for name, argv in modes.items():
                times[name].append(run(folder, argv, args.tests))
    plain = statistics.median(times["plain"])
    added = {name: (statistics.median(t) - plain) / args.tests * 1000
             for name, t in times.items()}
    forked = added.get("--forked (pytest-forked)")
    print(f"{args.tests} one-line torch tests, median of {args.rounds} rounds")
    print(f"{'mode':<34} {'run s':>8} {'added ms/test':>14} {'vs --forked':>12}")
    for name in MODES:
        if name not in times:
            print(f"{name:<34} {'(plugin not installed)':>36}")
            continue
        ratio = f"{added[name] / forked:.2f}x" if forked and name != "plain" else ""
        print(f"{name:<34} {statistics.median(times[name]):>8.2f} "
              f"{added[name]:>14.1f} {ratio:>12}")


if __name__ == "__main__":
    main()
