"""Reproducer folders (written by ``npu-regress repro``) onto their tests' cards: each
folder's ``repro.py``, ``ISSUE.md`` and ``requirements.txt`` are copied beside the report
(``repro/<finding>/``) and the card says where, and how the script was verified. Read as
untrusted input: a folder that is not a reproducer is a problem said on the page."""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any

from harness.report.compare import Comparison
from harness.report.load import Problems, read_json, readable_file

FILES = ("repro.py", "ISSUE.md", "requirements.txt")
MAX_BYTES = 1024 * 1024
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")


def load(folders: list[Path]) -> tuple[list[tuple[Path, dict[str, Any]]], Problems]:
    found, problems = [], Problems()
    for folder in folders:
        data, why = read_json(folder / "repro.json", MAX_BYTES)
        why = (f"repro.json: {why}" if why else None) or next(
            (f"{name}: {w}" for name in FILES if (w := readable_file(folder / name))), None)
        if why is None and any((folder / n).stat().st_size > MAX_BYTES for n in FILES):
            why = f"a file larger than {MAX_BYTES} bytes"
        if why is not None:
            problems.append(f"{folder}: not read as a reproducer (npu-regress repro's "
                            f"folder): {why}")
            continue
        if not (isinstance(data, dict) and isinstance(data.get("test"), str)
                and isinstance(data.get("finding"), str) and _NAME.match(data["finding"])
                and isinstance(data.get("verified"), str)):
            problems.append(f"{folder}: not a reproducer (repro.json lacks a test, a "
                            "finding id or how it was verified)")
            continue
        found.append((folder, data))
    return found, problems


def attach(comp: Comparison, reproducers: list[tuple[Path, dict[str, Any]]],
           out: Path) -> Problems:
    """Copy each reproducer beside the report and name it on its test's cells (every
    runner); one whose test is not in tonight's runs is said."""
    problems = Problems()
    for folder, data in reproducers:
        cells = [c for (test, _), c in comp.cells.items() if test == data["test"]]
        if not cells:
            problems.append(f"{folder}: reproducer of {data['test'][:200]}, a test no runner "
                            "ran tonight: not shown")
            continue
        dest = out / "repro" / data["finding"]
        dest.mkdir(parents=True, exist_ok=True)
        for name in FILES:
            shutil.copyfile(folder / name, dest / name)
        where = f"repro/{data['finding']}"
        # a script that exited 77 never reached its device: its own words, never "verified"
        said = data["verified"] if str(data["verified"]).startswith("written, not verified") \
            else f"verified: {data['verified']}"
        text = (f"{where}/repro.py (imports only the upstream stack), {where}/ISSUE.md, "
                f"{where}/requirements.txt; {said}")[:600]
        for cell in cells:
            cell.repro = text
            cell.repro_links = tuple((name, f"{where}/{name}") for name in FILES)
    return problems
