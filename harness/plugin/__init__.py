"""The pytest plugin: options, markers, the ``run_on_npu`` fixture and the report header.

Registered through the ``pytest11`` entry point ``npu_regress``: installing npu-regress is
enough. Data flows one way: a test calls ``run_on_npu`` -> ``harness.isolation.run.isolate`` ->
child -> ``IsolatedResult`` -> report sections and properties on the test's report.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import signal
import threading
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from harness.hardware import AscendHardwareVersion, NpuVersions, detect_in_child, parse_version
from harness.hardware.spoof import NpuSpoof
from harness.isolation import reaper
from harness.isolation.result import IsolatedResult
from harness.isolation.run import Launcher, child_contexts, isolate, resolve_launcher
from harness.isolation.server import (
    DEFAULT_PRELOAD,
    ForkServerLauncher,
    ForkServerUnavailable,
    ReplacingForkServer,
)
from harness.plugin import manifest, pytest_private, require
from harness.plugin.attach import RESULTS_KEY, attach_result
from harness.plugin.results import ResultsInUse, ResultsWriter, child_record
from harness.plugin.whole_test import HarnessHookspecs, WholeTestIsolation
from harness.stack.devices import (
    DEVICE_ENV,
    KINDS,
    DeviceError,
    DeviceInfo,
    detect,
    pinning_env,
    thread_budget_env,
)

DEFAULT_TIMEOUT_S = 180.0
ISOLATION_CHOICES = ("auto", "spawn", "forkserver")


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
    #: the stack manifest (``harness.plugin.manifest``), read at session start where reported
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
    _launcher: Launcher | None = field(default=None, repr=False)
    _server: ReplacingForkServer | None = field(default=None, repr=False)
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
        if self._server is not None:
            self._server.close()
        if self.warm_plan is not None:  # the plan's folder (``preload.Plan.write``)
            shutil.rmtree(Path(self.warm_plan.written).parent, ignore_errors=True)

    def child_env(self) -> dict[str, str | None]:
        env: dict[str, str | None] = {DEVICE_ENV: self.device.kind}
        env.update(pinning_env(self.device.kind, self.device.count, self.worker_id))
        env.update(thread_budget_env(os.environ))
        return env


class HarnessWarning(pytest.PytestWarning):
    """Something about the harness's own set-up that a run's reader should know."""


SESSION_KEY = pytest.StashKey[HarnessSession]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("npu-regress", "npu-regress: isolated hardware-regression checks")
    group.addoption(
        "--device", dest="harness_device", choices=("auto", *KINDS), default=None,
        help="device the isolated children run on: auto (NPU if torch_npu sees one, else "
        "CUDA, else CPU), npu, cuda or cpu. Default: ini harness_device, else auto.",
    )
    group.addoption(
        "--device-count", dest="harness_device_count", type=int, default=None, metavar="N",
        help="number of devices to spread xdist workers over (worker k -> device k mod N), "
        "instead of the detected count; also skips the availability probe for --device.",
    )
    group.addoption(
        "--isolation-timeout", dest="harness_isolation_timeout", type=float, default=None,
        metavar="SECONDS",
        help="seconds an isolated child may run before its stacks are taken and its process "
        "group is ended. Default: ini harness_isolation_timeout, else 180. Per test: "
        "@pytest.mark.isolation_timeout(seconds).",
    )
    group.addoption(
        "--isolation", dest="harness_isolation", choices=ISOLATION_CHOICES, default=None,
        help="how isolated children start: forkserver (forked from a server that preloaded "
        "torch: ~ms per check; env vars read at import time are fixed), spawn (a fresh "
        "interpreter per check), or auto (forkserver, else spawn with a warning). "
        "Default: ini harness_isolation, else auto.",
    )
    group.addoption(
        "--isolation-preload", dest="harness_isolation_preload", default=None,
        metavar="MODULES",
        help="comma-separated modules the forkserver imports before serving. Default: ini "
        f"harness_isolation_preload, else {','.join(DEFAULT_PRELOAD)}.",
    )
    group.addoption(
        "--bi-target", dest="bi_targets", action="append", default=None, metavar="NAME",
        help="batch-invariance target to check (repeatable): reference, vllm_ascend, vllm, or "
        "one added through the npu_regress.invariance_targets entry points. Default: every "
        "known target; those that cannot run here skip with the reason.",
    )
    group.addoption(
        "--harness-results", dest="harness_results", default=None, metavar="PATH",
        help="write one JSON line per finished test (plus a run header and footer) to PATH. "
        "Default: ini harness_results; `pytest suites/` defaults to "
        "reports/latest/results.jsonl. Empty: off.",
    )
    group.addoption(
        "--harness-runner", dest="harness_runner", default=None, metavar="NAME",
        help="runner name recorded in the results file (default: $HARNESS_RUNNER, else the "
        "host name)",
    )
    group.addoption(
        "--isolate-all", dest="harness_isolate_all", action="store_true", default=False,
        help="run every test's call phase in a fresh process (as @pytest.mark.isolated "
        "does): the test function with its resolved fixture values, which must pickle",
    )
    group.addoption(
        "--harness-require", dest="harness_require", default=None, metavar="NAME[,NAME...]",
        help="capabilities this runner must have: npu, torch_npu, vllm, vllm_ascend, verl, "
        "batch_invariant_ops, cann>=VERSION, driver>=VERSION. A test that skips because "
        "one is missing fails, naming it, and a missing one fails the run. Default: ini "
        "harness_require (none).",
    )
    parser.addini("harness_results", "default for --harness-results", default="")
    parser.addini("harness_require", "default for --harness-require", default="")
    parser.addini("harness_device", "default for --device", default="auto")
    parser.addini("harness_isolation", "default for --isolation", default="auto")
    parser.addini("harness_isolation_preload", "default for --isolation-preload",
                  default=",".join(DEFAULT_PRELOAD))
    parser.addini("harness_isolation_timeout", "default for --isolation-timeout",
                  default=str(DEFAULT_TIMEOUT_S))


def _option(config: pytest.Config, name: str) -> Any:
    value = config.getoption(name)
    return config.getini(name) if value is None else value


def _positive_timeout(value: Any) -> float:
    """--isolation-timeout / harness_isolation_timeout as seconds > 0: a zero or negative
    limit would fail every check "still running after -5 s"."""
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        seconds = float("nan")
    if not seconds > 0 or seconds == float("inf"):
        raise pytest.UsageError(
            f"--isolation-timeout / harness_isolation_timeout = {value!r}: give a number of "
            f"seconds greater than 0 (default {DEFAULT_TIMEOUT_S:g})")
    return seconds


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "npu: needs a real Ascend NPU; skipped elsewhere, the reason naming what is missing",
    )
    config.addinivalue_line(
        "markers",
        "device(*kinds): run only when the session device is one of kinds (npu, cuda, cpu)",
    )
    config.addinivalue_line(
        "markers", "isolation_timeout(seconds): timeout for this test's isolated children"
    )
    config.addinivalue_line(
        "markers", "soc(*families): run only on these Ascend families (A2, A3, A5, A1, "
        "ASCEND310P, ASCEND310B); skipped elsewhere with the detected hardware",
    )
    config.addinivalue_line(
        "markers", "min_cann(version): skip unless the detected CANN version is >= version",
    )
    config.addinivalue_line(
        "markers", "isolated(timeout=None, env=None): run this test's call phase in a fresh "
        "process (fixture values must pickle); env sets variables in that process only",
    )
    config.addinivalue_line(
        "markers", "min_driver(version): skip unless the detected driver (HDK) is >= version",
    )
    workerinput = getattr(config, "workerinput", None)
    # bad values first, before any probe starts a process
    timeout = _positive_timeout(_option(config, "harness_isolation_timeout"))
    count = config.getoption("harness_device_count")
    if count is not None and count < 1:
        raise pytest.UsageError(
            f"--device-count {count}: the number of devices must be 1 or more (leave the "
            "option out to use the detected count)")
    try:
        if workerinput and "harness_device" in workerinput:
            device = DeviceInfo.from_dict(workerinput["harness_device"])
            npu = (NpuVersions.from_dict(workerinput["harness_npu"])
                   if workerinput.get("harness_npu") else detect_in_child())
        else:
            npu = detect_in_child()
            device = detect(_option(config, "harness_device"),
                            config.getoption("harness_device_count"))
        method = _option(config, "harness_isolation")
        if method not in ISOLATION_CHOICES:
            raise pytest.UsageError(
                f"harness_isolation = {method!r}: use one of {', '.join(ISOLATION_CHOICES)}")
        preload = tuple(m.strip() for m in
                        _option(config, "harness_isolation_preload").split(",") if m.strip())
    except DeviceError as exc:
        raise pytest.UsageError(str(exc)) from None
    session = HarnessSession(
        device=device, timeout=timeout, method=method, preload=preload, npu=npu,
        worker_id=workerinput.get("workerid") if workerinput else None,
        preload_explicit=config.getoption("harness_isolation_preload") is not None
        or config.getini("harness_isolation_preload") != ",".join(DEFAULT_PRELOAD),
    )
    try:
        requirements = require.parse(_option(config, "harness_require"))
    except ValueError as exc:
        raise pytest.UsageError(str(exc)) from None
    if requirements:
        require.check(requirements, device.kind, npu)
        config.pluginmanager.register(require.RequiredCapabilities(requirements),
                                      "npu_regress_require")
    from harness.plugin.verdicts import Verdicts, stack_facts

    session.stack = stack_facts()
    config.stash[SESSION_KEY] = session
    config.pluginmanager.register(Verdicts(session.stack), "npu_regress_verdicts")
    from harness.plugin.absent import AbsentTargets

    config.pluginmanager.register(AbsentTargets(device.kind, device.npu_missing),
                                  "npu_regress_absent")
    _install_sigterm(session)
    if workerinput is not None:
        _end_with_controller()
    config.pluginmanager.register(WholeTestIsolation(session), "npu_regress_whole_test")
    if config.getoption("harness_isolate_all"):
        from harness.plugin.whole_test_child import remember_rewrites

        remember_rewrites()


def pytest_addhooks(pluginmanager: pytest.PytestPluginManager) -> None:
    from harness.plugin.absent import AbsentHookspecs

    pluginmanager.add_hookspecs(HarnessHookspecs)
    pluginmanager.add_hookspecs(AbsentHookspecs)


@pytest.hookimpl(trylast=True)
def pytest_sessionstart(session: pytest.Session) -> None:
    # after conftests' pytest_configure (suites/conftest.py sets the results default)
    harness_session = session.config.stash[SESSION_KEY]
    _record_manifest(session.config, harness_session)
    _register_results(session.config, harness_session)
    xdist_controller = bool(getattr(session.config.option, "numprocesses", None)) and \
        not hasattr(session.config, "workerinput")  # runs no test itself
    if session.config.getoption("harness_isolate_all") and not xdist_controller and \
            harness_session.method in ("auto", "forkserver"):
        # its start overlaps collection; after collection it imports the collected test
        # modules (``harness.plugin.preload``), and torch only when they or a run_on_npu
        # test need it
        if not harness_session.preload_explicit:
            from harness.plugin.preload import BASE_PRELOAD

            harness_session.preload = BASE_PRELOAD
        harness_session.prestart()


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """xdist controller: hand the detected device to the workers instead of probing N times."""
    session = node.config.stash.get(SESSION_KEY, None)
    if session is not None:
        node.workerinput["harness_device"] = session.device.to_dict()
        node.workerinput["harness_npu"] = session.npu.to_dict() if session.npu else None


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    """Carry each isolated child's ending on the report (serialisable: crosses xdist)."""
    report = yield
    children = item.stash.get(RESULTS_KEY, [])
    report.harness_children = [child_record(r) for r in children] if call.when == "call" else []
    return report


