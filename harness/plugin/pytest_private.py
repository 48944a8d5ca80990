"""pytest's private internals that the harness uses: here and nowhere else.

Whole-test isolation has to do in a child what pytest does in its own process (rewrite a
module's asserts, build ``capsys``, render a failure, run a doctest), and pytest offers no
public API for most of it. Each use below is reached through one accessor that checks the
shape it needs (a name, a signature, a return type) before using it, and falls back to
something that keeps the verdict right: a lost assertion diff or "Captured log" section is
acceptable, a collection error or a wrong outcome is not. Where no fallback can keep the
outcome (a fixture the child cannot build), the accessor raises ``PrivateDrift``, whose
message names the pytest version and the way out; the verdict layer files it as the
harness's own failure, never the release's.

``USES`` declares every use to the harness's own guard, as we ask users to declare their
patches: ``drift()`` names each one this pytest does not have in the shape we use, the
session header prints them, and ``tests/test_pytest_private.py`` fails on any (the
compatibility job runs it on the oldest and newest pytest of the declared range).
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import io
import types
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest


class PrivateDrift(RuntimeError):
    """A pytest internal the harness needs is missing or changed, with no fallback."""


@dataclass(frozen=True)
class PrivateUse:
    """One use of a pytest internal: where it is, what for, and what happens without it."""

    name: str
    why: str
    fallback: str
    #: None when the installed pytest has it in the shape we use, else what differs
    check: Callable[[], str | None]


def _module(name: str) -> Any:
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


def _attr(dotted: str) -> Any:
    """``module:attr.attr`` of the installed pytest, or None."""
    module_name, _, attrs = dotted.partition(":")
    obj = _module(module_name)
    for part in attrs.split(".") if attrs else ():
        obj = getattr(obj, part, None)
    return obj


def _params(fn: Any) -> list[str]:
    try:
        return list(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return []


def _has(dotted: str, *params: str) -> Callable[[], str | None]:
    def check() -> str | None:
        obj = _attr(dotted)
        if obj is None:
            return f"{dotted} is missing"
        missing = [p for p in params if p not in _params(obj)]
        return f"{dotted} takes no {', '.join(missing)}" if missing else None
    return check


def _all(*checks: Callable[[], str | None]) -> Callable[[], str | None]:
    def check() -> str | None:
        found = [r for r in (c() for c in checks) if r]
        return "; ".join(found) or None
    return check


# --- assertion rewriting (the child runs the module pytest's import hook rewrote) ---------

REWRITE = "_pytest.assertion.rewrite"


def remember_rewrites(store: Callable[[Path, types.CodeType], None]) -> bool:
    """Wrap pytest's ``_rewrite_test`` so each module it rewrites while collecting is also
    given to ``store`` (saves rewriting it again for the child). The wrapper reads only the
    code object from pytest's result (pytest 9.1 returned ``(stat, code)``, 9.2
    ``(source_hash, code)``) and returns the result untouched. False: not wrapped."""
    rewrite = _module(REWRITE)
    original = getattr(rewrite, "_rewrite_test", None)
    if not callable(original) or len(_params(original)) != 2:
        return False
    if getattr(original, "_npu_regress", False):
        return True

    def _rewrite_test(fn: Any, config: Any) -> Any:
        result = original(fn, config)
        if isinstance(result, tuple) and result and isinstance(result[-1], types.CodeType):
            with contextlib.suppress(Exception):
                store(Path(fn), result[-1])
        return result

    _rewrite_test._npu_regress = True  # type: ignore[attr-defined]
    _rewrite_test.__wrapped__ = original  # type: ignore[attr-defined]
    rewrite._rewrite_test = _rewrite_test
    return True


def cached_rewrite(path: Path) -> types.CodeType | None:
    """The code pytest's import hook rewrote and cached for ``path`` (its pyc, which
    ``_read_pyc`` checks against the source itself), or None."""
    rewrite = _module(REWRITE)
    try:
        pyc = rewrite.get_cache_dir(path) / (path.name[:-3] + rewrite.PYC_TAIL)
        code = rewrite._read_pyc(path, pyc)
    except Exception:  # noqa: BLE001 - no usable cache: the caller rewrites
        return None
    return code if isinstance(code, types.CodeType) else None


def rewritten(path: str, config: Any) -> types.CodeType:
    """``path`` compiled with its asserts rewritten as pytest rewrites them; without
    pytest's rewriter, compiled plainly (the assertion diff is lost, the outcome is not)."""
    import ast

    source = Path(path).read_bytes()
    tree = ast.parse(source, filename=path)
    rewrite_asserts = getattr(_module(REWRITE), "rewrite_asserts", None)
    if callable(rewrite_asserts):
        with contextlib.suppress(TypeError):
            rewrite_asserts(tree, source, path, config)
    return compile(tree, path, "exec", dont_inherit=True)


