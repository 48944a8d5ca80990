"""The child side of whole-test isolation (``--isolate-all``, ``@pytest.mark.isolated``).

A test must behave in the child as it would in the pytest process, so the child:

- imports the test's module under its own name from its file, with pytest's assertion
  rewriting (module-level functions and classes keep their identity: a
  ``multiprocessing.Pool`` over them, ``pickle.dumps`` of them, ``sys.modules[__module__]``
  all work), and runs the test function *as collected*: decorators such as
  ``@mock.patch`` and ``@mock.patch.dict(os.environ, ...)`` apply to the child's objects;
- runs it under the parent's warning filters at call time (``-W``, ini ``filterwarnings``,
  ``@pytest.mark.filterwarnings``): ``error`` fails the same tests; the warnings it
  records go back to the parent, which re-issues them into pytest's summary;
- builds the capture fixtures itself (``capsys``, ``capsysbinary``, ``capfd``,
  ``capfdbinary``, ``caplog``, ``recwarn``, ``monkeypatch``), since the parent's are bound to
  the parent's streams; ``record_property`` and friends are recorded and replayed by the
  parent; log records at pytest's level come back as the report's "Captured log" section;
- sends back the fixture values after the test, so that a yield fixture's teardown sees
  what the test changed in a dict, list, set or plain object it received.

unittest.TestCase tests run as a one-test suite (so ``setUpClass`` and ``setUpModule`` run
in the child; pytest also runs ``setUpClass`` in the parent, as it sets up the class).
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import logging
import marshal
import os
import sys
import unittest
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.isolation.child import _pack
from harness.plugin import failure_repr, fixture_views, pytest_private

#: fixtures the child builds for itself (the parent's are bound to the parent's process)
CHILD_BUILT = ("capsys", "capsysbinary", "capfd", "capfdbinary", "caplog", "recwarn",
               "monkeypatch")
#: fixtures whose calls the child records and the parent replays on its own fixture value
REPLAYED = ("record_property", "record_xml_attribute", "record_testsuite_property")

#: what the child reports about the test (filled while it runs; see ``collect``)
_report: dict[str, Any] | None = None


@contextlib.contextmanager
def collect() -> Iterator[dict[str, Any]]:
    """Child-side context around the test: what ``TestCall`` records comes back in the
    result's extras (``harness.isolation.child.execute``), even when the test raises."""
    global _report
    _report = {}
    try:
        yield _report
    finally:
        _report = None


def current_report() -> dict[str, Any]:
    """What the running test reports back (a throwaway dict outside ``collect``)."""
    return _report if _report is not None else {}


def travels(value: Any) -> bool:
    """Whether ``value`` can be sent to (and rebuilt in) another process."""
    return _pack(value)[0] is not None


def import_test_module(name: str, path: str, code: bytes | None) -> Any:
    """The test module ``name`` run from ``code`` (``module_code``: marshalled, asserts
    rewritten) or, without it, compiled from ``path``; registered under its name."""
    module = sys.modules.get(name)
    if module is not None and getattr(module, "__file__", None) == path:
        return module
    package = name.rpartition(".")[0]
    if package:
        with contextlib.suppress(ImportError):  # importlib mode: no package on sys.path
            importlib.import_module(package)
    if code is not None:
        compiled = marshal.loads(code)
    else:
        compiled = compile(Path(path).read_bytes(), path, "exec", dont_inherit=True)
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        exec(compiled, module.__dict__)  # noqa: S102 - the test module, as pytest imports it
    except BaseException:
        sys.modules.pop(name, None)
        raise
    if package and package in sys.modules:
        setattr(sys.modules[package], name.rpartition(".")[2], module)
    return module


_codes: dict[tuple[str, int, int], bytes] = {}


def module_code(path: str, config: Any) -> bytes | None:
    """Parent side: the module's code with asserts rewritten as pytest's import rewrote them,
    marshalled; made once per file and session (rewriting a 100-test module costs about
    145 ms: per test that would be most of the isolation's cost). None: ``--assert=plain``."""
    if config.getoption("assertmode") != "rewrite":
        return None
    stat = os.stat(path)
    key = (path, stat.st_mtime_ns, stat.st_size)
    if key not in _codes:
        code = (_rewritten.pop(key, None) or pytest_private.cached_rewrite(Path(path))
                or pytest_private.rewritten(path, config))
        _codes[key] = marshal.dumps(code)
    return _codes[key]


#: the code pytest's import hook rewrote this session, by (file, mtime, size)
_rewritten: dict[tuple[str, int, int], Any] = {}


