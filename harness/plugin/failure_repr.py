"""A whole test's failure, rendered in the isolated child exactly as pytest renders it.

Only the child has the failing frames, so the child renders: pytest's own traceback
filter (cut at the test function, ``__tracebackhide__``, unittest's frames) and its
``_repr_failure_py``, run on a stand-in item that answers what they read of an item and a
config from the parent's settings (``--tb``, ``-l``, ``-v``, ``--full-trace``). The result
is the report's ``longrepr`` as in-process pytest builds it (a ``ReprExceptionInfo``: it
pickles, and xdist serialises it), so the last traceback line names the test's file, JUnit
writes the same message and text, and the short summary reads the same.

Assertion detail: the rewritten assert asks ``_pytest.assertion.util._reprcompare`` for the
comparison ("At index 2 diff: 3 != 4", the full diff under ``-vv``); pytest sets it around
each test in its own process only, so the child sets it too: conftest
``pytest_assertrepr_compare`` hooks first, then pytest's own comparison, truncated as
pytest truncates.
"""

from __future__ import annotations

import contextlib
import inspect
import pickle
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from harness.plugin import pytest_private

#: the options pytest's rendering reads (``Node._repr_failure_py``, ``Function``'s filter)
OPTIONS = ("fulltrace", "tbstyle", "showlocals", "assertmode", "verbose", "doctestreport")
#: ini values the assertion explanation reads (truncation; the diff style of pytest 9.1+)
INI = ("truncation_limit_lines", "truncation_limit_chars", "assertion_text_diff_style")


@dataclass
class RenderSettings:
    """What of the parent's config the child's rendering needs (plain data: it pickles)."""

    options: dict[str, Any] = field(default_factory=dict)
    ini: dict[str, Any] = field(default_factory=dict)
    verbosity: dict[str, int] = field(default_factory=dict)
    invocation_dir: str = "."
    diff_style: str = "ndiff"
    markup: bool = False
    code_highlight: bool = False
    #: the parent had a terminal reporter (pytest then colours the diff as its writer does)
    reporter: bool = True
    #: conftest modules (name, file) that implement ``pytest_assertrepr_compare``
    compare_hooks: list[tuple[str, str]] = field(default_factory=list)

    @classmethod
    def of(cls, config: Any) -> RenderSettings:
        from pytest import Config

        settings = cls(invocation_dir=str(config.invocation_params.dir))
        for name in OPTIONS:
            settings.options[name] = config.getoption(name, None)
        for name in INI:
            with contextlib.suppress(ValueError, KeyError):
                settings.ini[name] = config.getini(name)
        settings.verbosity[""] = config.get_verbosity()
        settings.reporter = config.pluginmanager.has_plugin("terminalreporter")
        for kind in ("VERBOSITY_ASSERTIONS", "VERBOSITY_TEST_CASES"):
            if hasattr(Config, kind):
                settings.verbosity[getattr(Config, kind)] = \
                    config.get_verbosity(getattr(Config, kind))
        settings.diff_style = str(settings.ini.get("assertion_text_diff_style") or "ndiff")
        reporter = config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            writer = config.get_terminal_writer()
            settings.markup = bool(writer.hasmarkup)
            settings.code_highlight = bool(getattr(writer, "code_highlight", False))
        for module in conftest_modules(config):
            if callable(getattr(module, "pytest_assertrepr_compare", None)):
                settings.compare_hooks.append((module.__name__, str(module.__file__)))
        return settings


def conftest_modules(config: Any) -> list[Any]:
    """The conftest modules pytest loaded for ``config``, outermost first."""
    found = [p for p in config.pluginmanager.get_plugins()
             if getattr(p, "__file__", None) and Path(p.__file__).name == "conftest.py"]
    return sorted(found, key=lambda m: (len(Path(m.__file__).parts), m.__file__))


class _Config:
    """The parts of ``pytest.Config`` that pytest's failure rendering reads."""

    def __init__(self, settings: RenderSettings) -> None:
        self._settings = settings
        self.invocation_params = SimpleNamespace(dir=Path(settings.invocation_dir))
        self.option = SimpleNamespace(**settings.options)

    def getoption(self, name: str, default: Any = None, skip: bool = False) -> Any:
        value = self._settings.options.get(name)
        return default if value is None else value

    getvalue = getoption

    def getini(self, name: str) -> Any:
        return self._settings.ini.get(name)

    def get_verbosity(self, verbosity_type: str | None = None) -> int:
        verbosity = self._settings.verbosity
        return verbosity.get(verbosity_type or "", verbosity.get("", 0))

    @property
    def pluginmanager(self) -> Any:
        reporter = self._settings.reporter
        return SimpleNamespace(has_plugin=lambda name: reporter and name == "terminalreporter")

    def get_terminal_writer(self) -> Any:
        return pytest_private.terminal_writer(self._settings.markup,
                                              self._settings.code_highlight)


