"""Forkservers that imported a check's own modules in that check's own environment.

A module that reads a variable at import (vLLM's attention ops read
``VLLM_BATCH_INVARIANT``; verl decides at import which devices it has) cannot be in the
session's preload: the server imported it in the session's environment, and a check that
sets the variable would run with the value the server saw. Imported by each child instead,
it costs every child the import (vLLM's engine 2-5 s, verl's trainer 3-4 s on a 2-core
runner). A keyed server imports it in exactly the environment its children get (the whole
of it, not a list of variables someone thought of; only pytest's name of the running test
is left out), so what a module read at import is what the child's own import would have
read; the child then pays a fork.

Kept per (modules, environment), the ``KEEP`` most recently used: a suite's cases take a few
environments (the switch on, off, a variant's own). Each is forked from the session's server
(``BranchedServer``), so it holds the session's preload at no cost and pays only for its
own modules: one import of vLLM's engine pays for itself from the second check of an
environment. (Started as fresh interpreters, each imported the whole preload again, about
15 s of CPU for this project's list, and vLLM's keyed rows ran slower than without them.)
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Mapping

from harness.isolation.server import BranchedServer, ForkServerLauncher

#: servers kept at once, least recently used closed first
KEEP = 3
#: variables that name the test being run (pytest sets it for each): never in a key, nor in
#: a server's environment; each child still gets its own
PER_TEST = ("PYTEST_CURRENT_TEST",)


class KeyedServers:
    """A session's keyed forkservers: each forked from ``parent()`` (the session's server,
    which holds its preload), then importing a check's ``imports`` in the environment its
    children will have."""

    def __init__(self, parent: Callable[[], ForkServerLauncher], keep: int = KEEP) -> None:
        self.parent = parent
        self.keep = keep
        self._servers: OrderedDict[tuple[object, ...], ForkServerLauncher] = OrderedDict()

    def get(self, imports: tuple[str, ...], env: Mapping[str, str]) -> ForkServerLauncher:
        """The server for ``imports`` under ``env`` (started on first use, again if it died);
        raises ``ForkServerUnavailable`` with the reason when it cannot serve (an import
        failed or initialised a device): the caller then starts the child as before."""
        env = {k: v for k, v in env.items() if k not in PER_TEST}
        key = (tuple(imports), tuple(sorted(env.items())))
        server = self._servers.pop(key, None)
        if server is not None and server.proc.poll() is not None:
            server.close()
            server = None
        if server is None:
            server = BranchedServer(self.parent(), tuple(imports), dict(env))
        self._servers[key] = server
        while len(self._servers) > self.keep:
            _, oldest = self._servers.popitem(last=False)
            oldest.close()
        try:
            server.ensure_ready()
        except Exception:
            self._servers.pop(key, None)
            raise
        return server

    def close(self) -> None:
        while self._servers:
            _, server = self._servers.popitem()
            server.close()