def assertion_protocol() -> tuple[Callable[..., Any], Callable[..., Any]] | None:
    """pytest's own ``pytest_runtest_protocol`` of the assertion plugin (sets
    ``util._reprcompare`` around a test) and its ``pytest_assertrepr_compare``: the child
    runs both on a stand-in item, so the diff is pytest's own in every version. None:
    the shapes differ (the child then shows the assertion without the diff)."""
    assertion = _module("_pytest.assertion")
    protocol = getattr(assertion, "pytest_runtest_protocol", None)
    compare = getattr(assertion, "pytest_assertrepr_compare", None)
    if not (inspect.isgeneratorfunction(protocol) and callable(compare)
            and _params(protocol) == ["item"]
            and {"config", "op", "left", "right"} <= set(_params(compare))):
        return None
    return protocol, compare


def terminal_writer(markup: bool, code_highlight: bool) -> Any:
    """A terminal writer on a string (its ``_highlight`` is what the diff is coloured with);
    a plain stand-in where pytest's is not to be had."""
    cls = _attr("_pytest._io:TerminalWriter")
    if cls is not None:
        with contextlib.suppress(Exception):
            writer = cls(file=io.StringIO())
            writer.hasmarkup = markup
            writer.code_highlight = code_highlight
            return writer
    return types.SimpleNamespace(hasmarkup=False, code_highlight=False,
                                 _highlight=lambda source, lexer="python": source)


# --- the child's fixtures -------------------------------------------------------------------

_CAPTURES = {"capsys": "SysCapture", "capsysbinary": "SysCaptureBinary",
             "capfd": "FDCapture", "capfdbinary": "FDCaptureBinary"}


def _fixture_drift(name: str, what: str) -> PrivateDrift:
    return PrivateDrift(
        f"npu-regress cannot build `{name}` in the isolated child on pytest "
        f"{pytest.__version__} ({what}): a harness gap, not the test's failure. Run this "
        "test in the pytest process (@pytest.mark.isolated(False)), or use a pytest the "
        "harness is tested with (ci/constraints.txt).")


def capture_fixture(name: str) -> Any:
    """A started ``capsys``/``capfd`` (and the binary ones) of the child's own streams."""
    capture = _module("_pytest.capture")
    cls = getattr(capture, _CAPTURES[name], None)
    fixture_cls = getattr(capture, "CaptureFixture", None)
    if cls is None or fixture_cls is None:
        raise _fixture_drift(name, f"_pytest.capture.{_CAPTURES[name]} is missing")
    try:
        fixture = fixture_cls(cls, None, _ispytest=True)
        fixture._start()
    except (TypeError, AttributeError) as exc:
        raise _fixture_drift(name, f"CaptureFixture: {exc}") from None
    return fixture


def warnings_recorder() -> Any:
    """``recwarn``: pytest's public ``WarningsRecorder`` type, built as its fixture does."""
    try:
        return pytest.WarningsRecorder(_ispytest=True)
    except TypeError as exc:
        raise _fixture_drift("recwarn", str(exc)) from None


def log_handlers() -> tuple[Any, Any, Any] | None:
    """(``LogCaptureHandler``, the caplog handler's and records' stash keys), or None:
    then the child captures no logs (no "Captured log" section; ``caplog`` raises)."""
    logging_plugin = _module("_pytest.logging")
    found = tuple(getattr(logging_plugin, n, None) for n in
                  ("LogCaptureHandler", "caplog_handler_key", "caplog_records_key"))
    return found if all(x is not None for x in found) else None  # type: ignore[return-value]


def log_capture_fixture(holder: Any) -> Any:
    """``caplog`` over ``holder`` (an object with the stash ``log_handlers`` keys fill)."""
    if holder is None or log_handlers() is None:
        raise _fixture_drift("caplog", "pytest's logging plugin internals are missing")
    try:
        return pytest.LogCaptureFixture(holder, _ispytest=True)
    except TypeError as exc:
        raise _fixture_drift("caplog", str(exc)) from None


def log_settings(config: Any) -> dict[str, Any]:
    """pytest's log level and format for the "Captured log" section ({}: none)."""
    level_of = _attr("_pytest.logging:get_log_level_for_setting")
    option_ini = _attr("_pytest.logging:get_option_ini")
    if not (callable(level_of) and callable(option_ini)):
        return {}
    try:
        return {"level": level_of(config, "log_level"),
                "format": option_ini(config, "log_format"),
                "datefmt": option_ini(config, "log_date_format")}
    except (ValueError, AttributeError, TypeError):  # -p no:logging: pytest captures none
        return {}


