"""Process-table checks shared by the isolation and plugin tests."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import psutil

#: ``python -m pytest`` as a terminal's foreground job starts it, with Ctrl-C's default
#: handler: a CI job or ``cmd &`` in a script starts us with SIGINT ignored, and Python
#: then installs no handler in the pytest we start (nothing to test a Ctrl-C with)
PYTEST_AT_A_TERMINAL = [sys.executable, "-c",
                        "import signal, sys, pytest; "
                        "signal.signal(signal.SIGINT, signal.default_int_handler); "
                        "sys.exit(pytest.console_main())"]


def assert_gone(pids: list[int]) -> None:
    """Every pid has exited (a zombie awaiting its reaper counts as gone)."""
    for pid in pids:
        try:
            status = psutil.Process(pid).status()
        except psutil.NoSuchProcess:
            continue
        assert status == psutil.STATUS_ZOMBIE, f"pid {pid} survived the call ({status})"


def start_grandchild(pidfile: str, *, new_session: bool = False) -> int:
    """In a child: start a long sleeper and write "<child pid> <sleeper pid>" to pidfile."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"],
                            start_new_session=new_session)
    Path(pidfile).write_text(f"{os.getpid()} {proc.pid}")
    return proc.pid


def read_pids(pidfile: Path) -> list[int]:
    return [int(p) for p in pidfile.read_text().split()]
