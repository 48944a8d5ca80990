"""The first divergent op: where, in execution order, the probe's numbers first differ
between its batch-size-1 run and a batch-N run.

A logprob difference says *that* batch size matters, and "ran outside the invariant set"
says which ops could be to blame; this says which op it was, the way an API-level accuracy
comparator localises a precision bug, but across batch sizes. Both passes run under a
dispatch-level recorder that keeps, for each floating-point output of each aten call, a
digest of each row (rows: the leading dimension) and, within a byte budget, the tensor.
Then, in the alone run's order, each call's output must appear bit for bit in the batch
run, as a block of rows of a later call of the same operator with the same trailing shape
(the probe's rows inside the batch's packed or stacked tensor, or the probe's own call of a
per-sequence op). The first call that does not is the first divergent op: its name and
overload, shapes, dtype and the largest ULP distance to the nearest candidate.

View and copy operators are skipped (their outputs are other tensors' bits; layouts that
move the rows elsewhere would read as divergence), and so are allocations (their bytes are
whatever was in memory). An operator that writes into an argument (schema ``Tensor(a!)``:
vLLM's custom kernels ``_C::rms_norm(out, ...)``, attention writing its output buffer, the
``out=`` forms) is recorded by what it wrote there. Child side (it runs the model).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from harness.logprobs.bits import compare_bits

#: bytes of output tensors kept per pass for the ULP figure (digests are always kept)
TENSOR_BUDGET = 256 * 2 ** 20
#: calls recorded per pass; past it the recorder stops and says so
MAX_CALLS = 200_000
#: operators whose output is a view or a copy of their input's bits
SKIP = {"view", "_unsafe_view", "reshape", "transpose", "t", "permute", "expand", "slice",
        "select", "unsqueeze", "squeeze", "as_strided", "alias", "detach", "clone", "copy",
        "_to_copy", "contiguous", "lift_fresh", "split", "split_with_sizes", "unbind",
        "chunk", "narrow", "index_select", "embedding", "index", "gather", "cat", "stack",
        "repeat_interleave", "flip", "roll", "new_empty", "empty_like", "zeros_like",
        "ones_like", "fill", "zero", "_reshape_alias", "unfold", "masked_fill",
        # uninitialised memory: its bytes are whatever was there
        "empty", "empty_strided", "new_empty_strided", "resize", "resize_", "set"}


@dataclass
class Call:
    """One floating-point output of one aten call."""

    op: str
    index: int
    shape: tuple[int, ...]
    dtype: str
    rows: list[bytes]
    tensor: Any = None


@dataclass
class Recording:
    calls: list[Call] = field(default_factory=list)
    kept_bytes: int = 0
    truncated: bool = False


def _op_name(func: Any) -> str:
    overload = getattr(func, "_overloadname", "default")
    return f"{func.name()}.{overload}" if "." not in func.name() else func.name()


def _base(op: str) -> str:
    return op.split("::")[-1].split(".")[0]


def _row_digests(t: Any) -> list[bytes]:
    import torch

    flat = t.detach().contiguous().reshape(t.shape[0], -1) if t.dim() else t.reshape(1, 1)
    raw = flat.view(torch.uint8) if flat.dtype.itemsize > 0 else flat
    data = raw.cpu().numpy()
    return [hashlib.blake2b(row.tobytes(), digest_size=8).digest() for row in data]


def _written(func: Any, args: Any, kwargs: dict[str, Any]) -> list[Any]:
    """The arguments ``func``'s schema says it writes (``Tensor(a!)``), after the call."""
    schema = getattr(func, "_schema", None)
    if schema is None:
        return []
    found = []
    for i, arg in enumerate(schema.arguments):
        info = arg.alias_info
        if info is None or not info.is_write:
            continue
        value = kwargs.get(arg.name, args[i] if i < len(args) and not arg.kwarg_only else None)
        found.append(value)
    return found


