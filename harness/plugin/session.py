"""The session's state (``HarnessSession``: device, isolation launcher, stack facts), made
from the options once per pytest process, kept in ``config.stash[SESSION_KEY]``, and its
lifecycle: the forkserver it owns, SIGTERM handled like Ctrl-C, an xdist worker that exits
when its controller dies, and nothing it started left behind at exit."""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import signal
import threading
import time
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from harness.collectives.launchers import LaunchSpec
from harness.hardware import NpuVersions, detect_in_child
from harness.isolation import reaper
from harness.isolation.keyed import KeyedServers
from harness.isolation.run import Launcher, child_environ, resolve_launcher
from harness.isolation.server import (
    DEFAULT_PRELOAD,
    ForkServerLauncher,
    ForkServerUnavailable,
    ReplacingForkServer,
)
from harness.plugin import options
from harness.stack import identity
from harness.stack.devices import (
    DEVICE_ENV,
    DeviceError,
    DeviceInfo,
    detect,
    pinning_env,
    thread_budget_env,
)


class HarnessWarning(pytest.PytestWarning):
    """Something about the harness's own set-up that a run's reader should know."""


@dataclass
class HarnessSession:
    """What the plugin decided for this pytest session."""

    device: DeviceInfo
    timeout: float
    npu: NpuVersions | None = None
    #: requested isolation: auto, spawn or forkserver
    method: str = "auto"
    preload: tuple[str, ...] = DEFAULT_PRELOAD
    worker_id: str | None = None
    #: the stack manifest (``harness.plugin.stack_manifest``), read at session start
    manifest: dict[str, Any] | None = None
    #: the signal that ended the session early ("SIGTERM"), or None
    terminated: str | None = None
    #: the active stack profile and the pairing verdict (``harness.plugin.verdicts``)
    stack: dict[str, Any] = field(default_factory=dict)
    #: (hook, argument) the server runs after its preload: ``harness.plugin.preload``
    warmup: tuple[str, str] | None = None
    #: why the server refused to serve after the warm-up (it then runs without it)
    warm_refused: str | None = None
    #: the warm-up's plan (``harness.plugin.preload.Plan``), for the header
    warm_plan: Any = None
    #: whether --isolation-preload / its ini key was given (kept under a warm-up)
    preload_explicit: bool = False
    #: fewer run_on_npu tests than this: the preload is torch, pytest and harness only
    #: (``harness_isolation_preload_min``; ``harness.plugin.runner``)
    preload_min: int = options.PRELOAD_MIN_TESTS
    #: where the collectives' ranks run (``--ranks-launcher``...)
    ranks: LaunchSpec = field(default_factory=LaunchSpec)
    _launcher: Launcher | None = field(default=None, repr=False)
    _server: ReplacingForkServer | None = field(default=None, repr=False)
    _keyed: KeyedServers | None = field(default=None, repr=False)
    #: why a keyed server could not serve (said once; its checks import for themselves)
    keyed_refused: str | None = None
    _previous_sigterm: Any = field(default=None, repr=False)

    def launcher(self) -> Launcher:
        """The session's launcher, chosen at first use: an ``auto`` session that cannot get
        a forkserver falls back to spawn with one warning naming the reason; an explicit
        ``forkserver`` session fails each isolated test with that reason."""
        if self._launcher is not None:
            return self._launcher
        try:
            launcher, why = resolve_launcher(self.method, self._own_server)
        except ForkServerUnavailable as exc:
            pytest.fail(f"--isolation forkserver: the forkserver is unavailable: {exc}",
                        pytrace=False)
        if why:
            warnings.warn(HarnessWarning(
                f"forkserver unavailable, isolating with spawn instead: {why}"), stacklevel=1)
        self._launcher = launcher
        return launcher

    def launcher_for(self, imports: tuple[str, ...], env: Mapping[str, str | None]
                     ) -> Launcher:
        """The launcher of a check that imports ``imports`` and asks for ``env``: a
        forkserver that imported them in the child's whole environment (``child_environ``,
        as ``isolate`` makes it; ``harness.isolation.keyed``), where this session forks its
        children; else the session's own (the child imports them itself)."""
        launcher = self.launcher()
        if not imports or launcher.name != "forkserver" or self.keyed_refused:
            return launcher
        if self._keyed is None:
            self._keyed = KeyedServers(lambda: self._own_server().server)
        try:
            return self._keyed.get(imports, child_environ(env))
        except ForkServerUnavailable as exc:
            self.keyed_refused = str(exc)
            warnings.warn(HarnessWarning(
                f"a forkserver that preloads {', '.join(imports)} could not serve ({exc}): "
                "those checks import them in their own child instead"), stacklevel=1)
            return launcher

    def prestart(self) -> None:
        """Start this session's forkserver now, without waiting for it to be ready."""
        if self._server is None:
            self._server = ReplacingForkServer(
                lambda: ForkServerLauncher(self.preload, self.warmup),
                allow_spawn=self.method == "auto",
                warn=lambda message: warnings.warn(HarnessWarning(message), stacklevel=1))

    def warm(self, plan: Any) -> None:
        """Have this session's server import what ``plan`` (``harness.plugin.preload.Plan``)
        holds before its first child; a server started from now on (a replacement) imports
        it at its own start."""
        from harness.plugin import preload

        self.warm_plan = plan
        self.warmup = (preload.HOOK, plan.write())
        if self._server is None:
            self.preload = plan.preload(self.preload if self.preload_explicit else None)
            self.prestart()  # with the warm-up on its command line
            return
        if plan.torch and "torch" not in self.preload:
            self.preload = ("torch", *self.preload)  # for replacements: the plan loads it
        with contextlib.suppress(ForkServerUnavailable):  # _own_server says why, or falls back
            self._server.server.warm(self.warmup)

    def _own_server(self) -> ReplacingForkServer:
        """This session's server (closed with the session, unlike the shared one), replaced
        if it dies (``ReplacingForkServer``). One that refused to serve after its warm-up
        (a test module made forking unsafe) is replaced by one without it."""
        self.prestart()
        assert self._server is not None
        try:
            self._server.ensure_ready()
        except ForkServerUnavailable:
            refused = self._server.server.refused
            if refused is None or self.warmup is None:
                raise
            self.warm_refused, self.warmup = refused, None
            self._server.close()
            self._server = None
            self.prestart()
            assert self._server is not None
            self._server.ensure_ready()
        return self._server

    def close(self) -> None:
        """End the server and what it started; then, after a SIGTERM, die by it as asked."""
        reaper.end_all_live()
        if self._keyed is not None:
            self._keyed.close()
        if self._server is not None:
            self._server.close()
        if self.warm_plan is not None:  # the plan's folder (``preload.Plan.write``)
            shutil.rmtree(Path(self.warm_plan.written).parent, ignore_errors=True)
        if self._previous_sigterm is not None:
            with contextlib.suppress(ValueError):
                signal.signal(signal.SIGTERM, self._previous_sigterm)
        if self.terminated and self._previous_sigterm in (signal.SIG_DFL, None):
            # everything is written: now end as the sender asked (exit status -SIGTERM)
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            signal.raise_signal(signal.SIGTERM)

    def child_env(self) -> dict[str, str | None]:
        env: dict[str, str | None] = {DEVICE_ENV: self.device.kind}
        env.update(pinning_env(self.device.kind, self.device.count, self.worker_id))
        env.update(thread_budget_env(os.environ))
        return env


