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
per-sequence op), or else its rows, in order, spread over later calls (chunked prefill
splits the probe's prompt where the step's shared token budget ends, which moves with the
batch). The first call that does not is the first divergent op: its name and
overload, shapes, dtype and the largest ULP distance to the nearest candidate.

View and copy operators are skipped (their outputs are other tensors' bits; layouts that
move the rows elsewhere would read as divergence), and so are allocations (their bytes are
whatever was in memory). An operator that writes into an argument (schema ``Tensor(a!)``:
vLLM's custom kernels ``_C::rms_norm(out, ...)``, attention writing its output buffer, the
``out=`` forms) is recorded by what it wrote there. Child side (it runs the model).
"""

from __future__ import annotations

import ctypes
import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from harness.logprobs.bits import compare_bits
from harness.stack.dispatch import observe

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
        # constants: their bytes come from no row ("full_like(x, c)" reads x's shape only)
        "full", "full_like", "zeros", "ones", "scalar_tensor", "arange",
        # casts: a function of their input's bits alone, so never where a difference starts
        # (a wider batch tensor's cast, vLLM's (N, k+1) logprobs for (1, 1) alone, would
        # read as one), and the conjugate/negation views
        "to", "resolve_conj", "resolve_neg",
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
    #: the recorded calls whose outputs this call read (through views and copies)
    inputs: frozenset[int] = frozenset()


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
    """A digest of each row's bytes. Read with ctypes, not numpy: numpy is no dependency of
    ours, and a torch without it raised "Numpy is not available" exactly here, when a case
    differed and its diagnosis was wanted."""
    flat = t.detach().cpu().contiguous()
    rows = flat.shape[0] if flat.dim() else 1
    data = ctypes.string_at(flat.data_ptr(), flat.nbytes) if flat.nbytes else b""
    width = len(data) // rows if rows else 0
    return [hashlib.blake2b(data[i * width:(i + 1) * width], digest_size=8).digest()
            for i in range(rows)]


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
    """``fn()`` under the recorder (``harness.stack.dispatch.observe``): its result and
    the recording."""
    import torch
    from torch.utils._pytree import tree_leaves

    rec = Recording()
    #: storage -> the recorded calls its bytes came from (the last writer's)
    origin: dict[int, frozenset[int]] = {}

    def storage(t: Any) -> int | None:
        try:
            return int(t.untyped_storage().data_ptr())
        except (RuntimeError, NotImplementedError):
            return None

    def note(func: Any, args: Any, kwargs: dict[str, Any], run: Callable[[], Any]) -> Any:
        if rec.truncated:
            return run()
        read = frozenset().union(*(origin.get(storage(t), frozenset()) for t in
                                   tree_leaves((args, kwargs))
                                   if isinstance(t, torch.Tensor)))
        out = run()
        if _base(func.name()) in SKIP:  # a view or a copy: the same origin
            for t in tree_leaves(out):
                if isinstance(t, torch.Tensor):
                    origin[storage(t)] = read
            return out
        name = _op_name(func)
        leaves = tree_leaves(out)
        returned = {id(t) for t in leaves}
        leaves += [t for t in _written(func, args, kwargs) if id(t) not in returned]
        for t in leaves:
            if isinstance(t, torch.Tensor):
                origin[storage(t)] = frozenset()
            if not isinstance(t, torch.Tensor) or not t.is_floating_point() \
                    or t.numel() == 0:
                continue
            if len(rec.calls) >= MAX_CALLS:
                rec.truncated = True
                break
            call = Call(name, len(rec.calls), tuple(t.shape), str(t.dtype).removeprefix(
                "torch."), _row_digests(t), inputs=read)
            origin[storage(t)] = frozenset((call.index,))
            size = t.numel() * t.element_size()
            if rec.kept_bytes + size <= TENSOR_BUDGET:
                call.tensor = t.detach().cpu().clone()
                rec.kept_bytes += size
            rec.calls.append(call)
        return out

    return observe(fn, note), rec


def _find_block(needle: list[bytes], hay: list[bytes]) -> int | None:
    """The offset of ``needle`` as a contiguous block of ``hay``, or None."""
    n = len(needle)
    for start in range(len(hay) - n + 1):
        if hay[start:start + n] == needle:
            return start
    return None


def _nearest(alone: Call, candidates: list[Call]) -> tuple[Call | None, int, float]:
    """How far ``alone``'s output is from the batch's: for each of its rows that no
    candidate holds bit for bit, the nearest candidate row (the probe's rows may sit in one
    block or spread over calls); (the call holding the first such row's nearest, the
    largest ULP distance, the largest |diff|) over those rows. ULP -1: nothing kept."""
    import torch

    kept = [c for c in candidates[:32] if c.tensor is not None and c.tensor.dim()]
    if alone.tensor is None or not kept or not alone.tensor.dim():
        return (candidates[0] if candidates else None), -1, float("nan")
    present = {r for c in kept for r in c.rows}
    missing = [i for i, r in enumerate(alone.rows) if r not in present]
    mine = alone.tensor.reshape(alone.tensor.shape[0], -1).double()
    theirs = [(c, c.tensor.reshape(c.tensor.shape[0], -1).double()) for c in kept]
    holder: Call | None = None
    worst_ulp, worst_diff = 0, 0.0
    for i in missing:
        best: tuple[float, Call, int] | None = None
        for cand, rows in theirs:
            far = (rows - mine[i]).abs().amax(dim=1)
            far = torch.where(torch.isnan(far), torch.full_like(far, float("inf")), far)
            k = int(far.argmin())
            if best is None or float(far[k]) < best[0]:
                best = (float(far[k]), cand, k)
        assert best is not None
        diff, cand, k = best
        holder = holder or cand
        found = compare_bits(alone.tensor[i], cand.tensor[k])
        worst_ulp = max(worst_ulp, found[2] if found else 0)
        worst_diff = max(worst_diff, diff)
    return holder or kept[0], worst_ulp, worst_diff


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
    #: earlier calls with no near batch row, not read by this one (rows one pass computed
    #: and the other did not: a prompt chunk's discarded logits), and the first of them
    passed_over: int = 0
    first_passed_over: str = ""
    #: ops that ran only in the batch pass on the probe's data (a path the batch size or
    #: the load switched on): "op #n" each, the first few; the op before them there; and
    #: the first op whose input came from them ("" where none was recorded: the result)
    only_in_batch: tuple[str, ...] = ()
    only_in_batch_count: int = 0
    only_in_batch_after: str = ""
    read_by: str = ""
    calls_batch: int = 0

    def _changed_path(self, other: str) -> str:
        more = (f" and {self.only_in_batch_count - len(self.only_in_batch)} more"
                if self.only_in_batch_count > len(self.only_in_batch) else "")
        after = f", after {self.only_in_batch_after}" if self.only_in_batch_after else ""
        return (f"ran only in {other} ({', '.join(self.only_in_batch)}{more} of "
                f"{self.calls_batch} recorded there{after})")

    def sentence(self, batch_size: int, other: str = "") -> str:
        """One line for the table; ``other`` names the second run where it is not a batch
        size's (the serving family: "the loaded run")."""
        run = other or "the batch pass"
        if self.only_in_batch and self.index < 0:  # the alone run's ops all matched
            reader = (f"the first op reading them: {self.read_by}" if self.read_by else
                      "no recorded op reads them (their output is the result)")
            where = other or f"the batch pass at batch size {batch_size}"
            return (f"first divergent op: {self.op}, which {self._changed_path(run)}; "
                    f"{reader}; every op of the alone run ({self.calls_alone} recorded) has "
                    f"its output in {where} bit for bit")
        ulp = f"max {self.max_ulp} ULP" if self.max_ulp >= 0 else "ULP not kept"
        batch = list(self.shape_batch) if self.shape_batch else "no candidate"
        vs = f"{batch} in {other}" if other else f"{batch} at batch size {batch_size}"
        over = (f"; passed over before it: {self.passed_over} call(s) with no near row in "
                f"{run}, which it does not read (rows only one schedule computed? first "
                f"{self.first_passed_over})" if self.passed_over else "")
        told = (f"(its {_nth(self.occurrence)} call, #{self.index + 1} of {self.calls_alone}"
                f" recorded), output {list(self.shape_alone)} alone vs {vs}, {self.dtype}, "
                f"{ulp} (max |diff| {self.max_abs_diff:.3g}){over}")
        if self.only_in_batch:  # the alone call differs because its batch input did
            return (f"first divergent op: {self.op}, which {self._changed_path(run)}; the "
                    f"first op of the alone run whose counterpart there read them: "
                    f"{self.read_by} {told}")
        return f"first divergent op: {self.op} {told}"


