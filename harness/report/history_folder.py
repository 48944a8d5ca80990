"""Earlier nights: ``history/<date>/<runner>.jsonl``, the last N nights kept.

The history folder is shared (a CI cache) and may hold anything: only real folders and
regular files inside it are read or written, never through a symbolic link, and a new
night's file is written whole and then renamed into place."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

from harness.report.atomic import write_whole
from harness.report.folded_nights import History
from harness.report.load import RunResults, load_results

DEFAULT_KEEP = 14
_DATE = re.compile(r"\d{4}-\d{2}-\d{2}")


def safe_name(runner: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", runner)[:100] or "runner"


def night_file(history: Path, date: str, runner: str) -> Path:
    """Where ``add`` files ``runner``'s results of the night ``date``."""
    return history / date / f"{safe_name(runner)}.jsonl"


def latest_night(history: Path, runner: str, before: str | None) -> Path | None:
    """``runner``'s file of the latest night filed before ``before`` (a real folder and a
    regular file, never a link), or None."""
    if not history.is_dir():
        return None
    for night in sorted((p for p in history.iterdir() if _DATE.fullmatch(p.name)),
                        reverse=True):
        path = night_file(history, night.name, runner)
        if (before is None or night.name < before) and not night.is_symlink() \
                and not path.is_symlink() and path.is_file():
            return path
    return None


class NotFiled(list[str]):
    """``add``'s messages; ``refused`` counts the inputs that were not filed."""

    refused = 0


def add(paths: list[Path], history: Path, *, keep: int = DEFAULT_KEEP,
        date: str | None = None) -> NotFiled:
    """File each results file under its night (``date``, else its run's start date in
    UTC); drop nights beyond the last ``keep``. Never overwrites: the same file again is
    "already filed", another file of the same runner and night is filed under a new name
    (said), and a runner whose name files like another's is refused. Returns messages (what
    was filed, what was not)."""
    messages = NotFiled()
    for path in paths:
        run = load_results(path)
        if run.refused:
            messages.append(f"{path}: not filed: {run.refused}")
            messages.refused += 1
            continue
        night = date or run.date
        if not _DATE.fullmatch(night):
            messages.append(f"{path}: no start date in its header; pass --date YYYY-MM-DD")
            messages.refused += 1
            continue
        folder = history / night
        if history.is_symlink() or folder.is_symlink():
            messages.append(f"{path}: not filed: {folder} is a symbolic link (remove it)")
            messages.refused += 1
            continue
        folder.mkdir(parents=True, exist_ok=True)
        target, why = _free_name(folder, run, path)
        if target is None:
            messages.append(f"{path}: {why}")
            messages.refused += why.startswith("not filed")
            continue
        try:
            with open(path, "rb") as src:
                write_whole(target, lambda out, src=src: shutil.copyfileobj(src, out),
                            binary=True)
        except OSError as exc:
            messages.append(f"{path}: not filed ({exc})")
            messages.refused += 1
            continue
        messages.append(f"{path} -> {target} ({len(run.tests)} tests, runner {run.runner})"
                        + (f"; {why}" if why else ""))
    nights = sorted(p for p in history.iterdir() if _DATE.fullmatch(p.name)
                    and (p.is_symlink() or p.is_dir())) if history.is_dir() else []
    for old in nights[:-keep] if keep > 0 else []:
        if old.is_symlink():
            old.unlink()  # the link goes; what it pointed to is not ours to delete
        else:
            shutil.rmtree(old, ignore_errors=True)
        messages.append(f"dropped {old.name} (keeping the last {keep} nights)")
    return messages


def _free_name(folder: Path, run: RunResults, path: Path) -> tuple[Path | None, str]:
    """Where ``run`` is filed in ``folder`` without overwriting anything, and what to say
    about it; (None, why) where it is not filed."""
    name = safe_name(run.runner)
    target = night_file(folder.parent, folder.name, run.runner)
    if target.is_symlink() or not target.exists():
        return target, ""  # a link there is not a night of ours: replaced, never followed
    if _same_bytes(target, path):
        return None, f"already filed as {target}: nothing changed"
    earlier = load_results(target, follow_links=False, lean=True,
                           keep=lambda *args: None).runner
    if earlier != run.runner:
        return None, (f"not filed: runner {run.runner!r} files as {target.name}, which holds "
                      f"runner {earlier!r} of the same night; give the runners names that "
                      "differ in letters, digits, '.', '_' or '-' (--harness-runner)")
    n = 2
    while (other := folder / f"{name}.{n}.jsonl").exists() or other.is_symlink():
        if _same_bytes(other, path):
            return None, f"already filed as {other}: nothing changed"
        n += 1
    return other, (f"{target.name} already holds another results file of runner "
                   f"{run.runner!r} for {folder.name}: filed beside it, and both are read "
                   "as that runner's night")


def _same_bytes(first: Path, second: Path) -> bool:
    try:
        if first.stat().st_size != second.stat().st_size:
            return False
        with open(first, "rb") as a, open(second, "rb") as b:
            while chunk := a.read(1 << 20):
                if chunk != b.read(len(chunk)):
                    return False
        return True
    except OSError:
        return False


def load_history(history: Path | None, *, before: str | None = None,
                 problems: list[str] | None = None,
                 tonight: list[RunResults] | None = None) -> History:
    """The nights before ``before`` (tonight itself may already be filed), oldest first,
    each folded in as it is read (memory follows the distinct tests, not the nights; test
    ids are shared with ``tonight``'s runs). What is refused (links, FIFOs, huge files) and
    every bad line is added to ``problems``."""
    tonight_runs = {run.runner: run for run in tonight or []}
    problems = problems if problems is not None else []
    folded = History()
    if history is None or not history.is_dir():
        return folded
    for night in sorted(p for p in history.iterdir() if _DATE.fullmatch(p.name)):
        if before is not None and night.name >= before:
            continue
        if night.is_symlink() or not night.is_dir():
            problems.append(f"{night}: not a folder of the history (a link?): not read")
            continue
        folded.dates.append(night.name)
        for path in sorted(night.glob("*.jsonl")):
            run = load_results(path, follow_links=False, lean=True,
                               keep=folded.keeper(night.name, tonight_runs))
            if run.refused:  # a link, a FIFO, a huge file: not a night of this runner
                problems.extend(run.problems)
                continue
            problems.extend(f"history {night.name}: {p}" for p in run.problems
                            if "no footer" not in p)
            folded.past(run.runner).close(night.name, run)
    return folded