# --- item kinds, doctests, subtests ---------------------------------------------------------

def _is(item: Any, dotted: str) -> bool:
    cls = _attr(dotted)
    if isinstance(cls, type):
        return isinstance(item, cls)
    # the class moved: know it by name along the item's classes
    wanted = dotted.rpartition(".")[2].rpartition(":")[2]
    return any(c.__name__ == wanted for c in type(item).__mro__)


def is_doctest(item: Any) -> bool:
    return _is(item, "_pytest.doctest:DoctestItem")


def is_doctest_textfile(node: Any) -> bool:
    return _is(node, "_pytest.doctest:DoctestTextfile")


def is_unittest(item: Any) -> bool:
    return _is(item, "_pytest.unittest:TestCaseFunction")


DOCTEST_NAMES = ("_check_all_skipped", "_get_runner", "_get_checker",
                 "MultipleDoctestFailures", "DoctestItem", "DoctestTextfile")


def doctest_module() -> Any:
    """pytest's doctest plugin module, with everything the isolated doctest uses."""
    doctest_plugin = _module("_pytest.doctest")
    missing = [n for n in DOCTEST_NAMES if not hasattr(doctest_plugin, n)]
    if missing:
        raise PrivateDrift(
            f"npu-regress cannot run a doctest in the isolated child on pytest "
            f"{pytest.__version__} (_pytest.doctest lacks {', '.join(missing)}): a harness "
            "gap. Run doctests without --isolate-all.")
    return doctest_plugin


def subtest_reports() -> tuple[Any, Any] | None:
    """(``SubtestContext``, ``SubtestReport``) of pytest 9's unittest subtests, or None
    (pytest 8: a failed subtest fails its test, as pytest 8 reports it in process)."""
    context = _attr("_pytest.subtests:SubtestContext")
    report = _attr("_pytest.subtests:SubtestReport")
    if context is None or not callable(getattr(report, "_new", None)):
        return None
    return context, report


def call_info(excinfo: Any) -> Any:
    """A ``pytest.CallInfo`` of the call phase (the constructor is private)."""
    return pytest.CallInfo[None](None, excinfo, start=0, stop=0, duration=0, when="call",
                                 _ispytest=True)


# --- rendering a failure as pytest does -----------------------------------------------------

def traceback_filter(node: Any, excinfo: Any) -> Any:
    """``Function._traceback_filter`` on a stand-in node; the whole traceback without it."""
    fn = getattr(pytest.Function, "_traceback_filter", None)
    return fn(node, excinfo) if callable(fn) else excinfo.traceback


def repr_failure_py(node: Any, excinfo: Any, style: str) -> Any:
    """``Node._repr_failure_py`` on a stand-in node (None: the parent renders)."""
    fn = getattr(pytest.Item, "_repr_failure_py", None)
    return fn(node, excinfo, style=style) if callable(fn) else None


def native_longrepr(lines: list[str], path: str, lineno: int, first: str) -> Any:
    """A ``ReprExceptionInfo`` that shows ``lines`` located at ``path:lineno``, or the
    plain text (pytest reports a string longrepr as it is)."""
    code = _module("_pytest._code.code")
    try:
        return code.ReprExceptionInfo(reprtraceback=code.ReprTracebackNative(lines),
                                      reprcrash=code.ReprFileLocation(path, lineno, first))
    except Exception:  # noqa: BLE001 - the text still says what happened
        return f"{path}:{lineno}: {first}\n" + "".join(lines)


# --- the session ----------------------------------------------------------------------------

def junit_xml(config: Any) -> Any:
    """The session's JUnit XML writer (``--junitxml``), or None."""
    key = _attr("_pytest.junitxml:xml_key")
    return config.stash.get(key, None) if key is not None else None


def fresh_setup_state() -> Any:
    """A new ``SetupState`` (the forked probe sets up only itself), or None."""
    cls = _attr("_pytest.runner:SetupState")
    try:
        return cls() if cls is not None else None
    except TypeError:
        return None


