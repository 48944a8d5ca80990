"""Every hook the harness adds to pytest, in one place (as pytest-xdist's ``newhooks.py``):
loaded by ``pytest_addhooks`` in ``harness.plugin``. Implement them in a conftest or a
plugin; each is optional."""

from __future__ import annotations

import pytest


class HarnessHookspecs:
    @pytest.hookspec(firstresult=True)
    def pytest_harness_accelerator_state(self, config: pytest.Config) -> str | None:
        """Why forking the pytest process now would be unsafe (an accelerator is initialised,
        or the process is in a bad-fork state), or None. Implement it to inject a state.
        Built in: ``harness.plugin.whole_test.WholeTestIsolation``."""

    @pytest.hookspec(firstresult=True)
    def pytest_harness_absent_target(self, item: pytest.Item) -> tuple[str, str] | None:
        """``(target name, why it is absent)`` when ``item`` is a case of a target this
        session cannot run at all, else None. Cheap and import-free: called at collection.
        Built in: ``bi_target`` (``harness.plugin.absent.AbsentTargets``)."""
