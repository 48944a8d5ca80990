"""Earlier nights: ``history/<date>/<runner>.jsonl``, the last N nights kept."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

from harness.report.load import RunResults, load_results

DEFAULT_KEEP = 14
_DATE = re.compile(r"\d{4}-\d{2}-\d{2}")


def safe_name(runner: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", runner)[:100] or "runner"


def add(paths: list[Path], history: Path, *, keep: int = DEFAULT_KEEP,
        date: str | None = None) -> list[str]:
    """File each results file under its night (``date`` or its header's start date); drop
    nights beyond the last ``keep``. Returns messages (what was filed, what was skipped)."""
    messages = []
    for path in paths:
        run = load_results(path)
        night = date or run.date
        if not _DATE.fullmatch(night):
            messages.append(f"{path}: no start date in its header; pass --date YYYY-MM-DD")
            continue
        target = history / night / f"{safe_name(run.runner)}.jsonl"
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, target)
        messages.append(f"{path} -> {target} ({len(run.tests)} tests, runner {run.runner})")
    nights = sorted(p for p in history.iterdir() if p.is_dir() and _DATE.fullmatch(p.name)) \
        if history.is_dir() else []
    for old in nights[:-keep] if keep > 0 else []:
        shutil.rmtree(old)
        messages.append(f"dropped {old.name} (keeping the last {keep} nights)")
    return messages


def load_history(history: Path | None, *, before: str | None = None
                 ) -> list[tuple[str, dict[str, RunResults]]]:
    """Nights in date order, oldest first: (date, {runner: results}); only nights before
    ``before`` when given (tonight itself may already be filed)."""
    if history is None or not history.is_dir():
        return []
    nights = []
    for night in sorted(p for p in history.iterdir() if p.is_dir() and _DATE.fullmatch(p.name)):
        if before is not None and night.name >= before:
            continue
        runs = {}
        for path in sorted(night.glob("*.jsonl")):
            run = load_results(path)
            runs[run.runner] = run
        nights.append((night.name, runs))
    return nights
