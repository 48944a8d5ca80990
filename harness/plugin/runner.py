"""What every pytest process that runs tests does (an xdist worker, or the one process
without xdist), registered there only, as xdist keeps its worker side in ``remote.py``: start
the forkserver for ``--isolate-all`` while collection runs."""

from __future__ import annotations

import pytest

from harness.plugin.session import SESSION_KEY


@pytest.hookimpl(trylast=True)
def pytest_sessionstart(session: pytest.Session) -> None:
    harness_session = session.config.stash[SESSION_KEY]
    if session.config.getoption("harness_isolate_all") and \
            harness_session.method in ("auto", "forkserver"):
        # its start overlaps collection; after collection it imports the collected test
        # modules (``harness.plugin.preload``), and torch only when they or a run_on_npu
        # test need it
        if not harness_session.preload_explicit:
            from harness.plugin.preload import BASE_PRELOAD

            harness_session.preload = BASE_PRELOAD
        harness_session.prestart()