def remember_rewrites() -> None:
    """Keep the code pytest's import hook rewrites while it collects, so that
    ``module_code`` need not rewrite a test module a second time (without a pyc cache,
    ``PYTHONDONTWRITEBYTECODE``, that was about 1.5 s for toolz's 12 modules, 8 ms a test).
    Where pytest's internals differ, nothing is kept and ``module_code`` rewrites."""

    def store(fn: Path, code: Any) -> None:
        stat = os.stat(fn)
        _rewritten[(str(fn), stat.st_mtime_ns, stat.st_size)] = code

    pytest_private.remember_rewrites(store)


@dataclass
class TestCall:
    """A collected test, shipped by reference: module name and file, the attribute path of
    the test (``test_x``, ``TestClass.test_x``), and the rest pickled as one blob that is
    read only after the module is imported (so its classes resolve to the real ones)."""

    module: str
    path: str
    qualname: str
    blob: bytes
    code: bytes | None = None
    unittest: bool = False
    log: dict[str, Any] = field(default_factory=dict)
    #: the parent's rendering settings: a failure comes back rendered as pytest renders it
    render: failure_repr.RenderSettings | None = None

    __test__ = False  # not a test class, whatever pytest's patterns say

    def __call__(self) -> Any:
        import cloudpickle

        module = import_test_module(self.module, self.path, self.code)
        data = cloudpickle.loads(self.blob)
        report = current_report()
        detail = (failure_repr.assertion_detail(self.render, import_test_module)
                  if self.render is not None else contextlib.nullcontext())
        with warnings.catch_warnings(record=True) as caught, \
                _log_capture(self.log, report) as caplog_stash, detail:
            warnings.filters[:] = data["filters"]
            try:
                if self.unittest:
                    return _run_unittest(module, self.qualname, self.render, report)
                fn = _resolve(module, self.qualname, data.get("instance"))
                with contextlib.ExitStack() as stack:
                    kwargs = dict(data["funcargs"])
                    kwargs.update(_child_built(data["child_built"], stack, caplog_stash))
                    kwargs.update(_replayed(data["replayed"], report))
                    kwargs.update(fixture_views.bound(data.get("in_process") or {}, fn,
                                                      module))
                    try:
                        return fn(**kwargs)
                    except BaseException as exc:
                        if self.render is not None and _rendered(exc):
                            report["longrepr"] = failure_repr.render(exc, fn, self.render)
                        raise
                    finally:
                        # what does not travel back stays as it was in the parent
                        report["funcargs_after"] = _pack(data["funcargs"])[0]
            finally:
                report["warnings"] = [_warning_record(w) for w in caught]


def _rendered(exc: BaseException) -> bool:
    """Whether pytest would show ``exc`` as a failure (not a skip, an xfail or an exit)."""
    import pytest

    if isinstance(exc, (SystemExit, KeyboardInterrupt)):
        return False
    return not isinstance(exc, (pytest.skip.Exception, pytest.xfail.Exception))


def _resolve(module: Any, qualname: str, instance: Any) -> Any:
    if instance is not None:
        return getattr(instance, qualname.rpartition(".")[2])
    obj = module
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def _warning_record(w: warnings.WarningMessage) -> tuple[str, Any, str, int]:
    """A recorded warning as it travels back: a category that cannot, as UserWarning."""
    category = w.category if _pack(w.category)[0] is not None else UserWarning
    return str(w.message), category, str(w.filename), int(w.lineno or 0)


def _child_built(names: list[str], stack: contextlib.ExitStack, caplog_stash: Any
                 ) -> dict[str, Any]:
    built: dict[str, Any] = {}
    for name in names:
        if name in ("capsys", "capsysbinary", "capfd", "capfdbinary"):
            fixture = pytest_private.capture_fixture(name)
            stack.callback(fixture.close)
            built[name] = fixture
        elif name == "recwarn":
            built[name] = stack.enter_context(pytest_private.warnings_recorder())
        elif name == "caplog":
            fixture = pytest_private.log_capture_fixture(caplog_stash)
            stack.callback(fixture._finalize)
            built[name] = fixture
        elif name == "monkeypatch":
            import pytest

            patcher = pytest.MonkeyPatch()
            stack.callback(patcher.undo)
            built[name] = patcher
    return built


def _replayed(names: list[str], report: dict[str, Any]) -> dict[str, Any]:
    calls: list[tuple[str, tuple[Any, ...]]] = report.setdefault("replay", [])

    def recorder(name: str) -> Any:
        def record(*args: Any) -> None:
            calls.append((name, args))
        return record

    return {name: recorder(name) for name in names}


class _StashHolder:
    """What ``LogCaptureFixture`` needs of an item: a stash with its handler and records."""

    def __init__(self) -> None:
        import pytest

        self.stash = pytest.Stash()


