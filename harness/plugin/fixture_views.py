"""Read-only views of the pytest process's own fixtures, for an isolated whole test.

``request``, ``pytestconfig`` and ``tmp_path_factory`` are bound to the pytest process and
do not pickle, yet real suites take them everywhere, mostly to read: ``request.node``'s
name and markers, ``request.param``, ``pytestconfig.getoption``, a temporary folder. The
child gets a picture of what can be read (taken in the parent before the test), and a
``tmp_path_factory`` that makes its folders under the session's base folder. What cannot
cross a process boundary (``getfixturevalue``, ``addfinalizer``, the plugin manager) fails
with one line that names it and the way out.
"""

from __future__ import annotations

import copy
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from harness.isolation.child import _pack

#: fixtures of the pytest process that an isolated test gets a view of
VIEWED = ("request", "pytestconfig", "tmp_path_factory", "tmpdir_factory")

_NOTSET = object()
_CONFIG_VIEW: Any = None  # set below: a pytest.StashKey (pytest is imported lazily)
_WAY_OUT = ("keep this test in the pytest process with @pytest.mark.isolated(False)")


def _unavailable(what: str, has: str) -> AttributeError:
    return AttributeError(f"{what} is not available in an isolated test: it belongs to the "
                          f"pytest process (this view has {has}); {_WAY_OUT}")


def _portable(value: Any) -> bool:
    """Whether ``value`` travels to the child (what does not is left out of the view)."""
    return _pack(value)[0] is not None


class _View:
    """A read-only picture: any other attribute is refused in one line naming it."""

    _HAS = ""
    _NAME = ""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        raise _unavailable(f"{self._NAME}.{name}", self._HAS)


class ConfigView(_View):
    """``pytestconfig`` / ``request.config`` as read in the child."""

    _NAME = "pytestconfig"
    _HAS = "option, getoption, getini, getvalue, get_verbosity, rootpath, inipath, args, " \
        "invocation_params"

    def __init__(self, config: Any) -> None:
        self.option = SimpleNamespace(**{k: v for k, v in vars(config.option).items()
                                         if _portable(v)})
        self._ini: dict[str, Any] = {}
        for name in getattr(getattr(config, "_parser", None), "_inidict", {}):
            try:
                value = config.getini(name)
            except (ValueError, KeyError):
                continue
            if _portable(value):
                self._ini[name] = value
        self._verbosity = {"": config.get_verbosity()}
        for kind in ("assertions", "test_cases"):
            try:
                self._verbosity[kind] = config.get_verbosity(kind)
            except (KeyError, ValueError, TypeError):
                continue
        self.rootpath = Path(config.rootpath)
        self.inipath = Path(config.inipath) if config.inipath else None
        self.args = list(config.args)
        params = config.invocation_params
        self.invocation_params = SimpleNamespace(args=tuple(params.args), plugins=None,
                                                 dir=Path(params.dir))

    def getoption(self, name: str, default: Any = _NOTSET, skip: bool = False) -> Any:
        value = getattr(self.option, name, _NOTSET)
        if value is _NOTSET or (value is None and skip):
            if default is not _NOTSET:
                return default
            if skip:
                import pytest

                pytest.skip(f"no {name!r} option found")
            raise ValueError(f"no option named {name!r}")
        return value

    def getvalue(self, name: str) -> Any:
        return self.getoption(name)

    def getini(self, name: str) -> Any:
        if name not in self._ini:
            raise ValueError(f"unknown configuration value: {name!r}")
        return self._ini[name]

    def get_verbosity(self, verbosity_type: str | None = None) -> int:
        return self._verbosity.get(verbosity_type or "", self._verbosity[""])

    def __repr__(self) -> str:
        return f"<pytest config view (rootdir {self.rootpath}) in an isolated test>"


def _portable_mark(mark: Any) -> Any:
    if _portable(mark):
        return mark
    return mark._replace(args=tuple(a if _portable(a) else repr(a) for a in mark.args),
                         kwargs={k: v if _portable(v) else repr(v)
                                 for k, v in mark.kwargs.items()})


