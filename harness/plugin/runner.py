"""What every pytest process that runs tests does (an xdist worker, or the one process
without xdist), registered there only, as xdist keeps its worker side in ``remote.py``: start
the forkserver for ``--isolate-all`` while collection runs, and size the preload of one
started at first use by what was collected."""

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


def pytest_collection_finish(session: pytest.Session) -> None:
    """A session of fewer than ``harness_isolation_preload_min`` run_on_npu tests (a bisect's
    trial, one case of a night) preloads torch, pytest and harness only: the ini's longer list
    pays for itself across children, and a single child pays for what it never imports. The
    children are the same processes either way; only where an import happens moves (a module
    not preloaded is imported by the child, in the child's own environment). A list given on
    the command line is kept."""
    from harness.isolation.server import DEFAULT_PRELOAD

    config = session.config
    harness_session = config.stash[SESSION_KEY]
    if config.getoption("harness_isolate_all") or \
            config.getoption("harness_isolation_preload") is not None:
        return
    tests = sum(1 for item in session.items
                if "run_on_npu" in getattr(item, "fixturenames", ()))
    if tests < harness_session.preload_min:
        harness_session.preload = DEFAULT_PRELOAD