SESSION_KEY = pytest.StashKey[HarnessSession]()


def open_session(config: pytest.Config) -> HarnessSession:
    """The session from the options: bad values first, before any probe starts a process;
    an xdist worker takes the device its controller detected (``workerinput``)."""
    workerinput = getattr(config, "workerinput", None)
    timeout = options.positive_timeout(options.option(config, "harness_isolation_timeout"))
    count = options.device_count(config)
    try:
        if workerinput and "harness_device" in workerinput:
            device = DeviceInfo.from_dict(workerinput["harness_device"])
            npu = (NpuVersions.from_dict(workerinput["harness_npu"])
                   if workerinput.get("harness_npu") else detect_in_child())
        else:
            npu = detect_in_child()
            device = detect(options.option(config, "harness_device"), count)
        method = options.isolation_method(config)
        preload, explicit = options.preload(config)
        preload_min = options.preload_min_tests(config)
        ranks = options.ranks_launch(config)
    except DeviceError as exc:
        raise pytest.UsageError(str(exc)) from None
    session = HarnessSession(
        device=device, timeout=timeout, method=method, preload=preload, npu=npu,
        worker_id=workerinput.get("workerid") if workerinput else None,
        preload_explicit=explicit, preload_min=preload_min, ranks=ranks)
    # what chooses the kernels, for every envelope this session's processes judge by
    identity.publish(device.kind, identity.accelerator_fields(
        device.kind, npu.to_dict() if npu else None, device.to_dict()))
    return session


def hold(session: HarnessSession, config: pytest.Config) -> None:
    """From here on the session ends in order: SIGTERM as Ctrl-C, and an xdist worker exits
    when its controller is gone (after every usage error: nothing to undo before them)."""
    _install_sigterm(session)
    if getattr(config, "workerinput", None) is not None:
        _end_with_controller()


class Terminated(KeyboardInterrupt):
    """SIGTERM, handled like Ctrl-C so that pytest ends its session in order (the results
    footer and the JUnit XML are written for what ran), then re-raised on the way out."""


def _install_sigterm(session: HarnessSession) -> None:
    """On SIGTERM, end every running child's process group, let pytest finish the session
    as after Ctrl-C (results footer, JUnit XML), then die by SIGTERM as asked. A second
    SIGTERM ends the process at once."""
    if threading.current_thread() is not threading.main_thread():
        return
    previous = signal.getsignal(signal.SIGTERM)
    owner = os.getpid()

    def on_sigterm(signum: int, frame: Any) -> None:
        if os.getpid() != owner:
            # a fork of the pytest process (a test's fork pool worker) inherited this
            # handler: it is no session, and must not end the session's children. It ends
            # as it would without the harness (a pool's terminate() waits for it)
            signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)
            if callable(previous):
                previous(signum, frame)
                return
            signal.raise_signal(signal.SIGTERM)
            return
        reaper.end_all_live()
        if callable(previous):
            previous(signum, frame)
            return
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # the second one is not handled
        session.terminated = "SIGTERM"
        raise Terminated("SIGTERM: the session was ended; its results so far are written")

    signal.signal(signal.SIGTERM, on_sigterm)
    session._previous_sigterm = previous


#: how often an xdist worker checks that its controller is still alive
CONTROLLER_POLL_S = 0.25


def _end_with_controller() -> None:
    """An xdist worker whose controller died (SIGKILL, OOM, a lost node) would otherwise run
    its test to the end, for up to the isolation timeout. Exit instead: the isolation
    servers see our pipe close and end every child and what it started."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(CONTROLLER_POLL_S)
        with contextlib.suppress(Exception):
            reaper.end_all_live(grace=0.5)  # children started without a supervisor
        os._exit(1)

    threading.Thread(target=watch, name="npu-regress-controller-watch", daemon=True).start()


atexit.register(reaper.end_all_live)
