"""The harness's own tests.

torch is imported here, once, before any pytester run: an inline pytester run restores
``sys.modules`` afterwards, and a torch first imported inside one inline run would be
dropped and imported a second time by the next, which corrupts the process (C extensions
cannot be re-initialised).
"""

import torch  # noqa: F401

#: the longest tests (an inner run of every suite, ~19 min under -n 2 here; the engine rows,
#: ~8 min), first: xdist's load scheduling hands the first items out one per worker, so
#: each starts at once on its own worker and the short tests fill in around them, instead
#: of one starting near the end and running alone (measured: 5 min of a 35-min CI)
LONGEST_FIRST = ("tests/test_suites_on_cpu.py::", "tests/test_vllm_engine.py::")


def pytest_collection_modifyitems(items: list) -> None:
    items.sort(key=lambda item: not item.nodeid.startswith(LONGEST_FIRST))
