"""``--isolate-all`` on test suites nobody here wrote, against pytest-forked and plain pytest.

    python bench/third_party_suites.py [--rounds 3] [--suites toolz,cachetools,simplejson]

Downloads each suite's sdist from the package index into a temporary folder (toolz: 12
test modules; cachetools; simplejson: 30+ small unittest modules), then, per round and
suite, runs it plain, with ``--forked`` and with ``--isolate-all``, side by side (the modes
interleaved, so load changes hit all three). Prints per suite the median wall time of each
mode, the per-test overhead over plain, the ratio of ``--isolate-all``'s overhead to
``--forked``'s, and whether each mode's outcomes equal plain pytest's, test for test (JUnit
XML); a mode that cannot run the suite is shown as such.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

#: suite: (sdist name, folder of its tests inside the sdist, folder to put on sys.path)
SUITES = {
    "toolz": ("toolz", "toolz/tests", "."),
    "cachetools": ("cachetools", "tests", "src"),
    "simplejson": ("simplejson", "simplejson/tests", "."),
}
MODES = {
    "plain": [],
    "--forked": ["--forked"],
    "--isolate-all": ["--isolate-all"],
}
BASE = ["-q", "-p", "no:cacheprovider", "-p", "no:randomly"]


def fetch(name: str, into: Path) -> Path:
    """The sdist of ``name``, unpacked under ``into``."""
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps",
                    "--no-binary", ":all:", "--no-build-isolation", "-d", str(into), name],
                   check=True, capture_output=True)
    archive = next(into.glob(f"{name}-*.tar.gz"))
    with tarfile.open(archive) as tar:
        tar.extractall(into, filter="data")
    return next(p for p in into.glob(f"{name}-*") if p.is_dir())


def outcomes(xml: Path) -> dict[str, str]:
    """Each test's outcome in a JUnit file: passed, failed, error or skipped."""
    found: dict[str, str] = {}
    for case in ET.parse(xml).getroot().iter("testcase"):
        kind = "passed"
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                kind = child.tag
        found[f"{case.get('classname')}::{case.get('name')}"] = kind
    return found


def run(root: Path, tests: str, path: str, mode: list[str], xml: Path) -> float:
    env_path = str(root / path)
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "pytest", *BASE, *mode, f"--junitxml={xml}", tests],
                   cwd=root, env={**os.environ, "PYTHONPATH": env_path}, capture_output=True)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--suites", default=",".join(SUITES))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="npu-regress-bench-") as tmp:
        work = Path(tmp)
        roots = {name: fetch(SUITES[name][0], work) for name in args.suites.split(",")}
        times: dict[tuple[str, str], list[float]] = {}
        seen: dict[tuple[str, str], dict[str, str]] = {}
        for round_ in range(args.rounds):
            for suite, root in roots.items():
                _, tests, path = SUITES[suite]
                for mode, flags in MODES.items():
                    xml = work / f"{suite}-{mode.strip('-')}-{round_}.xml"
                    times.setdefault((suite, mode), []).append(run(root, tests, path, flags,
                                                                   xml))
                    seen[(suite, mode)] = outcomes(xml) if xml.exists() else {}
        print(f"{'suite':<11} {'tests':>5} {'mode':<14} {'median s':>9} {'per test ms':>12} "
              f"{'vs --forked':>11}  outcomes")
        for suite in roots:
            plain = statistics.median(times[(suite, "plain")])
            n = max(len(seen[(suite, "plain")]), 1)
            over = {mode: (statistics.median(times[(suite, mode)]) - plain) / n * 1000
                    for mode in MODES}
            for mode in MODES:
                same = seen[(suite, mode)] == seen[(suite, "plain")]
                bad = sum(1 for k, v in seen[(suite, mode)].items()
                          if v in ("failure", "error") and seen[(suite, "plain")].get(k) != v)
                ratio = (f"{over[mode] / over['--forked']:.2f}x"
                         if mode == "--isolate-all" and over["--forked"] > 0 else "")
                verdict = "= plain" if same else f"differ ({bad} failed/errored only here)"
                print(f"{suite:<11} {n:>5} {mode:<14} "
                      f"{statistics.median(times[(suite, mode)]):>9.2f} "
                      f"{over[mode] if mode != 'plain' else 0:>12.1f} {ratio:>11}  {verdict}")


if __name__ == "__main__":
    main()