class _Node:
    """A stand-in for the test's item: pytest's filter and rendering run on it unchanged."""

    def __init__(self, config: _Config, obj: Any, unittest: bool) -> None:
        self.config = config
        self._obj = obj
        self.unittest = unittest

    @property
    def obj(self) -> Any:
        return self._obj

    def _traceback_filter(self, excinfo: Any) -> Any:
        traceback = pytest_private.traceback_filter(self, excinfo)
        if self.unittest:  # as TestCaseFunction: unittest's own frames are hidden
            kept = traceback.filter(lambda entry: not entry.frame.f_globals.get("__unittest"))
            traceback = kept or traceback
        return traceback

    def repr_failure(self, excinfo: Any) -> Any:
        style = self.config.getoption("tbstyle", "auto")
        return pytest_private.repr_failure_py(self, excinfo,
                                              "long" if style == "auto" else style)


def stand_in(settings: RenderSettings, obj: Any = None, unittest: bool = False) -> _Node:
    """The stand-in item whose config answers from ``settings``."""
    return _Node(_Config(settings), obj, unittest)


def render(exc: BaseException, obj: Any, settings: RenderSettings,
           unittest: bool = False) -> bytes | None:
    """``exc`` (raised by the test ``obj``) as pytest's pickled ``longrepr``; None when it
    cannot be rendered or sent (the parent then shows what it has)."""
    try:
        excinfo = pytest.ExceptionInfo.from_exception(exc)
        longrepr = stand_in(settings, obj, unittest).repr_failure(excinfo)
        return pickle.dumps(longrepr) if longrepr is not None else None
    except Exception:  # noqa: BLE001 - a failure to render must not hide the failure
        return None


class _AssertionHooks:
    """What pytest's assertion protocol calls on ``item.ihook``: the conftest
    ``pytest_assertrepr_compare`` hooks, outermost first, then pytest's own (as pluggy
    calls them: every result, the first non-empty one wins)."""

    def __init__(self, settings: RenderSettings, own: Callable[..., Any],
                 load: Callable[[str, str, None], Any]) -> None:
        self._settings, self._own, self._load = settings, own, load
        self.pytest_assertion_pass = SimpleNamespace(get_hookimpls=lambda: [])

    def pytest_assertrepr_compare(self, config: Any, op: str, left: object,
                                  right: object) -> list[Any]:
        given = {"config": config, "op": op, "left": left, "right": right}
        results = []
        for name, file in self._settings.compare_hooks:
            hook = getattr(_conftest(name, file, self._load), "pytest_assertrepr_compare",
                           None)
            if hook is not None:
                wanted = inspect.signature(hook).parameters
                results.append(hook(**{k: v for k, v in given.items() if k in wanted}))
        results.append(self._own(**given))
        return [r for r in results if r is not None]


@contextlib.contextmanager
def assertion_detail(settings: RenderSettings, load: Callable[[str, str, None], Any]
                     ) -> Iterator[None]:
    """Around the test in the child: pytest's own assertion protocol (``util._reprcompare``
    set to its ``callbinrepr``, truncation included), driven on a stand-in item whose
    config answers from the parent's settings, so the diff is pytest's in every version.
    ``load(name, file, None)`` imports a conftest that is not loaded yet. Where pytest's
    hooks differ in shape, the test runs without the diff (its outcome unchanged)."""
    found = pytest_private.assertion_protocol()
    if found is None:
        yield
        return
    protocol, own = found
    config = _Config(settings)
    item = SimpleNamespace(config=config, ihook=_AssertionHooks(settings, own, load))
    wrapper = protocol(item)
    try:
        next(wrapper)
    except Exception:  # noqa: BLE001 - no diff rather than no test
        yield
        return
    try:
        yield
    finally:
        wrapper.close()


def _conftest(name: str, file: str, load: Callable[[str, str, None], Any]) -> Any:
    module = sys.modules.get(name)
    if module is not None and getattr(module, "__file__", None) == file:
        return module
    with contextlib.suppress(Exception):
        return load(name, file, None)
    return None


def ending(path: str, fallback_line: int, message: str, stack: str) -> Any:
    """Parent side: the longrepr of a child that crashed or timed out (no exception to
    render): the message, located at the test file's innermost frame in the child's
    faulthandler stack (else at the test's own line), so ``--tb=line``, CI annotations and
    JUnit point at the test, not at the plugin."""
    import re

    lineno = fallback_line
    for found in re.finditer(r'File "([^"]+)", line (\d+)', stack):
        if found.group(1) == path:
            lineno = int(found.group(2))
            break  # faulthandler lists the most recent call first
    first = message.splitlines()[0] if message else "isolated child failed"
    lines = [line + "\n" for line in message.splitlines()]
    return pytest_private.native_longrepr(lines, path, lineno, first)