def _record_manifest(config: pytest.Config, session: HarnessSession) -> None:
    """The stack manifest, where a report will read it: the results header and the JUnit
    XML's global properties (``stack.<name>``). Read once, by the controller."""
    if hasattr(config, "workerinput"):
        return
    xml = pytest_private.junit_xml(config)
    if not _option(config, "harness_results") and xml is None:
        return
    session.manifest = manifest.collect(session.npu)
    if xml is not None:
        for name, entry in session.manifest.items():
            xml.add_global_property(f"stack.{name}", manifest.shown(entry))


def _register_results(config: pytest.Config, session: HarnessSession) -> None:
    path = _option(config, "harness_results")
    if not path or hasattr(config, "workerinput"):  # the xdist controller writes
        return
    target = Path(path)
    if not target.is_absolute():
        target = Path(str(config.invocation_params.dir)) / target
    try:
        writer = ResultsWriter(target, config, session)
    except ResultsInUse as exc:
        raise pytest.UsageError(f"--harness-results {path}: {exc}") from None
    except OSError as exc:
        raise pytest.UsageError(f"--harness-results {path}: cannot write there ({exc})") from None
    config.pluginmanager.register(writer, "npu_regress_results")


def pytest_unconfigure(config: pytest.Config) -> None:
    session = config.stash.get(SESSION_KEY, None)
    reaper.end_all_live()
    if session is not None:
        session.close()
    if session is not None and session._previous_sigterm is not None:
        with contextlib.suppress(ValueError):
            signal.signal(signal.SIGTERM, session._previous_sigterm)
    if session is not None and session.terminated and \
            session._previous_sigterm in (signal.SIG_DFL, None):
        # everything is written: now end as the sender asked (exit status -SIGTERM)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)


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

    def on_sigterm(signum: int, frame: Any) -> None:
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