@contextlib.contextmanager
def _log_capture(log: dict[str, Any], report: dict[str, Any]) -> Iterator[Any]:
    """pytest's two log handlers, as its logging plugin installs them around a test: one
    for the report's "Captured log" section, one for ``caplog``."""
    handlers = pytest_private.log_handlers()
    if not log or handlers is None:  # -p no:logging (pytest captures nothing), or drift
        yield None
        return
    LogCaptureHandler, caplog_handler_key, caplog_records_key = handlers  # noqa: N806

    level = log.get("level")
    root = logging.getLogger()
    report_handler = LogCaptureHandler()
    report_handler.setFormatter(logging.Formatter(log.get("format"), log.get("datefmt")))
    caplog_handler = LogCaptureHandler()
    holder = _StashHolder()
    holder.stash[caplog_handler_key] = caplog_handler
    holder.stash[caplog_records_key] = {"call": caplog_handler.records}
    saved_level = root.level
    for handler in (report_handler, caplog_handler):
        if level is not None:
            handler.setLevel(level)
        root.addHandler(handler)
    if level is not None and level < root.level:
        root.setLevel(level)
    try:
        yield holder
    finally:
        for handler in (report_handler, caplog_handler):
            root.removeHandler(handler)
        root.setLevel(saved_level)
        report["log"] = report_handler.stream.getvalue().strip()


def _run_unittest(module: Any, qualname: str, render: failure_repr.RenderSettings | None,
                  report: dict[str, Any]) -> None:
    """Run one TestCase method as a suite (class and module fixtures included) and end as
    pytest would report it: failed with the test's own exception, skipped, xfailed; each
    ``subTest`` comes back as pytest reports it (``report["subtests"]``), and a failing
    subtest does not fail the test itself (as in pytest 9)."""
    import pytest

    cls_name, _, method = qualname.rpartition(".")
    cls = _resolve(module, cls_name, None)
    obj = getattr(cls, method, None)
    cls_result = _UnittestResult if pytest_private.subtest_reports() else _NoSubtestsResult
    result = cls_result(render, obj, report)
    unittest.TestSuite([cls(method)]).run(result)
    if result.raw:
        kind, value, tb = result.raw[0]
        if render is not None:
            value = value if value is not None else kind()
            report["longrepr"] = failure_repr.render(value.with_traceback(tb), obj, render,
                                                     True)
        raise value.with_traceback(tb)
    if result.unexpectedSuccesses:
        pytest.fail("Unexpected success", pytrace=False)
    if result.expectedFailures:
        pytest.xfail(_last_line(result.expectedFailures[0][1]))
    if result.skipped:
        pytest.skip(result.skipped[0][1])


class _UnittestResult(unittest.TestResult):
    """A ``unittest.TestResult`` that keeps the raw exceptions (pytest renders them from
    their frames) and the subtests, rendered while their frames still exist."""

    def __init__(self, render: failure_repr.RenderSettings | None, obj: Any,
                 report: dict[str, Any]) -> None:
        super().__init__()
        self.raw: list[Any] = []
        self._render, self._obj = render, obj
        self._subtests: list[dict[str, Any]] = report.setdefault("subtests", [])

    # Not TestResult's own: it cuts unittest's frames off the traceback in place, where
    # pytest (whose item is the result in process) keeps them
    def addError(self, test: Any, err: Any) -> None:  # noqa: N802 - unittest's names
        self.raw.append(err)

    def addFailure(self, test: Any, err: Any) -> None:  # noqa: N802
        self.raw.append(err)

    def addSubTest(self, test: Any, subtest: Any, err: Any) -> None:  # noqa: N802
        from unittest.case import _subtest_msg_sentinel  # type: ignore[attr-defined]

        entry: dict[str, Any] = {
            "msg": None if subtest._message is _subtest_msg_sentinel else str(subtest._message),
            "kwargs": dict(subtest.params), "failed": err is not None}
        if err is not None:
            entry["exception"] = _pack(err[1])[0]
            entry["message"] = f"{err[0].__name__}: {err[1]}"
            if self._render is not None:
                entry["longrepr"] = failure_repr.render(
                    err[1].with_traceback(err[2]), self._obj, self._render, True)
        self._subtests.append(entry)


class _NoSubtestsResult(_UnittestResult):
    """pytest 8's in-process result (its ``TestCaseFunction``) has no ``addSubTest``:
    unittest's ``subTest`` is then a plain block and the first failure ends the test. The
    same here, so that the outcome and the text are pytest 8's."""

    def __getattribute__(self, name: str) -> Any:
        if name == "addSubTest":
            raise AttributeError(name)
        return super().__getattribute__(name)


def _last_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else "expected failure"
