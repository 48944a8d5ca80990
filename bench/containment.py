"""Time from killing pytest until the last process its session started is gone.

    python bench/containment.py [--rounds 3]

For each isolation method and each way pytest dies (plain SIGKILL; under ``-n 2`` SIGKILL
or SIGTERM of the controller, SIGKILL of the busy worker), a session runs one isolated
child that started two sleepers (one in its own session); the script kills the target and
prints the median seconds until the child, the sleepers, the isolation server and (when
the controller dies) the workers are gone, or "survived" after 60 s.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.test_containment import _tree, kill_left, start_victim, survivors  # noqa: E402

TARGETS = ("plain:SIGKILL", "controller:SIGKILL", "controller:SIGTERM", "worker:SIGKILL")
LIMIT_S = 60.0


def one(method: str, target: str) -> float | None:
    who, signame = target.split(":")
    with tempfile.TemporaryDirectory() as tmp:
        proc, pids = start_victim(Path(tmp), method, xdist=who != "plain")
        watched = sorted({*pids, *_tree(proc.pid)} - {os.getpid()})
        if who == "worker":
            watched = [p for p in watched if p != proc.pid]
        os.kill(pids[4] if who == "worker" else proc.pid, getattr(signal, signame))
        start = time.monotonic()
        while survivors(watched) and time.monotonic() - start < LIMIT_S:
            time.sleep(0.02)
        took = time.monotonic() - start
        left = survivors(watched)
        proc.kill()
        proc.wait()
        kill_left(watched)
        return None if left else took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    print(f"{'case':<32} {'median s until all gone':>24}  rounds")
    for method in ("spawn", "forkserver"):
        for target in TARGETS:
            times = [one(method, target) for _ in range(args.rounds)]
            done = [t for t in times if t is not None]
            shown = (f"{statistics.median(done):.2f}" if len(done) == len(times)
                     else f"survived ({len(times) - len(done)}/{len(times)})")
            print(f"{method + ' ' + target:<32} {shown:>24}  "
                  + " ".join("-" if t is None else f"{t:.2f}" for t in times), flush=True)


if __name__ == "__main__":
    main()
