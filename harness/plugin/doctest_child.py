"""Doctests under ``--isolate-all``: each runs in the isolated child, like any other item.

The parent ships the collected ``DocTest`` without its globals (they are the module's
namespace: they do not pickle), the runner's settings and the picklable part of
``doctest_namespace``. The child builds the globals as pytest's collection did (a copy of
the module's namespace, imported there; ``{"__name__": "__main__"}`` for a text file),
runs pytest's own doctest runner and checker, and renders a failure with pytest's own
``DoctestItem.repr_failure``, so the report reads as in process.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

from harness.plugin import failure_repr, pytest_private, whole_test_child


class DoctestFailed(Exception):
    """What a failing doctest raises in the child after rendering the failure: the
    doctest's own exceptions hold its globals and cannot travel."""


def _no_getfixture(name: str) -> Any:
    raise LookupError(
        f"getfixture({name!r}) is not available in an isolated doctest: fixtures belong to "
        "the pytest process; put what the doctest needs into doctest_namespace, or keep it "
        "in the pytest process (@pytest.mark.isolated(False) does not reach doctests: run "
        "them without --isolate-all)")


@dataclass
class DoctestCall:
    """One collected doctest, as the child runs it."""

    dtest: Any
    #: (module name, file) of a module's doctest; None for a text file
    module: tuple[str, str] | None
    optionflags: int
    continue_on_failure: bool
    namespace: dict[str, Any] = field(default_factory=dict)
    render: failure_repr.RenderSettings | None = None

    __test__ = False

    def __call__(self) -> None:
        pytest_doctest = pytest_private.doctest_module()

        test = self.dtest
        if self.module is not None:
            name, path = self.module
            module = whole_test_child.import_test_module(name, path, None)
            test.globs = module.__dict__.copy()
        else:
            test.globs = {"__name__": "__main__"}
        test.globs.update(getfixture=_no_getfixture, **self.namespace)
        pytest_doctest._check_all_skipped(test)
        runner = pytest_doctest._get_runner(
            verbose=False, optionflags=self.optionflags, checker=pytest_doctest._get_checker(),
            continue_on_failure=self.continue_on_failure)
        failures: list[Any] = []
        try:
            runner.run(test, out=failures)  # type: ignore[arg-type]
            if failures:
                raise pytest_doctest.MultipleDoctestFailures(failures)
        except Exception as exc:  # noqa: BLE001 - rendered here, where its objects are
            report = whole_test_child.current_report()
            if self.render is not None:
                report["longrepr"] = _render(exc, self.render)
            summary = f"{type(exc).__name__} in doctest {test.name}"
            raise DoctestFailed(summary) from None


def _render(exc: BaseException, settings: failure_repr.RenderSettings) -> bytes | None:
    """pytest's ``DoctestItem.repr_failure`` on a stand-in item (its config reads the
    parent's ``--doctest-report``)."""
    import pickle

    import pytest

    try:
        item_cls = pytest_private.doctest_module().DoctestItem
        excinfo = pytest.ExceptionInfo.from_exception(exc)
        node = failure_repr.stand_in(settings)
        return pickle.dumps(item_cls.repr_failure(node, excinfo))
    except Exception:  # noqa: BLE001 - a failure to render must not hide the failure
        return None


def call_for(item: Any, render: failure_repr.RenderSettings) -> DoctestCall:
    """Parent side: the ``DoctestCall`` for a collected ``DoctestItem``."""
    dtest = copy.copy(item.dtest)
    dtest.globs = {}
    module = None
    if not pytest_private.is_doctest_textfile(item.parent):
        globs = item.dtest.globs
        module = (str(globs.get("__name__")), str(globs.get("__file__") or item.path))
    namespace = {}
    try:
        found = item._request.getfixturevalue("doctest_namespace")
    except Exception:  # noqa: BLE001 - no namespace: the child has none either
        found = {}
    for name, value in found.items():
        if whole_test_child.travels(value):
            namespace[name] = value
    return DoctestCall(
        dtest=dtest, module=module, optionflags=item.runner.optionflags,
        continue_on_failure=bool(getattr(item.runner, "continue_on_failure", False)),
        namespace=namespace, render=render)
