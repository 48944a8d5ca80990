"""Per-check cost of each isolation method, measured side by side in one run.

    python bench/isolation.py [--n 20] [--suites]

Each check imports torch and does one small matmul. Prints the median wall time per check
in-process, with spawn and with forkserver, the median overhead of each method over
in-process, and the spawn/forkserver ratio. With --suites, also the wall time of
``pytest suites/`` under each method.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from harness.isolation.run import get_launcher, isolate  # noqa: E402


def trivial_check() -> float:
    import torch

    a = torch.ones(8, 8)
    return float((a @ a).sum())


def time_calls(fn, n: int) -> list[float]:  # type: ignore[no-untyped-def]
    out = []
    for _ in range(n):
        start = time.perf_counter()
        fn()
        out.append(time.perf_counter() - start)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=20, help="checks per method (default 20)")
    parser.add_argument("--suites", action="store_true", help="also time pytest suites/")
    args = parser.parse_args()

    spawn = get_launcher("spawn")
    fork = get_launcher("forkserver")  # started (and torch preloaded) before timing
    trivial_check()  # warm the in-process torch import too
    rounds: dict[str, list[float]] = {"in-process": [], "spawn": [], "forkserver": []}
    for _ in range(args.n):  # interleaved, so drift hits every method alike
        rounds["in-process"] += time_calls(trivial_check, 1)
        rounds["spawn"] += time_calls(lambda: isolate(trivial_check, launcher=spawn), 1)
        rounds["forkserver"] += time_calls(lambda: isolate(trivial_check, launcher=fork), 1)
    med = {k: statistics.median(v) for k, v in rounds.items()}
    base = med["in-process"]
    print(f"checks per method: {args.n}")
    for name, value in med.items():
        over = "" if name == "in-process" else f"  overhead {1000 * (value - base):8.1f} ms"
        print(f"{name:>11}: median {1000 * value:8.1f} ms per check{over}")
    ratio = (med["spawn"] - base) / max(med["forkserver"] - base, 1e-9)
    print(f"spawn/forkserver overhead ratio: {ratio:.1f}x")
    if args.suites and (ROOT / "suites").is_dir():
        for method in ("spawn", "forkserver"):
            start = time.perf_counter()
            proc = subprocess.run(
                [sys.executable, "-m", "pytest", "suites/", "-q", "-p", "no:cacheprovider",
                 "--isolation", method], cwd=ROOT, capture_output=True, text=True, check=False)
            wall = time.perf_counter() - start
            last = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else ""
            print(f"pytest suites/ --isolation {method}: {wall:.1f} s ({last})")


if __name__ == "__main__":
    main()
