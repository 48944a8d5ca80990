"""The runner's own envelopes: a folder of table files in the user's repository (as syrupy's
``__snapshots__`` or pytest-regressions' data directory), looked up before the tables shipped
in the package, which are this project's CI's.

The folder holds one file per family table (``logprobs.toml``, ``collectives.toml``), in the
shipped tables' format. The plugin names it to every process of a run through
``NPU_REGRESS_BASELINES`` (option ``--harness-baselines``, ini ``harness_baselines``, else
``baselines/`` beside the ini file where it exists); ``npu-regress expectations update`` and
``learn`` write there, never into an installed package."""

from __future__ import annotations

import os
from pathlib import Path

from harness.drift.table import Table, load

#: the variable that carries the folder to a run's processes (the isolated children read
#: their tables there)
ENV = "NPU_REGRESS_BASELINES"
#: the folder's name beside the ini file (the user's repository) when none is named
DEFAULT_FOLDER = "baselines"


def folder() -> Path | None:
    """The run's baselines folder, or None (the shipped tables only)."""
    value = os.environ.get(ENV, "")
    return Path(value) if value else None


def file_of(base: Path, name: str) -> Path:
    return base / f"{name}.toml"


def overlay(shipped: Table, name: str, base: Path | None = None) -> Table:
    """``shipped`` with the rows of the user's table ``name`` in place of its own (the
    user's row wins where both key it). Each row says where it came from (``Table.where``
    of the file it was read from)."""
    base = base if base is not None else folder()
    path = file_of(base, name) if base is not None else None
    if path is None or not path.is_file():
        return shipped
    user = load(path, shipped.key_fields, label=str(path))
    merged = Table(shipped.path, shipped.key_fields, dict(shipped.rows), shipped.header)
    merged.rows.update(user.rows)
    return merged


def writable(name: str, shipped: Table, base: Path) -> Table:
    """The user's table ``name`` in ``base``, to adopt into: the file where it exists, else
    an empty table with the shipped one's header."""
    path = file_of(base, name)
    if path.is_file():
        return load(path, shipped.key_fields, label=str(path))
    header = [f"# npu-regress baselines: this runner's own envelopes of the {name} table",
              "# (npu-regress expectations update / learn writes them; review the diff and",
              "# commit it). Rows here are judged before the tables shipped in the package.",
              *(line for line in shipped.header if line.startswith("# outcome"))]
    return Table(path, shipped.key_fields, {}, header, label=str(path))
