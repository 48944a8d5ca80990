"""The harness's own tests.

torch is imported here, once, before any pytester run: an inline pytester run restores
``sys.modules`` afterwards, and a torch first imported inside one inline run would be
dropped and imported a second time by the next, which corrupts the process (C extensions
cannot be re-initialised). The compatibility job runs the plugin's tests on Python 3.10
and 3.12 too, where no torch is installable here (ci/compat.sh): there torch is absent
and the tests that need it skip (``needs_torch``).
"""

import contextlib

import pytest

with contextlib.suppress(ImportError):
    import torch  # noqa: F401

#: for tests that need torch (the compatibility job's Pythons have none)
needs_torch = pytest.mark.skipif(
    not __import__("importlib.util").util.find_spec("torch"),
    reason="torch is not installed (the compatibility job's Python 3.10/3.12 have none)")

#: the longest tests (an inner run of every suite, ~19 min under -n 2 here; the engine rows,
#: ~8 min): each must start at once on its own worker, the short tests filling in around
#: them, instead of one starting near the end and running alone (measured: 5 min of a
#: 35-min CI) or both queued on one worker (9 min)
LONGEST_FIRST = ("tests/test_suites_on_cpu.py::", "tests/test_vllm_engine.py::test_the_engine_rows",
                 "tests/test_vllm_engine.py::test_the_serving_rows")


#: the modules whose tests run whole suites, engines, servers or third-party test suites
#: in inner pytest runs (marked ``e2e``): ``pytest tests -m "not e2e"`` is the fast loop,
#: ``.ci/run`` runs everything
E2E = ("tests/test_suites_on_cpu.py", "tests/test_vllm_engine.py", "tests/test_peers.py",
       "tests/test_ci.py")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "e2e: runs whole suites, engines or third-party test "
                                       "suites in inner runs (minutes); -m 'not e2e' leaves "
                                       "them out")


def pytest_collection_modifyitems(items: list) -> None:
    """Mark the ``E2E`` modules' tests ``e2e``. Put the k-th longest test at the head of the k-th worker's first chunk: xdist's load
    scheduler hands each worker a run of len(items) // workers // 4 consecutive items
    first (``xdist.scheduler.load.LoadScheduling.schedule``). Timing only: any order runs
    the same tests."""
    import os

    for item in items:
        if item.nodeid.startswith(E2E):
            item.add_marker(pytest.mark.e2e)
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT") or 1)
    longest = [item for item in items if item.nodeid.startswith(LONGEST_FIRST)]
    rest = [item for item in items if not item.nodeid.startswith(LONGEST_FIRST)]
    chunk = max(len(items) // max(workers, 1) // 4, 2)
    for k, item in enumerate(longest):
        rest.insert(min(k * chunk, len(rest)), item)
    items[:] = rest