class NodeView(_View):
    """``request.node`` as read in the child: names, location, markers, keywords."""

    _NAME = "request.node"
    _HAS = "name, nodeid, originalname, path, location, keywords, own_markers, " \
        "iter_markers, get_closest_marker, callspec, config"

    def __init__(self, item: Any, config: ConfigView) -> None:
        self.name = item.name
        self.nodeid = item.nodeid
        self.originalname = getattr(item, "originalname", item.name)
        self.path = Path(item.path)
        self.location = item.location
        self.config = config
        self.own_markers = [_portable_mark(m) for m in item.own_markers]
        self._markers = [_portable_mark(m) for m in item.iter_markers()]
        self.keywords = {k: True for k in item.keywords}
        callspec = getattr(item, "callspec", None)
        if callspec is not None:
            self.callspec = SimpleNamespace(
                id=callspec.id, params={k: v for k, v in callspec.params.items()
                                        if _portable(v)})

    def iter_markers(self, name: str | None = None) -> Any:
        return (m for m in self._markers if name is None or m.name == name)

    def get_closest_marker(self, name: str, default: Any = None) -> Any:
        return next(self.iter_markers(name), default)

    def __repr__(self) -> str:
        return f"<Function {self.name}>"


class RequestView(_View):
    """``request`` as read in the child."""

    _NAME = "request"
    _HAS = "node, config, fixturenames, param, keywords, path, scope, function, cls, " \
        "module, instance"

    def __init__(self, item: Any, config: ConfigView) -> None:
        request = item._request
        self.node = NodeView(item, config)
        self.config = config
        self.fixturenames = list(request.fixturenames)
        self.keywords = self.node.keywords
        self.path = self.node.path
        self.scope = "function"
        self.function: Any = None
        self.module: Any = None
        self.cls: Any = None
        self.instance: Any = None
        if hasattr(request, "param") and _portable(request.param):
            self.param = request.param

    def bind(self, fn: Any, module: Any) -> RequestView:
        """Child side: the test's own objects, as resolved there."""
        self.function = getattr(fn, "__func__", fn)
        self.module = module
        self.instance = getattr(fn, "__self__", None)
        self.cls = type(self.instance) if self.instance is not None else None
        return self

    def getfixturevalue(self, name: str) -> Any:
        raise _unavailable(f"request.getfixturevalue({name!r})",
                           self._HAS + "; request the fixture as a test argument instead")

    def addfinalizer(self, finalizer: Any) -> None:
        raise _unavailable("request.addfinalizer", self._HAS)

    def applymarker(self, marker: Any) -> None:
        raise _unavailable("request.applymarker", self._HAS)

    def __repr__(self) -> str:
        return f"<FixtureRequest for {self.node!r}>"


def _no_trace(*args: Any, **kwargs: Any) -> None:
    """The child's ``tmp_path_factory`` traces nowhere (pytest's tracer stays here)."""


def _tmp_path_factory(factory: Any) -> Any:
    factory.getbasetemp()  # made here once: the child's folders go under the same one
    view = copy.copy(factory)
    view._trace = _no_trace
    return view


def views(item: Any, names: list[str]) -> dict[str, Any]:
    """Parent side: the views of ``names`` for ``item`` (they pickle)."""
    if not names:
        return {}
    config = item.config.stash.get(_CONFIG_VIEW, None)
    if config is None:  # one picture per session: options do not change under a test
        config = item.config.stash[_CONFIG_VIEW] = ConfigView(item.config)
    out: dict[str, Any] = {}
    for name in names:
        if name == "pytestconfig":
            out[name] = config
        elif name == "request":
            out[name] = RequestView(item, config)
        elif name == "tmp_path_factory":
            out[name] = _tmp_path_factory(item.funcargs[name])
        elif name == "tmpdir_factory":
            legacy = copy.copy(item.funcargs[name])
            legacy._tmppath_factory = _tmp_path_factory(legacy._tmppath_factory)
            out[name] = legacy
    return out


def _stash_key() -> Any:
    import pytest

    return pytest.StashKey[ConfigView]()


_CONFIG_VIEW = _stash_key()


def bound(found: dict[str, Any], fn: Any, module: Any) -> dict[str, Any]:
    """Child side: the views, ``request`` bound to the test's own function and module."""
    return {name: value.bind(fn, module) if isinstance(value, RequestView) else value
            for name, value in found.items()}
