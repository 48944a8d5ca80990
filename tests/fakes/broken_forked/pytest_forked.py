"""Negative control: a pytest-forked whose fork cannot hand reports back, as pytest-forked
1.7.5 under pytest 9.2.0 (its child exits with status 3). Loaded in place of the real one by
putting this folder first on PYTHONPATH; every call of ``forked_run_report`` appends a line
to ``$FAKE_FORKED_LOG`` so a test can count the forks."""

from __future__ import annotations

import os

import pytest
from _pytest import runner


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.getgroup("forked").addoption("--forked", action="store_true", dest="forked",
                                        default=False, help="box each test in a fork")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "forked: always fork for this test")


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> bool | None:
    if not (item.config.getvalue("forked") or item.get_closest_marker("forked")):
        return None
    item.ihook.pytest_runtest_logstart(nodeid=item.nodeid, location=item.location)
    for rep in forked_run_report(item):
        item.ihook.pytest_runtest_logreport(report=rep)
    item.session._setupstate.teardown_exact(nextitem)
    item.ihook.pytest_runtest_logfinish(nodeid=item.nodeid, location=item.location)
    return True


def forked_run_report(item: pytest.Item) -> list[pytest.TestReport]:
    log = os.environ.get("FAKE_FORKED_LOG")
    if log:
        with open(log, "a") as fh:
            fh.write(item.nodeid + "\n")
    pid = os.fork()
    if pid == 0:
        os._exit(3)  # the report could not be carried out of the fork
    _, status = os.waitpid(pid, 0)
    call = runner.CallInfo.from_call(lambda: 0 / 0, "???")
    call.excinfo = (f"{item.location[0]}:{item.location[1]}: running the test EXITED with "
                    f"status {os.waitstatus_to_exitcode(status)}")
    return [runner.pytest_runtest_makereport(item, call)]