def pytest_report_header(config: pytest.Config) -> list[str]:
    session = config.stash.get(SESSION_KEY, None)
    if session is None:
        return []
    isolation = f"; isolation={session.method}, timeout {session.timeout:g} s"
    lines = [session.device.header() + isolation]
    if session.npu is not None:
        lines.append(f"npu-regress: ascend {session.npu.summary()}")
    lines.extend(_stack_header(session.stack))
    for use, problem in pytest_private.drift():
        lines.append(f"npu-regress: pytest {pytest.__version__} internals drifted: {use.name}: "
                     f"{problem} (used to {use.why}; meanwhile: {use.fallback})")
    return lines


def _stack_header(stack: dict[str, Any]) -> list[str]:
    """The stack profile and the pairing verdict, above every result they qualify."""
    profile = stack.get("profile")
    pairing = stack.get("pairing") or {}
    where = (f"stack profile {profile['name']} ({profile['kind']}): {profile['summary']}"
             if profile else "stack: as installed (no stack profile recorded)")
    lines = [f"npu-regress: {where}"]
    if profile and profile["kind"] == "forward":
        lines.append("npu-regress: forward profile: failures are forward-compatibility "
                     "(they break with the next releases), never release findings")
    for problem in pairing.get("problems", []):
        lines.append(f"npu-regress: UNSUPPORTED STACK: {problem}")
    for note in pairing.get("notes", []):
        lines.append(f"npu-regress: stack note: {note}")
    return lines


