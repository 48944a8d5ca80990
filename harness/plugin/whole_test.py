"""Whole-test isolation (``@pytest.mark.isolated``, ``--isolate-all``) and the bad-fork guard
for pytest-forked.

Isolated tests: the call phase runs in a fresh process through the same machinery as
``run_on_npu``, with the same outcomes. The child imports the test module by name and runs
the test as collected, under the parent's warning filters, with capture fixtures of its
own (``harness.plugin.whole_test_child``). Fixtures are set up and torn down in the pytest process;
their values travel to the child, so they must pickle (one line names the one that does
not), and come back after the test for teardown when they pickle again. Changes a fixture
makes to the pytest process's environment variables reach the child; patches of Python
objects do not (the child is a fresh process). ``@pytest.mark.isolated(False)`` keeps a
test in the pytest process under ``--isolate-all``.

Fork guard: ``pytest --forked`` / ``@pytest.mark.forked`` forks the pytest process, which
breaks (crash, hang, or a silent wrong result) once CUDA or an NPU is initialised in it.
Before each forked test the plugin asks ``pytest_harness_accelerator_state``; if the answer
is a reason, the test is not forked: it fails with that reason and points to
``--isolate-all``. Likewise when pytest-forked itself cannot work in this pytest
(``harness.plugin.forked_probe``, one fork per session): the message names the versions and the
ways out instead of pytest-forked's "EXITED with status 3".
"""

from __future__ import annotations

import contextlib
import pickle
import warnings
from typing import Any

import pytest

from harness.isolation.result import ChildCrashed, ChildTimeout
from harness.isolation.run import dumps, isolate
from harness.isolation.server import accelerator_state
from harness.plugin import (
    doctest_child,
    failure_repr,
    fixture_views,
    forked_probe,
    preload,
    pytest_private,
    whole_test_child,
)
from harness.plugin.attach import attach_result

#: fixtures bound to the pytest process itself: an isolated test cannot use them (of
#: ``request``, ``pytestconfig`` and the temp-path factories it gets a view:
#: ``harness.plugin.fixture_views``)
IN_PROCESS_ONLY = ("pytester", "testdir", "cache")
#: the report's traceback as the child rendered it (``harness.plugin.failure_repr``)
LONGREPR_KEY = pytest.StashKey[Any]()

FORK_GUARD_KEY = pytest.StashKey[str]()


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


def _fail_unpicklable(what: dict[str, Any]) -> None:
    """Only on the failure path: pickle each shipped thing alone to name the culprit, in
    one line (no chained internals)."""
    __tracebackhide__ = True
    for label, value in what.items():
        why = _pickle_error(value)
        if why:
            pytest.fail(
                f"isolated test: {label} ({type(value).__name__}) cannot be sent to the child "
                f"process ({why}). Make it something that pickles, or keep this test in the "
                "pytest process: @pytest.mark.isolated(False).", pytrace=False)


def _pickle_error(value: Any) -> str | None:
    try:
        dumps(value)
    except Exception as exc:  # noqa: BLE001 - any failure names this one
        return f"{type(exc).__name__}: {exc}"
    return None


def _restore_in_place(old: Any, new: Any) -> None:
    """Make the parent's fixture value look like the child's after the test, where that can
    be done in place (what a yield fixture's teardown holds is the same object)."""
    if type(old) is not type(new):
        return
    if isinstance(old, (dict, set)):
        old.clear()
        old.update(new)
    elif isinstance(old, (list, bytearray)):
        old[:] = new
    elif hasattr(old, "__dict__") and not isinstance(old, type):
        try:
            vars(old).clear()
            vars(old).update(vars(new))
        except TypeError:
            return


def _log_settings(config: pytest.Config) -> dict[str, Any]:
    """pytest's log level and format for the report's "Captured log" section."""
    return pytest_private.log_settings(config)


