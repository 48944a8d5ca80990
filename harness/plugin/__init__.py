"""The pytest plugin (entry point ``npu_regress``: installing npu-regress is enough).

Shaped as pytest-xdist's: this module holds the hooks that set the plugin up and registers
the rest, one job per module:

- ``options``: the command-line options and ini keys, read back with their checks;
- ``hookspecs``: every hook the harness adds to pytest;
- ``session``: ``HarnessSession`` (``config.stash[SESSION_KEY]``) and its lifecycle;
- ``controller``: what the controlling process does (manifest, results file, header),
  registered there only; ``runner``: what every process that runs tests does (the
  ``--isolate-all`` forkserver's early start), registered there only;
- ``markers`` and ``fixtures``: the markers' skips, ``run_on_npu`` and its siblings;
- ``whole_test``: ``--isolate-all`` and ``@pytest.mark.isolated``;
- ``verdicts``, ``absent``, ``require``, ``results``: how outcomes are labelled, collapsed,
  required and written.

Data flows one way: a test calls ``run_on_npu`` -> ``harness.isolation.run.isolate`` ->
child -> ``IsolatedResult`` -> report sections and properties on the test's report ->
``results.jsonl`` -> ``harness.report``.
"""

from __future__ import annotations

import pytest

from harness.plugin import controller, markers, options, require, runner
from harness.plugin.fixtures import (
    invariance_target,
    npu_versions,
    pytest_generate_tests,
    pytest_runtest_makereport,
    run_on_npu,
)
from harness.plugin.hookspecs import HarnessHookspecs
from harness.plugin.session import SESSION_KEY, HarnessSession, HarnessWarning, hold, open_session

__all__ = [
    "SESSION_KEY", "HarnessSession", "HarnessWarning", "invariance_target", "npu_versions",
    "pytest_generate_tests", "pytest_runtest_makereport", "run_on_npu",
]


def pytest_addoption(parser: pytest.Parser) -> None:
    options.add_options(parser)


def pytest_addhooks(pluginmanager: pytest.PytestPluginManager) -> None:
    pluginmanager.add_hookspecs(HarnessHookspecs)


def pytest_configure(config: pytest.Config) -> None:
    markers.register(config)
    _name_baselines(config)
    session = open_session(config)
    try:
        requirements = require.parse(options.option(config, "harness_require"))
    except ValueError as exc:
        raise pytest.UsageError(str(exc)) from None
    if requirements:
        require.check(requirements, session.device.kind, session.npu)
        config.pluginmanager.register(require.RequiredCapabilities(requirements),
                                      "npu_regress_require")
    from harness.plugin.absent import AbsentTargets
    from harness.plugin.verdicts import Verdicts, stack_facts
    from harness.plugin.whole_test import WholeTestIsolation

    session.stack = stack_facts()
    config.stash[SESSION_KEY] = session
    config.pluginmanager.register(Verdicts(session.stack), "npu_regress_verdicts")
    config.pluginmanager.register(AbsentTargets(session.device.kind, session.device.npu_missing),
                                  "npu_regress_absent")
    hold(session, config)
    # by process role, as xdist registers its DSession in the controller only
    if not hasattr(config, "workerinput"):
        config.pluginmanager.register(controller, "npu_regress_controller")
    if controller.runs_tests(config):
        config.pluginmanager.register(runner, "npu_regress_runner")
    config.pluginmanager.register(markers, "npu_regress_markers")
    config.pluginmanager.register(WholeTestIsolation(session), "npu_regress_whole_test")
    if config.getoption("harness_isolate_all"):
        from harness.plugin.whole_test_child import remember_rewrites

        remember_rewrites()


def _name_baselines(config: pytest.Config) -> None:
    """Name the run's baselines folder to every process it starts (the isolated children,
    xdist's workers and the forkserver read their tables there)."""
    import os

    from harness.drift.baselines import ENV

    folder = options.baselines_folder(config)
    if folder is not None:
        os.environ[ENV] = str(folder.resolve())


def pytest_unconfigure(config: pytest.Config) -> None:
    session = config.stash.get(SESSION_KEY, None)
    if session is None:
        from harness.isolation import reaper

        reaper.end_all_live()
        return
    session.close()