USES: tuple[PrivateUse, ...] = (
    PrivateUse("_pytest.assertion.rewrite._rewrite_test",
               "keep the code pytest rewrote while collecting (no second rewrite per file)",
               "not wrapped: the child's module is rewritten once more (slower, same result)",
               _has(f"{REWRITE}:_rewrite_test", "fn", "config")),
    PrivateUse("_pytest.assertion.rewrite._read_pyc, get_cache_dir, PYC_TAIL",
               "read the rewritten module from pytest's pyc cache",
               "rewritten again from the source (slower, same result)",
               _all(_has(f"{REWRITE}:_read_pyc", "source", "pyc"),
                    _has(f"{REWRITE}:get_cache_dir"), _has(f"{REWRITE}:PYC_TAIL"))),
    PrivateUse("_pytest.assertion.rewrite.rewrite_asserts",
               "rewrite a test module's asserts for the child",
               "compiled plainly: the assertion diff is lost, the outcome is not",
               _has(f"{REWRITE}:rewrite_asserts", "mod", "source", "module_path", "config")),
    PrivateUse("_pytest.assertion.pytest_runtest_protocol, pytest_assertrepr_compare",
               "pytest's own assertion explanation around the test in the child",
               "the assertion without pytest's diff",
               lambda: None if assertion_protocol() is not None
               else "_pytest.assertion's hooks differ in shape"),
    PrivateUse("_pytest._io.TerminalWriter", "highlight the diff as the parent would",
               "no colour", _has("_pytest._io:TerminalWriter")),
    PrivateUse("_pytest.capture.CaptureFixture, SysCapture, FDCapture (+Binary)",
               "capsys/capfd in the child",
               "none: the test fails as a harness gap naming the fixture",
               _all(_has("_pytest.capture:CaptureFixture", "captureclass", "request"),
                    *(_has(f"_pytest.capture:{c}") for c in _CAPTURES.values()))),
    PrivateUse("pytest.WarningsRecorder(_ispytest=True)", "recwarn in the child",
               "none: the test fails as a harness gap naming the fixture",
               _has("pytest:WarningsRecorder", "_ispytest")),
    PrivateUse("_pytest.logging.LogCaptureHandler, caplog_handler_key, caplog_records_key",
               "caplog and the \"Captured log\" section in the child",
               "no captured log section; caplog fails as a harness gap",
               lambda: None if log_handlers() is not None else "names missing"),
    PrivateUse("_pytest.logging.get_log_level_for_setting, get_option_ini",
               "the log level and format the child captures with",
               "no captured log section",
               _all(_has("_pytest.logging:get_log_level_for_setting"),
                    _has("_pytest.logging:get_option_ini"))),
    PrivateUse("_pytest.doctest (runner, checker, item classes)", "doctests in the child",
               "none: an isolated doctest fails as a harness gap",
               lambda: (None if all(hasattr(_module("_pytest.doctest"), n)
                                    for n in DOCTEST_NAMES) else "names missing")),
    PrivateUse("_pytest.unittest.TestCaseFunction", "tell unittest items apart",
               "known by class name", _has("_pytest.unittest:TestCaseFunction")),
    PrivateUse("_pytest.subtests.SubtestContext, SubtestReport._new",
               "report a unittest subTest as pytest 9 does",
               "a failed subtest fails its test (as pytest 8 reports it)",
               lambda: None if subtest_reports() is not None
               or int(pytest.__version__.split(".")[0]) < 9 else "names missing"),
    PrivateUse("pytest.CallInfo(..., _ispytest=True)", "a subtest's report",
               "none (pytest 9 only)", _has("pytest:CallInfo", "_ispytest")),
    PrivateUse("pytest.Function._traceback_filter, pytest.Item._repr_failure_py",
               "render the child's failure as pytest does",
               "the traceback unfiltered / rendered by the parent",
               _all(_has("pytest:Function._traceback_filter", "excinfo"),
                    _has("pytest:Item._repr_failure_py", "excinfo", "style"))),
    PrivateUse("_pytest._code.code.ReprExceptionInfo, ReprTracebackNative, ReprFileLocation",
               "a crashed child's failure located at the test",
               "the failure as plain text",
               _all(_has("_pytest._code.code:ReprExceptionInfo", "reprtraceback", "reprcrash"),
                    _has("_pytest._code.code:ReprTracebackNative"),
                    _has("_pytest._code.code:ReprFileLocation", "path", "lineno", "message"))),
    PrivateUse("_pytest.junitxml.xml_key", "the stack manifest as JUnit global properties",
               "the manifest in the results file only", _has("_pytest.junitxml:xml_key")),
    PrivateUse("_pytest.runner.SetupState, Session._setupstate",
               "the pytest-forked probe sets up only itself",
               "no probe: forked tests run as pytest-forked runs them",
               _has("_pytest.runner:SetupState")),
)


def drift() -> list[tuple[PrivateUse, str]]:
    """Each declared use the installed pytest does not have in the shape we use."""
    found = []
    for use in USES:
        try:
            problem = use.check()
        except Exception as exc:  # noqa: BLE001 - a check that breaks is drift too
            problem = f"{type(exc).__name__}: {exc}"
        if problem:
            found.append((use, problem))
    return found