class WholeTestIsolation:
    """Registered by the plugin; uses its session (launcher, timeout, device env)."""

    def __init__(self, session: Any) -> None:
        self.session = session
        self._render: failure_repr.RenderSettings | None = None

    @pytest.hookimpl(trylast=True)
    def pytest_harness_accelerator_state(self, config: pytest.Config) -> str | None:
        return default_accelerator_state()

    def _isolated(self, item: pytest.Function) -> pytest.Mark | None | bool:
        if "run_on_npu" in item._fixtureinfo.argnames:
            return False  # its checks already run isolated; the test itself stays here
        marker = item.get_closest_marker("isolated")
        if marker is not None and marker.args and not marker.args[0]:
            return False  # @pytest.mark.isolated(False): stays in the pytest process
        return marker or bool(item.config.getoption("harness_isolate_all"))

    @pytest.hookimpl(tryfirst=True)
    def pytest_collection_finish(self, session: pytest.Session) -> None:
        """The isolation server (started at session start under ``--isolate-all``, its
        interpreter and pytest loaded meanwhile) now imports the collected test modules and
        conftests (``harness.plugin.preload``): each isolated test pays a fork, not an
        import."""
        harness = self.session
        config = session.config
        controller = bool(getattr(config.option, "numprocesses", None)) and \
            not hasattr(config, "workerinput")
        if controller or harness.method not in ("auto", "forkserver") or \
                harness._launcher is not None:
            return
        found = preload.plan(session.items, self._isolated, config,
                             always=harness._server is not None)
        if found is None:
            return
        harness.warm(found)

    def pytest_report_collectionfinish(self, config: pytest.Config) -> list[str]:
        harness = self.session
        if harness.warm_plan is None:
            return []
        server = None
        with contextlib.suppress(Exception, pytest.fail.Exception):
            server = harness._own_server().server
        if server is None:
            return []
        return [preload.header(harness.warm_plan, server.warmed, harness.warm_refused)]

    @pytest.hookimpl(tryfirst=True)
    def pytest_pyfunc_call(self, pyfuncitem: pytest.Function) -> bool | None:
        selected = self._isolated(pyfuncitem)
        if not selected:
            return None
        __tracebackhide__ = True
        self._run(pyfuncitem, selected if isinstance(selected, pytest.Mark) else None)
        return True

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_runtest_call(self, item: pytest.Item) -> Any:
        """unittest.TestCase tests and doctests never reach ``pytest_pyfunc_call``: run them
        isolated through their ``runtest``."""
        doctest = pytest_private.is_doctest(item)
        selected = (doctest or pytest_private.is_unittest(item)) and self._isolated(item)
        if not selected:
            return (yield)
        marker = selected if isinstance(selected, pytest.Mark) else None
        kind = "doctest" if doctest else "unittest"
        item.runtest = lambda: self._run(item, marker, kind)  # type: ignore[method-assign]
        try:
            return (yield)
        finally:
            del item.runtest

    def _run(self, item: Any, marker: pytest.Mark | None, kind: str = "function") -> None:
        __tracebackhide__ = True
        opts = dict(marker.kwargs) if marker else {}
        timeout_marker = item.get_closest_marker("isolation_timeout")
        timeout = opts.get("timeout") or (float(timeout_marker.args[0]) if timeout_marker
                                          else self.session.timeout)
        unittest = kind == "unittest"
        if kind == "doctest":
            fn: Any = doctest_child.call_for(item, self._render_settings(item.config))
            contexts: dict[str, Any] = {"test": whole_test_child.collect}
        else:
            fn, contexts = self._shippable(item, unittest)
        device = any(item.iter_markers("npu")) or any(item.iter_markers("device"))
        env = {**(self.session.child_env() if device else {}), **(opts.get("env") or {})}
        res = isolate(fn, (), {}, timeout=float(timeout), env=env, contexts=contexts,
                      launcher=self.session.launcher(), mark_child=device)
        attach_result(item, res)
        report = res.extras.get("test") or {}
        self._replay(item, report)
        if report.get("longrepr") and res.outcome in ("raised", "fail", "error"):
            with contextlib.suppress(Exception):
                item.stash[LONGREPR_KEY] = pickle.loads(report["longrepr"])
        try:
            res.raise_for_outcome()
        except (ChildCrashed, ChildTimeout) as exc:
            line = item.location[1]
            with contextlib.suppress(Exception):
                item.stash[LONGREPR_KEY] = failure_repr.ending(
                    str(item.path), (line or 0) + 1, f"{_qualname(exc)}: {exc}", res.stack)
            raise
        if res.value is not None and kind == "function":
            warnings.warn(pytest.PytestReturnNotNoneWarning(
                f"Test functions should return None, but {item.nodeid} returned "
                f"{type(res.value)!r}.\nDid you mean to use `assert` instead of `return`?"),
                stacklevel=1)

    def _shippable(self, item: pytest.Function, unittest: bool) -> tuple[Any, dict[str, Any]]:
        """The test as the child will run it: by module name and attribute path, its
        fixture values and the warning filters in force now pickled apart."""
        __tracebackhide__ = True
        names = [] if unittest else list(item._fixtureinfo.argnames)
        for name in names:
            if name in IN_PROCESS_ONLY:
                pytest.fail(
                    f"isolated test: fixture {name!r} belongs to the pytest process and cannot "
                    "be used in the isolated child; keep this test in the pytest process with "
                    "@pytest.mark.isolated(False).", pytrace=False)
        child_built = [n for n in names if n in whole_test_child.CHILD_BUILT]
        replayed = [n for n in names if n in whole_test_child.REPLAYED]
        viewed = [n for n in names if n in fixture_views.VIEWED]
        funcargs = {n: item.funcargs[n] for n in names
                    if n not in child_built and n not in replayed and n not in viewed}
        instance = None if unittest or item.cls is None else item.instance
        data = {"funcargs": funcargs, "filters": list(warnings.filters), "instance": instance,
                "child_built": child_built, "replayed": replayed,
                "in_process": fixture_views.views(item, viewed)}
        blob: bytes | None = None
        with contextlib.suppress(Exception):  # named below, outside a handler (no chaining)
            blob = dumps(data)
        if blob is None:
            _fail_unpicklable({**{f"the value of fixture {n!r}": v for n, v in funcargs.items()},
                               "the test class instance": instance,
                               "the warning filters in force": data["filters"]})
            pytest.fail(f"isolated test: its fixture values cannot be sent to the child "
                        f"process ({_pickle_error(data)})", pytrace=False)
        module = item.module
        qualname = item.originalname if item.cls is None else \
            f"{item.cls.__qualname__}.{item.originalname}"
        call = whole_test_child.TestCall(
            module=module.__name__, path=str(module.__file__), qualname=qualname, blob=blob,
            code=whole_test_child.module_code(str(module.__file__), item.config), unittest=unittest,
            log=_log_settings(item.config), render=self._render_settings(item.config))
        return call, {"test": whole_test_child.collect}

    def _render_settings(self, config: pytest.Config) -> failure_repr.RenderSettings:
        if self._render is None:
            self._render = failure_repr.RenderSettings.of(config)
        return self._render

    def _replay(self, item: pytest.Function, report: dict[str, Any]) -> None:
        """What the child recorded, where pytest in this process would have it."""
        for text, category, filename, lineno in report.get("warnings") or ():
            with contextlib.suppress(Exception):
                warnings.warn_explicit(text, category, filename, lineno)
        if report.get("log"):
            item.add_report_section("call", "log", report["log"])
        for name, args in report.get("replay") or ():
            item.funcargs[name](*args)
        for subtest in report.get("subtests") or ():
            _report_subtest(item, subtest)
        after = report.get("funcargs_after")
        if after:
            import cloudpickle

            with contextlib.suppress(Exception):
                for name, value in cloudpickle.loads(after).items():
                    _restore_in_place(item.funcargs[name], value)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
        """A failure of an isolated test shows the child's rendering of it: the test's own
        frames, the assertion detail (``harness.plugin.failure_repr``)."""
        report = yield
        longrepr = item.stash.get(LONGREPR_KEY, None)
        if longrepr is not None and call.when == "call":
            del item.stash[LONGREPR_KEY]
            if report.failed and call.excinfo is not None:
                report.longrepr = longrepr
        return report

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


