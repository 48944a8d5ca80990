"""The harness's folders under the temp dir, named by the process that owns them
(``npu-regress-run-<pid>-*``: a child's work folder; ``npu-regress-fs-<pid>-*``: a
forkserver's socket folder), and the removal of those whose process is gone: a SIGKILLed
pytest cannot clean up after itself, so the next one that starts does. Folders of live
processes, and anything not named this way, are never touched."""

from __future__ import annotations

import errno
import os
import re
import shutil
import tempfile
from pathlib import Path

import psutil

PREFIX = "npu-regress-"
_OWNED = re.compile(rf"^{re.escape(PREFIX)}(run|fs)-(\d+)-")
_cleaned = False


def base() -> Path:
    """Where the folders are made: the temp dir (``TMPDIR``)."""
    return Path(tempfile.gettempdir())


def make(kind: str) -> Path:
    """A new folder of ``kind`` ("run" or "fs") owned by this process."""
    clean_once()
    return Path(tempfile.mkdtemp(prefix=f"{PREFIX}{kind}-{os.getpid()}-"))


def owner(path: Path) -> int | None:
    """The pid in an owned folder's name, or None for any other name."""
    found = _OWNED.match(path.name)
    return int(found.group(2)) if found else None


def remove_stale(tmp: Path | None = None) -> list[Path]:
    """Remove the owned folders under ``tmp`` (the temp dir) whose process is gone."""
    removed = []
    try:
        entries = list((tmp or Path(tempfile.gettempdir())).iterdir())
    except OSError:
        return removed
    for entry in entries:
        pid = owner(entry)
        if pid is None or pid == os.getpid() or psutil.pid_exists(pid):
            continue
        if entry.is_symlink() or not entry.is_dir():
            continue
        shutil.rmtree(entry, ignore_errors=True)
        removed.append(entry)
    return removed


def clean_once() -> None:
    """``remove_stale`` the first time this process makes a folder."""
    global _cleaned
    if not _cleaned:
        _cleaned = True
        remove_stale()


#: what a full or read-only filesystem is called, by errno
DISK_ERRORS = {errno.ENOSPC: "no space left on device (ENOSPC)",
               errno.EDQUOT: "disk quota exceeded (EDQUOT)",
               errno.EROFS: "read-only file system (EROFS)"}


def disk_message(path: Path | str, err: int) -> str:
    """Why ``path`` could not be written, with its filesystem's free space and the fix, for
    an errno in ``DISK_ERRORS``."""
    probe = Path(path)
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    try:
        usage = shutil.disk_usage(probe)
        free = f"{usage.free} bytes free of {usage.total} on that filesystem"
    except OSError as exc:
        free = f"its free space could not be read ({exc.strerror})"
    return (f"{DISK_ERRORS[err]} writing {path}: {free}. Free space there, or point TMPDIR "
            "at a folder on a filesystem with room (the isolated children's work folders "
            "live under it)")