def record(fn: Callable[[], Any]) -> tuple[Any, Recording]:
    """``fn()`` under the recorder: its result and the recording."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves

    rec = Recording()

    class _Recorder(TorchDispatchMode):
        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (),
                               kwargs: Any = None) -> Any:
            out = func(*args, **(kwargs or {}))
            if rec.truncated or _base(func.name()) in SKIP:
                return out
            name = _op_name(func)
            leaves = tree_leaves(out)
            returned = {id(t) for t in leaves}
            leaves += [t for t in _written(func, args, kwargs or {}) if id(t) not in returned]
            for t in leaves:
                if not isinstance(t, torch.Tensor) or not t.is_floating_point() \
                        or t.numel() == 0:
                    continue
                if len(rec.calls) >= MAX_CALLS:
                    rec.truncated = True
                    break
                call = Call(name, len(rec.calls), tuple(t.shape), str(t.dtype).removeprefix(
                    "torch."), _row_digests(t))
                size = t.numel() * t.element_size()
                if rec.kept_bytes + size <= TENSOR_BUDGET:
                    call.tensor = t.detach().cpu().clone()
                    rec.kept_bytes += size
                rec.calls.append(call)
            return out

    with _Recorder():
        result = fn()
    return result, rec


def _find_block(needle: list[bytes], hay: list[bytes]) -> int | None:
    """The offset of ``needle`` as a contiguous block of ``hay``, or None."""
    n = len(needle)
    for start in range(len(hay) - n + 1):
        if hay[start:start + n] == needle:
            return start
    return None


def _nearest(alone: Call, candidates: list[Call]) -> tuple[Call | None, int, float]:
    """The candidate block closest to ``alone``'s output: (call, max ULP, max |diff|)."""
    best: tuple[Call | None, int, float] = (candidates[0] if candidates else None, -1,
                                            float("nan"))
    if alone.tensor is None:
        return best
    r = alone.shape[0] if alone.shape else 1
    for cand in candidates[:32]:
        if cand.tensor is None:
            continue
        for start in range(0, cand.shape[0] - r + 1):
            block = cand.tensor[start:start + r]
            if block.shape != alone.tensor.shape:
                continue
            found = compare_bits(alone.tensor, block)
            if found is None:
                return cand, 0, 0.0
            if best[1] < 0 or found[1] < best[2]:
                best = (cand, found[2], found[1])
    return best


@dataclass(frozen=True)
class Divergence:
    op: str
    #: the call's place among the alone run's recorded calls, and the operator's own count
    index: int
    occurrence: int
    shape_alone: tuple[int, ...]
    shape_batch: tuple[int, ...] | None
    dtype: str
    max_ulp: int
    max_abs_diff: float
    calls_alone: int

    def sentence(self, batch_size: int) -> str:
        nth = {1: "1st", 2: "2nd", 3: "3rd"}.get(self.occurrence, f"{self.occurrence}th")
        ulp = f"max {self.max_ulp} ULP" if self.max_ulp >= 0 else "ULP not kept"
        batch = list(self.shape_batch) if self.shape_batch else "no candidate"
        return (f"first divergent op: {self.op} (its {nth} call, #{self.index + 1} of "
                f"{self.calls_alone} recorded), output {list(self.shape_alone)} alone vs "
                f"{batch} at batch size {batch_size}, {self.dtype}, {ulp} "
                f"(max |diff| {self.max_abs_diff:.3g})")


def first_divergence(alone: Recording, batch: Recording) -> Divergence | None:
    """The first call of the alone run whose output the batch run does not contain."""
    by_op: dict[tuple[str, tuple[int, ...]], list[Call]] = {}
    for call in batch.calls:
        by_op.setdefault((call.op, call.shape[1:]), []).append(call)
    seen: dict[str, int] = {}
    cursor: dict[tuple[str, tuple[int, ...]], int] = {}
    for call in alone.calls:
        seen[call.op] = seen.get(call.op, 0) + 1
        key = (call.op, call.shape[1:])
        pool = by_op.get(key, [])
        start = cursor.get(key, 0)
        found = next((i for i in range(start, len(pool))
                      if _find_block(call.rows, pool[i].rows) is not None), None)
        if found is not None:
            cursor[key] = found + 1
            continue
        cand, ulp, diff = _nearest(call, pool[start:])
        return Divergence(call.op, call.index, seen[call.op], call.shape,
                          cand.shape if cand else None, call.dtype, ulp, diff,
                          len(alone.calls))
    return None


def locate(alone: Callable[[], Any], batch: Callable[[], Any]) -> Divergence | None:
    """Run both passes under the recorder; the first divergent op, or None (no op's output
    differs: the difference is after the last aten call, or the passes did not reproduce
    it)."""
    _, a = record(alone)
    _, b = record(batch)
    return first_divergence(a, b)
