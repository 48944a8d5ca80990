"""Report and history files are written whole, then renamed into place.

A failure halfway (a full disk) leaves the previous file as it was, never a truncated one;
a symbolic link planted at the target is replaced by the rename, never written through; the
temporary file is created new (``O_EXCL``) under a name no one can have planted.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any


def write_whole(path: Path, write: Callable[[IO[Any]], None], *, binary: bool = False) -> None:
    """``write(fh)`` into a new file beside ``path`` (text: UTF-8, unencodable characters
    replaced), then rename it over ``path``; the temporary file never outlives the call."""
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with (os.fdopen(fd, "wb") if binary else
              os.fdopen(fd, "w", encoding="utf-8", errors="replace")) as fh:
            write(fh)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