def pytest_runtest_setup(item: pytest.Item) -> None:
    session = item.config.stash[SESSION_KEY]
    if session.npu is not None:
        item.user_properties.append(("npu_versions", session.npu.summary()))
        _skip_for_hardware(item, session.npu)
    if item.get_closest_marker("npu") and session.device.npu_missing:
        pytest.skip(f"needs a real NPU: {session.device.npu_missing}")
    marker = item.get_closest_marker("device")
    if marker and session.device.kind not in marker.args:
        pytest.skip(
            f"runs only on {', '.join(marker.args)}; the session device is "
            f"{session.device.kind} ({session.device.reason})"
        )


def _skip_for_hardware(item: pytest.Item, npu: NpuVersions) -> None:
    """soc / min_cann / min_driver markers, each skip naming the detected value."""
    marker = item.get_closest_marker("soc")
    if marker and npu.hardware.name not in {str(f).upper() for f in marker.args}:
        pytest.skip(f"needs Ascend {' or '.join(map(str, marker.args))}; detected "
                    f"{npu.hardware.name}" + (f" ({npu.reason})" if npu.reason else ""))
    for name, label, raw, source_key in (
        ("min_cann", "CANN", npu.cann_version, "cann_version"),
        ("min_driver", "driver (HDK)", npu.driver_version, "driver_version"),
    ):
        marker = item.get_closest_marker(name)
        if not marker:
            continue
        need = str(marker.args[0])
        have = parse_version(raw)
        where = npu.sources.get(source_key, "no source")
        if have is None:
            pytest.skip(f"needs {label} >= {need}; detected {raw or 'none'} ({where})")
        minimum = parse_version(need)
        if minimum is None:
            raise pytest.UsageError(f"@pytest.mark.{name}({need!r}): not a version")
        if have < minimum:
            pytest.skip(f"needs {label} >= {need}; detected {raw} ({where})")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Parametrize ``bi_target`` over the selected batch-invariance targets."""
    if "bi_target" in metafunc.fixturenames:
        from harness.invariance import registry

        known = registry()
        names = metafunc.config.getoption("bi_targets") or list(known)
        unknown = [n for n in names if n not in known]
        if unknown:
            raise pytest.UsageError(f"--bi-target {', '.join(unknown)}: unknown; known targets: "
                                    f"{', '.join(known)}")
        metafunc.parametrize("bi_target", names)


@pytest.fixture
def invariance_target(request: pytest.FixtureRequest, bi_target: str) -> Any:
    """The ``InvarianceTarget`` named by ``bi_target``; skips, naming what is missing, when it
    cannot run in this session."""
    from harness.invariance import get_target

    session = request.config.stash[SESSION_KEY]
    target = get_target(bi_target)
    reason = target.unavailable(session.device.kind, session.device.npu_missing)
    if reason:
        pytest.skip(f"batch-invariance target {bi_target}: {reason}")
    return target


@pytest.fixture
def npu_versions(request: pytest.FixtureRequest) -> NpuVersions:
    """This runner's hardware, driver and CANN versions, as the session detected them once
    (in an isolated child), with where each was read and every source that failed."""
    session = request.config.stash[SESSION_KEY]
    return session.npu if session.npu is not None else NpuVersions(
        AscendHardwareVersion.NONE, reason="no NPU detection in this session")


@pytest.fixture
def run_on_npu(request: pytest.FixtureRequest) -> Callable[..., IsolatedResult]:
    """Run ``fn(*args, **kwargs)`` in a fresh process on the session's device.

    Returns the ``IsolatedResult``; raises what the child raised, keeps skip / xfail / fail,
    and raises ``ChildCrashed`` / ``ChildTimeout`` / ``ChildError`` otherwise. Inside the child
    ``harness.device()`` is the session's ``torch.device``.
    """
    session = request.config.stash[SESSION_KEY]
    marker = request.node.get_closest_marker("isolation_timeout")
    default_timeout = float(marker.args[0]) if marker else session.timeout

    def run(fn: Callable[..., Any], *args: Any, env: Mapping[str, str | None] | None = None,
            timeout: float | None = None, events: Sequence[str] | None = None,
            spoof: NpuSpoof | None = None, **kwargs: Any) -> IsolatedResult:
        __tracebackhide__ = True
        res = isolate(
            fn, args, kwargs,
            timeout=default_timeout if timeout is None else timeout,
            env={**session.child_env(), **(env or {})},
            launcher=session.launcher(),
            contexts=child_contexts(events, spoof),
        )
        attach_result(request.node, res)
        return res.raise_for_outcome()

    return run
