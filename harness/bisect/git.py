"""A ``--source`` checkout's commits, read with ``git`` (its work tree is never touched)."""

from __future__ import annotations

import subprocess
from pathlib import Path

from harness.bisect.endpoints import BisectInputError


def commits(checkout: Path, good: str, bad: str) -> list[str]:
    """``[good, ..., bad]``: the first-parent commits from good to bad, oldest first
    (``good`` and ``bad`` as ``resolve`` gave them)."""
    done = subprocess.run(["git", "-C", str(checkout), "rev-list", "--first-parent",
                           "--reverse", f"{good}..{bad}"], capture_output=True, text=True,
                          check=False)
    if done.returncode != 0:
        raise BisectInputError(f"--source {checkout}: git cannot list {good}..{bad}: "
                               + done.stderr.strip()[-300:])
    return [good, *done.stdout.split()]


def resolve(checkout: str, rev: str) -> str:
    """The full commit ``rev`` names in ``checkout``."""
    done = subprocess.run(["git", "-C", checkout, "rev-parse", "--verify", f"{rev}^{{commit}}"],
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise BisectInputError(f"--revisions: {rev!r} is not a commit of {checkout}")
    return done.stdout.strip()
