"""Count what the dispatcher actually executed, by profiler event name.

A batch-invariance switch fails silently in two ways: "on" while the invariant ops never
run, or "off" while a leaked registration runs them anyway. Only counting executed events
catches both. Counting runs in the child, around fn (``run_isolated(..., events=[...])``)
or around one block (``with harness.count_events(...) as counts``).

Matching: a pattern ending in ``::`` (``"batch_invariant_ops::"``) is a namespace prefix;
any other pattern must equal the event name (``"aten::mm"``).

Registrations: ``registrations()`` snapshots every operator's kernel table and
``footprint(before, after)`` names each operator and dispatch key whose active kernel changed
(or that was newly defined) in between: what a switch installed, whether or not the checks
run the op (the "off" rule must see an override of ``aten::_log_softmax`` as surely as one
of ``aten::mm``).

Recorders (``RECORDERS``; ``$HARNESS_RECORDER`` picks one, default ``auto``): both count
the dispatcher's RecordFunction events, host-side, for every device.
- ``record-function``: torch's legacy profiler (``torch.autograd.profiler_legacy``): no
  warm-up and no tracing thread. The default on CPU and CUDA: on a loaded 2-core runner
  kineto's warm-up ("Not starting tracing - insufficient time for warmup") ended checks by
  SIGSEGV at profiler exit, and each kineto start costs about 1 s here against 0.2 ms.
- ``kineto``: ``torch.profiler.profile`` (CPU activity); the fallback where the legacy
  profiler is gone from torch.
- on NPU: the autograd profiler, as the existing Ascend test does, after a device
  synchronise so queued ops are recorded.
Which recorder counted is on the counts (``EventCounts.recorder``), in the isolated result
and in the results file, so a count can be traced to what made it.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

#: every event a batch-invariant op set emits
BATCH_INVARIANT_PREFIX = "batch_invariant_ops::"


def matches(name: str, patterns: Iterable[str]) -> bool:
    return any(name.startswith(p) if p.endswith("::") else name == p for p in patterns)


def select_counts(counts: Mapping[str, int], patterns: Iterable[str]) -> dict[str, int]:
    """The entries of ``counts`` whose name matches one of ``patterns``, sorted by name."""
    patterns = tuple(patterns)
    return {k: int(v) for k, v in sorted(counts.items()) if matches(k, patterns)}


def _synchronize(kind: str) -> None:
    import torch

    module = getattr(torch, kind, None)
    if module is not None and kind != "cpu":
        with contextlib.suppress(Exception):
            module.synchronize()


RECORDERS = ("auto", "record-function", "kineto", "autograd")
RECORDER_ENV = "HARNESS_RECORDER"


class EventCounts(dict):  # type: ignore[type-arg]
    """``{event name: count}``, and ``recorder``: the recorder that counted them."""

    recorder: str = ""


def choose_recorder(kind: str, wanted: str | None = None) -> str:
    """The recorder for a device ``kind``: ``wanted`` (or ``$HARNESS_RECORDER``), else
    ``autograd`` on NPU and ``record-function`` (no warm-up) where torch still has it."""
    import os

    wanted = wanted or os.environ.get(RECORDER_ENV) or "auto"
    if wanted not in RECORDERS:
        raise ValueError(f"{RECORDER_ENV}={wanted!r}: use one of {', '.join(RECORDERS)}")
    if wanted != "auto":
        return wanted
    if kind == "npu":
        return "autograd"
    try:
        from torch.autograd import profiler_legacy  # noqa: F401
    except ImportError:  # a torch without it: kineto, with its warm-up
        return "kineto"
    return "record-function"


def _profiler(recorder: str) -> contextlib.AbstractContextManager:  # type: ignore[type-arg]
    import torch

    if recorder == "autograd":
        return torch.autograd.profiler.profile()
    if recorder == "record-function":
        from torch.autograd import profiler_legacy

        return profiler_legacy.profile()
    return torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])


@contextlib.contextmanager
def count_events(*patterns: str) -> Iterator[dict[str, int]]:
    """Profile the block; the yielded dict holds ``{event_name: count}`` for matching events
    once the block exits (an empty dict means: not one matching event ran)."""
    if not patterns:
        raise ValueError("count_events needs at least one event name or 'namespace::' prefix")
    from harness.stack.devices import device_kind

    kind = device_kind()
    counts = EventCounts()
    counts.recorder = choose_recorder(kind)
    prof = _profiler(counts.recorder)
    try:
        with prof:
            try:
                yield counts
            finally:
                _synchronize(kind)
    finally:  # counts are filled even when the block raised: they are evidence
        totals: dict[str, int] = {}
        for avg in prof.key_averages():  # type: ignore[attr-defined]
            totals[avg.key] = totals.get(avg.key, 0) + int(avg.count)
        counts.update(select_counts(totals, patterns))


_KERNEL_LINE = ": registered at "


def registrations() -> dict[str, frozenset[str]]:
    """Every operator's active kernel lines (``Key: registered at <where>``), by operator.

    From the dispatcher's own dump (about 50 ms for ~3600 operators here); the "(inactive)"
    lines are kernels that something registered over, so they are left out.
    """
    import torch

    table: dict[str, frozenset[str]] = {}
    for name in torch._C._dispatch_get_all_op_names():
        lines = torch._C._dispatch_dump(name).splitlines()
        table[name] = frozenset(
            line for line in lines
            if _KERNEL_LINE in line and not line.startswith("debug:")
            and "(inactive)" not in line.split(_KERNEL_LINE, 1)[0])
    return table


def footprint(before: Mapping[str, frozenset[str]],
              after: Mapping[str, frozenset[str]]) -> dict[str, list[str]]:
    """``{operator: [dispatch keys]}`` whose active kernel is new or changed in ``after``."""
    changed: dict[str, list[str]] = {}
    for name, lines in sorted(after.items()):
        new = lines - before.get(name, frozenset())
        if new:
            changed[name] = sorted({line.split(_KERNEL_LINE, 1)[0] for line in new})
    return changed


def observe(fn: Callable[[], Any],
            around: Callable[[Any, tuple[Any, ...], dict[str, Any], Callable[[], Any]], Any]
            ) -> Any:
    """``fn()`` with every aten call it dispatches handed to ``around(func, args, kwargs,
    run)``, which calls ``run()`` (the op itself) and returns its result: the one dispatch
    recorder of the harness (a ``TorchDispatchMode``), for the op counts and the divergence
    locator alike."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class _Recorder(TorchDispatchMode):
        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (),
                               kwargs: Any = None) -> Any:
            kwargs = kwargs or {}
            return around(func, args, kwargs, lambda: func(*args, **kwargs))

    with _Recorder():
        return fn()


def ops_run(fn: Callable[[], Any], *, floating_only: bool = False
            ) -> tuple[Any, Counter[str]]:
    """``fn()``'s result and every aten operator (overload) it dispatched, counted: the ops
    that ran, whatever kernel served them (an override registered on the op is still the
    op), so the caller can tell which ran outside a target's overridden set.
    ``floating_only``: count only calls with a floating-point tensor among the inputs
    (integer index arithmetic cannot make logprobs batch-variant)."""
    import torch
    from torch.utils._pytree import tree_leaves

    seen: Counter[str] = Counter()

    def count(func: Any, args: Any, kwargs: dict[str, Any], run: Callable[[], Any]) -> Any:
        if not floating_only or any(isinstance(t, torch.Tensor) and t.is_floating_point()
                                    for t in tree_leaves((args, kwargs))):
            seen[str(func.name())] += 1
        return run()

    return observe(fn, count), seen
