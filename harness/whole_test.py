"""Whole-test isolation (``@pytest.mark.isolated``, ``--isolate-all``) and the bad-fork guard
for pytest-forked.

Isolated tests: the call phase (the test function with its already-resolved fixture values)
runs in a fresh process through the same machinery as ``run_on_npu``, with the same
outcomes. Fixtures are set up and torn down in the pytest process; their values travel
to the child, so they must pickle (a clear error names the one that does not). Changes a
fixture makes to the pytest process's environment variables reach the child; patches of
Python objects do not (the child is a fresh process).

Fork guard: ``pytest --forked`` / ``@pytest.mark.forked`` forks the pytest process, which
breaks (crash, hang, or a silent wrong result) once CUDA or an NPU is initialised in it.
Before each forked test the plugin asks ``pytest_harness_accelerator_state``; if the answer
is a reason, the test is not forked: it fails with that reason and points to
``--isolate-all``. Likewise when pytest-forked itself cannot work in this pytest
(``harness.forked_probe``, one fork per session): the message names the versions and the
ways out instead of pytest-forked's "EXITED with status 3".
"""

from __future__ import annotations

from typing import Any

import pytest

from harness import forked_probe
from harness.forkserver import accelerator_state
from harness.isolation import dump_payload, isolate

FORK_GUARD_KEY = pytest.StashKey[str]()


class HarnessHookspecs:
    @pytest.hookspec(firstresult=True)
    def pytest_harness_accelerator_state(self, config: pytest.Config) -> str | None:
        """Why forking the pytest process now would be unsafe (an accelerator is initialised,
        or the process is in a bad-fork state), or None. Implement it to inject a state."""


def default_accelerator_state() -> str | None:
    """``accelerator_state`` plus torch's own bad-fork flags, for this (pytest) process."""
    import sys

    reason = accelerator_state()
    torch = sys.modules.get("torch")
    if reason is None and torch is not None:
        for name in ("cuda", "npu"):
            flag = getattr(getattr(torch, name, None), "_is_in_bad_fork", None)
            try:
                if callable(flag) and flag():
                    reason = f"the {name.upper()} runtime is in a bad-fork state"
            except Exception:  # noqa: BLE001 - a failing probe is no verdict
                continue
    return reason.replace("in the forkserver", "in the pytest process") if reason else None


def _fail_on_unpicklable_fixture(fn: Any, funcargs: dict[str, Any]) -> None:
    """Only on the failure path: pickle each fixture value alone to find the culprit."""
    __tracebackhide__ = True
    for name, value in funcargs.items():
        try:
            dump_payload({"fn": fn, "args": (), "kwargs": {name: value}})
        except TypeError as exc:
            pytest.fail(
                f"isolated test: the value of fixture {name!r} ({type(value).__name__}) "
                f"cannot be sent to the child process ({exc.__cause__ or exc}). Isolated "
                "tests can use fixtures whose values pickle (tmp_path, data, objects of "
                "your own); run this test without isolation, or make the fixture return "
                "something that pickles.", pytrace=False)


class WholeTestIsolation:
    """Registered by the plugin; uses its session (launcher, timeout, device env)."""

    def __init__(self, session: Any) -> None:
        self.session = session

    @pytest.hookimpl(trylast=True)
    def pytest_harness_accelerator_state(self, config: pytest.Config) -> str | None:
        return default_accelerator_state()

    def _isolated(self, item: pytest.Function) -> pytest.Mark | None | bool:
        if "run_on_npu" in item._fixtureinfo.argnames:
            return False  # its checks already run isolated; the test itself stays here
        marker = item.get_closest_marker("isolated")
        return marker or bool(item.config.getoption("harness_isolate_all"))

    @pytest.hookimpl(tryfirst=True)
    def pytest_pyfunc_call(self, pyfuncitem: pytest.Function) -> bool | None:
        selected = self._isolated(pyfuncitem)
        if not selected:
            return None
        __tracebackhide__ = True
        from harness.plugin import attach_result

        marker = selected if isinstance(selected, pytest.Mark) else None
        names = pyfuncitem._fixtureinfo.argnames
        funcargs = {name: pyfuncitem.funcargs[name] for name in names}
        opts = dict(marker.kwargs) if marker else {}
        timeout_marker = pyfuncitem.get_closest_marker("isolation_timeout")
        timeout = opts.get("timeout") or (float(timeout_marker.args[0]) if timeout_marker
                                          else self.session.timeout)
        try:
            res = isolate(pyfuncitem.obj, (), funcargs, timeout=float(timeout),
                          env={**self.session.child_env(), **(opts.get("env") or {})},
                          launcher=self.session.launcher())
        except TypeError:  # the payload did not pickle: name the fixture that broke it
            _fail_on_unpicklable_fixture(pyfuncitem.obj, funcargs)
            raise
        attach_result(pyfuncitem, res)
        res.raise_for_outcome()
        return True

    # --- the fork guard --------------------------------------------------------------------

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_runtest_protocol(self, item: pytest.Item, nextitem: pytest.Item | None) -> Any:
        config = item.config
        forked = bool(getattr(config.option, "forked", False)) or \
            item.get_closest_marker("forked") is not None
        if not forked:
            return (yield)
        message = _fork_refusal(item)
        if not message:
            return (yield)
        # Do not fork at all: hide the request from pytest-forked for this item only. A test
        # that we isolate anyway (the message's way out) just runs isolated; any other fails
        # in setup, before any fixture runs.
        if not (isinstance(item, pytest.Function) and self._isolated(item)):
            item.stash[FORK_GUARD_KEY] = message
        saved_option = getattr(config.option, "forked", False)
        saved_marker = item.get_closest_marker
        config.option.forked = False
        item.get_closest_marker = (  # type: ignore[method-assign]
            lambda name, default=None: default if name == "forked" else saved_marker(name,
                                                                                    default))
        try:
            return (yield)
        finally:
            config.option.forked = saved_option
            del item.get_closest_marker

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> None:
        message = item.stash.get(FORK_GUARD_KEY, None)
        if message:
            pytest.fail(message, pytrace=False)


def _fork_refusal(item: pytest.Item) -> str | None:
    """Why this forked test must not be forked, as the message its setup fails with."""
    config = item.config
    reason = config.hook.pytest_harness_accelerator_state(config=config)
    if reason:
        return (f"not forked: {reason}, and a process forked from it would crash or hang "
                "(\"Cannot re-initialize ... in forked subprocess\"). Run with --isolate-all "
                "(or mark the test @pytest.mark.isolated): each test then runs in a fresh "
                "process that never inherits the initialised device.")
    broken = forked_probe.probe(item.session).broken
    if broken:
        below = ".".join(pytest.__version__.split(".")[:2])
        return (f"not forked: {broken}. Two ways out: run it with --isolate-all (or mark the "
                "test @pytest.mark.isolated), which isolates without pytest-forked; or install "
                f"a pytest that pytest-forked supports: pip install 'pytest<{below}' "
                "(ci/constraints.txt pins one).")
    return None