class _SubtestFailed(Exception):
    """A failed subtest whose exception could not travel back: its type and message."""


def _report_subtest(item: pytest.Item, subtest: dict[str, Any]) -> None:
    """A unittest ``subTest`` of the child, reported as pytest 9 reports one in process
    (``TestCaseFunction.addSubTest``): a ``SubtestReport`` per subtest, failures with the
    child's rendering. Older pytest has no subtest reports: a failed one fails the test."""
    found = pytest_private.subtest_reports()
    if found is None:
        if subtest.get("failed"):
            pytest.fail(f"subtest {subtest.get('kwargs')}: {subtest.get('message')}",
                        pytrace=False)
        return
    excinfo = None
    if subtest.get("failed"):
        exc: BaseException = _SubtestFailed(subtest.get("message") or "subtest failed")
        with contextlib.suppress(Exception):
            exc = pickle.loads(subtest["exception"]) if subtest.get("exception") else exc
        try:
            raise exc
        except BaseException:  # noqa: BLE001 - only its ExceptionInfo is wanted
            excinfo = pytest.ExceptionInfo.from_current()
        if subtest.get("longrepr"):
            with contextlib.suppress(Exception):
                item.stash[LONGREPR_KEY] = pickle.loads(subtest["longrepr"])
    SubtestContext, SubtestReport = found  # noqa: N806
    call = pytest_private.call_info(excinfo)
    report = item.ihook.pytest_runtest_makereport(item=item, call=call)
    sub_report = SubtestReport._new(
        report, SubtestContext(msg=subtest.get("msg"), kwargs=subtest.get("kwargs") or {}),
        captured_output=None, captured_logs=None)
    item.ihook.pytest_runtest_logreport(report=sub_report)


def _qualname(exc: BaseException) -> str:
    return f"{type(exc).__module__}.{type(exc).__qualname__}"


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
