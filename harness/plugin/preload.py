"""The isolation server of an ``--isolate-all`` session holds the collected test modules.

A whole test's child used to import its test module and everything that module imports
(0.3-0.9 s for toolz's modules on a loaded 2-core machine; torch alone 15-20 s), per test.
After collection the plugin starts the session's server with a warm-up instead: it imports
the conftest files and the test modules that were collected, as pytest did (asserts
rewritten, under their own names), so a test's child is a fork of that server and pays a
fork, not an import. torch is loaded only when those modules import it, or when a test of
the session uses ``run_on_npu`` (its checks run torch).

A module that makes a fork unsafe at import (initialises CUDA or an NPU, starts a thread)
makes the server refuse; the session then falls back to a server without the test modules
(each child imports its module, as before) and the header says why. A module whose import
fails in the server is left out (its child imports it and fails as it would), and named.
Output and warnings of the warm-up imports are swallowed: pytest's collection already
showed them (a preloaded module's import must not print into every run).
"""

from __future__ import annotations

import contextlib
import importlib
import os
import pickle
import sys
import types
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from harness.isolation import workdirs
from harness.isolation.server import UnsafeWarmUp, accelerator_state

#: what the server runs after its preload (``harness.isolation.server.serve``)
HOOK = "harness.plugin.preload:warm_up"
#: the server's own preload under a warm-up: torch is added only when the session needs it
BASE_PRELOAD = ("pytest", "harness.plugin.whole_test_child")


@dataclass
class Plan:
    """What the session's server imports after collection."""

    #: (module name, file, rewritten code or None) in import order: conftests, then tests
    modules: list[tuple[str, str, bytes | None]] = field(default_factory=list)
    conftests: int = 0
    #: a test uses ``run_on_npu``: its checks import torch, so the server preloads it
    torch: bool = False
    #: where ``write`` put it
    written: str = ""

    def preload(self, explicit: tuple[str, ...] | None) -> tuple[str, ...]:
        base = explicit if explicit is not None else BASE_PRELOAD
        extra = ("torch",) if self.torch and "torch" not in base else ()
        return (*extra, *base)

    def write(self) -> str:
        """The plan as the server reads it: a file in a folder of this process's own, with
        this process's ``sys.path`` (the server's puts the harness first, where a suite's
        own ``tests`` package must not meet ours)."""
        path = workdirs.make("fs") / "preload.pkl"
        path.write_bytes(pickle.dumps({"modules": self.modules, "sys_path": list(sys.path),
                                       "imports": ["torch"] if self.torch else []}))
        self.written = str(path)
        return self.written


def plan(items: Sequence[pytest.Item], isolated: Any, config: Any, *,
         always: bool = False) -> Plan | None:
    """The modules to warm up for the ``items`` that ``isolated(item)`` selects; None when
    no collected test runs isolated as a whole test, unless ``always`` (a server started
    without torch: the plan may then hold nothing but torch)."""
    from harness.plugin import pytest_private, whole_test_child
    from harness.plugin.failure_repr import conftest_modules

    tests: dict[str, tuple[str, bool]] = {}  # name: (file, asserts rewritten)
    torch = False
    selected = False
    for item in items:
        if "run_on_npu" in getattr(getattr(item, "_fixtureinfo", None), "argnames", ()):
            torch = True
        if pytest_private.is_doctest(item) and isolated(item):
            selected = True
            globs = item.dtest.globs
            if not pytest_private.is_doctest_textfile(item.parent) and globs.get("__file__"):
                tests.setdefault(str(globs["__name__"]), (str(globs["__file__"]), False))
            continue
        if not isinstance(item, pytest.Function) or not isolated(item):
            continue
        selected = True
        path = getattr(item.module, "__file__", None)
        if path:  # a test module's asserts are rewritten (its doctests' import is not)
            tests[item.module.__name__] = (str(path), True)
            torch = torch or _imports_torch(item.module)
    if not selected and not always:
        return None
    found = Plan(torch=torch)
    for module in conftest_modules(config):
        found.modules.append((module.__name__, str(module.__file__),
                              whole_test_child.module_code(str(module.__file__), config)))
    found.conftests = len(found.modules)
    for name, (path, rewritten) in tests.items():
        found.modules.append(
            (name, path, whole_test_child.module_code(path, config) if rewritten else None))
    return found