def _nth(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def _rows_across(needle: list[bytes], pool: list[Call], start: int) -> list[int] | None:
    """The pool positions holding ``needle``'s rows, if each of them, in order, is a row
    of ``pool[start:]``: the probe's rows in other blocks than the alone run's (chunked
    prefill splits a prompt by the step's token budget, which other sequences share)."""
    at, row, holders = start, 0, []
    for digest in needle:
        while at < len(pool):
            rows = pool[at].rows
            found = next((j for j in range(row, len(rows)) if rows[j] == digest), None)
            if found is not None:
                row = found + 1
                if not holders or holders[-1] != at:
                    holders.append(at)
                break
            at, row = at + 1, 0
        else:
            return None
    return holders


#: how many of the ops that ran only in the batch pass a sentence names
NAMED = 3


#: a window between two anchors where the batch pass ran more calls than this beyond the
#: alone pass's holds other work (another request's whole step, a recomputation after a
#: preemption), not a path inserted into the probe's: it is not searched
MAX_INSERTED = 16


def _only_in_batch(alone: Recording, batch: Recording,
                   anchors: list[tuple[int, int]]) -> list[list[int]]:
    """Runs of batch calls on a path the alone run did not take there: between two
    anchors (calls of the two runs that hold the probe's rows bit for bit), the batch calls
    that the alone run's calls between the same anchors do not account for, op name by op
    name (``difflib``'s alignment), where the window holds at most ``MAX_INSERTED`` more
    calls than the alone one. Positional, not global: the same op elsewhere in the alone
    run (its prefill, where the batch's row count is reached alone too) is no excuse. A
    run that repeats the calls just before or after it (per-sequence work done for more
    sequences: attention one sequence at a time) is the same path, not a new one. Other
    requests' sampling ops are flagged too; a path is named only where it reaches the
    probe (``first_divergence``)."""
    from difflib import SequenceMatcher

    runs: list[list[int]] = []
    every = [c.op for c in batch.calls]
    for (a0, b0), (a1, b1) in zip(anchors, anchors[1:], strict=False):
        ours = [c.op for c in alone.calls[a0 + 1:a1]]
        theirs = [c.op for c in batch.calls[b0 + 1:b1]]
        if not theirs or len(theirs) - len(ours) > MAX_INSERTED:
            continue
        match = SequenceMatcher(None, ours, theirs, autojunk=False)
        for tag, _, _, j1, j2 in match.get_opcodes():
            if tag in ("insert", "replace") and not _repeats(every, b0 + 1 + j1,
                                                             b0 + 1 + j2):
                runs.append(list(range(b0 + 1 + j1, b0 + 1 + j2)))
    return runs


def _repeats(ops: list[str], j1: int, j2: int) -> bool:
    """``ops[j1:j2]`` is the ``p`` ops just before or just after it, once or more."""
    run = ops[j1:j2]
    for p in range(1, len(run) + 1):
        if len(run) % p or run != run[:p] * (len(run) // p):
            continue
        if ops[max(j1 - p, 0):j1] == run[:p] or ops[j2:j2 + p] == run[:p]:
            return True
    return False


def _closure(batch: Recording, seeds: set[int]) -> set[int]:
    """``seeds`` and every batch call that read one of them, through any chain."""
    reached = set(seeds)
    for call in batch.calls:
        if call.index not in reached and call.inputs & reached:
            reached.add(call.index)
    return reached


def _ancestors(batch: Recording, index: int) -> set[int]:
    """The batch calls whose outputs ``index`` read, through any chain (itself excluded)."""
    found: set[int] = set()
    todo = list(batch.calls[index].inputs)
    while todo:
        i = todo.pop()
        if i not in found:
            found.add(i)
            todo.extend(batch.calls[i].inputs)
    return found


def first_divergence(alone: Recording, batch: Recording) -> Divergence | None:
    """The first call of the alone run whose output the batch run does not contain, as a
    block of one call's rows or, in order, as rows spread over later calls. A call whose
    nearest batch row is another row, not a rounding of its own (``FAR``), or that has no
    batch counterpart at all, may be a row only one schedule computed (chunked prefill's
    logits of a chunk's last token; a logprobs tensor (1, 1) alone and (N, k + 1) beside
    requests asking for k): it is passed over (and counted), with every unmatched call
    that read it, in favour of a later call that differs by rounding; if there is none, it
    is the first divergent op.

    A path that only the batch pass took (``_only_in_batch``) is named when it reaches the
    probe: an unmatched call whose batch counterpart read it names those ops (the extra
    op, not its consumer); an alone run matched bit for bit names those that read the
    probe's rows (an op appended to the probe's result)."""
    by_op: dict[tuple[str, tuple[int, ...]], list[Call]] = {}
    for call in batch.calls:
        by_op.setdefault((call.op, call.shape[1:]), []).append(call)
    seen: dict[str, int] = {}
    cursor: dict[tuple[str, tuple[int, ...]], int] = {}
    unmatched: list[tuple[Call, int, int]] = []  # (call, occurrence, pool start)
    holding: set[int] = set()  # batch calls holding the probe's rows, bit for bit
    anchors: list[tuple[int, int]] = []  # (alone, batch) calls, increasing in both
    for call in alone.calls:
        seen[call.op] = seen.get(call.op, 0) + 1
        key = (call.op, call.shape[1:])
        pool = by_op.get(key, [])
        start = cursor.get(key, 0)
        found = next((i for i in range(start, len(pool))
                      if _find_block(call.rows, pool[i].rows) is not None), None)
        at = [found] if found is not None else \
            _rows_across(call.rows, pool, start)  # (the rest: a later step's)
        if not at:
            unmatched.append((call, seen[call.op], start))
            continue
        holding.update(pool[i].index for i in at)
        if not anchors or pool[at[0]].index > anchors[-1][1]:
            anchors.append((call.index, pool[at[0]].index))
        cursor[key] = at[0] + 1  # (the next may share a call with this one's rest)
    runs = _only_in_batch(alone, batch, anchors)
    only = {i for run in runs for i in run}
    tainted = _closure(batch, only) if only else set()
    over: list[tuple[Call, int, Call | None, int, float]] = []
    passed: set[int] = set()
    diverged = None
    changed: tuple[Call, int, list[Call]] | None = None
    for call, occurrence, start in unmatched:
        key = (call.op, call.shape[1:])
        pool = by_op.get(key, [])[start:]
        if pool and pool[0].index in tainted:  # its batch counterpart read the new path
            changed = call, occurrence, pool
            break
        if call.inputs & passed:  # it read one of those: not a cause of its own
            passed.add(call.index)
            continue
        cand, ulp, diff = _nearest(call, pool)
        if not pool or _no_counterpart(call, diff):
            over.append((call, occurrence, cand, ulp, diff))
            passed.add(call.index)
            continue
        diverged = call, occurrence, cand, ulp, diff
        break
    extra = {"calls_batch": len(batch.calls)}
    if changed is not None:
        call, occurrence, pool = changed
        feeding = _ancestors(batch, pool[0].index) & only
        _, ulp, diff = _nearest(call, pool)
        op, path = _path(batch, runs, feeding, pool[0].op)
        return Divergence(op, call.index, occurrence, call.shape, pool[0].shape, call.dtype,
                          ulp, diff, len(alone.calls), **path, **extra)
    if diverged is None and not over:
        on_probe = {i for i in only if _ancestors(batch, i) & holding}
        if not on_probe:
            return None
        readers = sorted(_closure(batch, on_probe) - on_probe)
        first = batch.calls[min(on_probe)]
        op, path = _path(batch, runs, on_probe, batch.calls[readers[0]].op if readers else "",
                         last=False)
        return Divergence(op, -1, 0, (), first.shape, first.dtype, -1, float("nan"),
                          len(alone.calls), **path, **extra)
    if diverged is None:  # nothing but far ones: the first of them is the cause
        diverged, over = over[0], []
    call, occurrence, cand, ulp, diff = diverged
    before = [c for c, *_ in over]
    return Divergence(call.op, call.index, occurrence, call.shape,
                      cand.shape if cand else None, call.dtype, ulp, diff, len(alone.calls),
                      len(before), f"{before[0].op} #{before[0].index + 1}" if before
                      else "", **extra)


def _path(batch: Recording, runs: list[list[int]], reached: set[int], read_by: str, *,
          last: bool = True) -> tuple[str, dict[str, Any]]:
    """The fields that name a path only the batch pass took: of the runs with a call in
    ``reached``, the one nearest the probe's difference (``last``) or the first; its op
    names the path (``op``)."""
    touching = [run for run in runs if reached & set(run)]
    run = touching[-1] if last else touching[0]
    calls = [batch.calls[i] for i in run]
    first = run[0]
    return calls[0].op, {
        "read_by": read_by,
        "only_in_batch": tuple(f"{c.op} #{c.index + 1}" for c in calls[:NAMED]),
        "only_in_batch_count": sum(len(r) for r in touching),
        "only_in_batch_after": f"{batch.calls[first - 1].op} #{first}" if first else ""}


#: an unmatched call's nearest candidate this far off (relative to its largest value) is
#: another row, not the probe's one rounded otherwise: at the first divergent op the
#: inputs are still bit-equal, so its output differs by rounding (a few ULP), not by this
FAR = 2.0 ** -4


def _no_counterpart(call: Call, diff: float) -> bool:
    """The batch pass never computed this row (it is not merely rounded otherwise)."""
    if call.tensor is None or diff != diff:  # nothing kept, or no candidate: cannot tell
        return False
    scale = float(call.tensor.abs().max()) if call.tensor.numel() else 0.0
    return scale > 0 and diff > FAR * scale


def locate(alone: Callable[[], Any], batch: Callable[[], Any]) -> Divergence | None:
    """Run both passes under the recorder; the first divergent op, or None (no op's output
    differs: the difference is after the last aten call, or the passes did not reproduce
    it)."""
    _, a = record(alone)
    _, b = record(batch)
    return first_divergence(a, b)
