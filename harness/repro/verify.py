"""Running a reproducer where a maintainer would: a fresh virtual environment holding only
its ``requirements.txt`` (or an interpreter the caller names), the script's exit status read
as its verdict."""

from __future__ import annotations

import os
import subprocess
import venv
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from harness.repro import EXIT_MEANING


class VerifyError(RuntimeError):
    """The environment for a reproducer could not be made (named, with the step)."""


@dataclass(frozen=True)
class Run:
    """One run of a script: its exit status and the end of what it printed."""

    args: tuple[str, ...]
    code: int
    tail: str
    #: what this run was ("the case's inputs", "shrunk", "the control")
    label: str = ""

    def said(self) -> str:
        meaning = EXIT_MEANING.get(self.code, "an unexpected exit status")
        return (f"{self.label + ': ' if self.label else ''}`python repro.py"
                f"{''.join(' ' + a for a in self.args)}` exited {self.code} ({meaning})")


def fresh_venv(folder: Path, requirements: Path,
               after: Sequence[Sequence[str]] = ()) -> Path:
    """A new virtual environment at ``folder`` with ``requirements`` installed, then the
    ``after`` pip commands (the recipe's ``after_install``): its python."""
    venv.EnvBuilder(with_pip=True, clear=True).create(folder)
    python = folder / "bin" / "python"
    # --no-compile: pip byte-compiles every file it installs (torch's and vLLM's tens of
    # thousands); the script imports a fraction of them, compiled as it imports them
    for args in (("install", "-q", "--no-compile", "-r", str(requirements)), *after):
        proc = subprocess.run([str(python), "-m", "pip", *args], capture_output=True,
                              text=True, check=False)
        if proc.returncode != 0:
            raise VerifyError(f"pip {' '.join(args)} in a fresh venv ({folder}) failed with "
                              f"{proc.returncode}:\n{proc.stderr[-3000:]}")
    return python


def run(python: Path | str, script: Path, args: Sequence[str] = (), *,
        timeout: float = 900.0, label: str = "", own_venv: bool = False) -> Run:
    """Run ``script`` with ``python`` from the script's folder (a clean environment for the
    harness: nothing of this checkout on its path). ``own_venv``: ``python`` is a fresh venv
    of ``fresh_venv``, installed without byte-compiling, so its imports write their caches
    into it whatever ``PYTHONDONTWRITEBYTECODE`` says (a CI machine that sets it otherwise
    compiles torch's and vLLM's modules again in every run of the script)."""
    dropped = ("PYTHONPATH", "PYTHONSTARTUP", *(("PYTHONDONTWRITEBYTECODE",) if own_venv else ()))
    env = {k: v for k, v in os.environ.items()
           if k not in dropped and not k.startswith(("HARNESS_", "PYTEST_"))}
    try:
        proc = subprocess.run([str(python), script.name, *args], cwd=script.parent, env=env,
                              capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired as exc:
        out = (exc.stdout or b"")[-3000:]
        text = out.decode(errors="replace") if isinstance(out, bytes) else str(out)
        return Run(tuple(args), -1, text + f"\n(timed out after {timeout:.0f} s)", label)
    return Run(tuple(args), proc.returncode, (proc.stdout + proc.stderr)[-4000:], label)