def _imports_torch(module: Any) -> bool:
    """Whether a test module holds torch (``import torch``, ``from torch import nn``): the
    server then imports torch before it (its threads are the baseline, as for
    ``run_on_npu`` checks). Before: torch 2.13 starts a native thread at import, so the
    test module's warm-up was refused and every child imported torch itself, 1061 ms a
    test (bench/pytest_overhead.py; 24 ms when it was preloaded)."""
    return any(isinstance(value, types.ModuleType)
               and getattr(value, "__name__", "").partition(".")[0] == "torch"
               for value in list(vars(module).values()))


def _tasks() -> int:
    """Threads of this process, Python's and native ones (a fork copies only the caller)."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        import threading

        return threading.active_count()


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Import-time output and warnings go nowhere: the server's stdout is its handshake
    channel, its stderr the user's terminal, and pytest's collection showed them once."""
    saved = [os.dup(1), os.dup(2)]
    null = os.open(os.devnull, os.O_WRONLY)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os.dup2(null, 1)
    os.dup2(null, 2)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in (*saved, null):
            os.close(fd)


def warm_up(path: str) -> dict[str, Any]:
    """Server side: import the plan's modules; what came of it, for the handshake. Raises
    ``UnsafeWarmUp`` naming the module after which a fork would be unsafe."""
    from harness.plugin.whole_test_child import import_test_module

    data = pickle.loads(Path(path).read_bytes())
    modules = data["modules"]
    sys.path[:] = data["sys_path"]  # the harness is loaded: its own imports need no entry
    for name in data.get("imports") or ():  # what the session's run_on_npu checks need
        with _quiet():
            importlib.import_module(name)
    loaded: list[str] = []
    left_out: dict[str, str] = {}
    threads = _tasks()
    for name, file, code in modules:
        try:
            with _quiet():
                import_test_module(name, file, code)
        except BaseException as exc:  # noqa: BLE001 - its own child imports it and fails
            left_out[file] = f"{type(exc).__name__}: {exc}".splitlines()[0][:200]
            continue
        bad = accelerator_state()
        if bad:
            raise UnsafeWarmUp(f"{file} initialises an accelerator at import "
                               f"({bad.replace(' in the forkserver', '')})")
        now = _tasks()
        if now > threads:
            raise UnsafeWarmUp(f"{file} starts {now - threads} thread(s) at import, and a "
                               "process forked after that can inherit a lock one holds")
        loaded.append(file)
    return {"loaded": loaded, "left_out": left_out, "torch": "torch" in sys.modules}


def header(plan_: Plan, warmed: Any, refused: str | None) -> str:
    """The line under "collected N items": how this session's isolated tests start."""
    if refused:
        return ("npu-regress: --isolate-all: test modules not preloaded in the isolation "
                f"server ({refused}); each isolated test imports its module in its child")
    warmed = warmed or {}
    loaded = warmed.get("loaded") or []
    tests = max(len(loaded) - plan_.conftests, 0)
    line = (f"npu-regress: --isolate-all: each test forks from an isolation server holding "
            f"{tests} test module(s) and {min(plan_.conftests, len(loaded))} conftest(s); "
            f"torch {'loaded' if warmed.get('torch') else 'not loaded'}")
    left_out = warmed.get("left_out") or {}
    if left_out:
        first, why = next(iter(left_out.items()))
        line += (f"; not preloaded: {len(left_out)} module(s) whose import fails there "
                 f"({first}: {why}), imported by their own children")
    return line
