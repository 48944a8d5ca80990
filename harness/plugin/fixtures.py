"""The fixtures a check uses: ``run_on_npu`` (a function in a fresh process on the session's
device), ``invariance_target`` over the ``bi_target`` parameter (``--bi-target``) and
``npu_versions``; and the hook that carries each isolated child's ending on the report."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import pytest

from harness.hardware import AscendHardwareVersion, NpuVersions
from harness.hardware.spoof import NpuSpoof
from harness.isolation.result import IsolatedResult
from harness.isolation.run import child_contexts, isolate
from harness.plugin.attach import RESULTS_KEY, attach_result
from harness.plugin.results import child_record
from harness.plugin.session import SESSION_KEY


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


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    """Carry each isolated child's ending on the report (serialisable: crosses xdist)."""
    report = yield
    children = item.stash.get(RESULTS_KEY, [])
    report.harness_children = [child_record(r) for r in children] if call.when == "call" else []
    return report


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
    ``harness.device()`` is the session's ``torch.device``. ``preload``: modules the check
    imports that read the environment at import (vLLM's engine, verl's trainer): the child
    is forked from a server that imported them in the child's own environment
    (``harness.isolation.keyed``), not the session's.
    """
    session = request.config.stash[SESSION_KEY]
    marker = request.node.get_closest_marker("isolation_timeout")
    default_timeout = float(marker.args[0]) if marker else session.timeout

    def run(fn: Callable[..., Any], *args: Any, env: Mapping[str, str | None] | None = None,
            timeout: float | None = None, events: Sequence[str] | None = None,
            spoof: NpuSpoof | None = None, preload: Sequence[str] = (),
            **kwargs: Any) -> IsolatedResult:
        __tracebackhide__ = True
        child = {**session.child_env(), **(env or {})}
        res = isolate(
            fn, args, kwargs,
            timeout=default_timeout if timeout is None else timeout,
            env=child,
            launcher=session.launcher_for(tuple(preload), child),
            contexts=child_contexts(events, spoof),
        )
        attach_result(request.node, res)
        return res.raise_for_outcome()

    return run
