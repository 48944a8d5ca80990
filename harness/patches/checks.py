"""The patch-guard checks. Each ``check_*`` function runs inside an isolated child (a patch
cannot be undone in-process) and returns plain data; the matching ``judge_*`` runs in the
parent and returns every problem as a sentence (empty: the check passed).

- applies: the apply function runs; each target is ``replaced`` or ``kept`` (upstream
  already has the fix), with the fingerprint of the source the patch saw;
- idempotent: a second apply leaves every target (and the spawn entry) the identical object;
- propagates: a process started with ``spawn`` through the installed entry, as vLLM starts
  its engine core, has every replaced target patched before the entry's original runs (the
  engine's main is a probe there), and that original is not None;
- upstream edit: the target's source changed on purpose (whitespace, comments, meaning), then the
  apply: a meaning change must make it raise, the other two must not;
- behaviour: a call table on stub collaborators, run on the original and the replacement;
  a difference outside the patch's declared intent fails.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import itertools
import linecache
import os
import pickle
import textwrap
import traceback
from collections.abc import Callable
from typing import Any

from harness.isolation import reaper
from harness.patches.declare import Behaviour, DeclaredPatch, install, resolve, split
from harness.patches.fingerprint import KINDS, classify, fingerprints
from harness.stack.upstream import UpstreamApiMoved, import_upstream

#: how long a spawned engine-like process may take to import the stack and report
SPAWN_TIMEOUT_S = 180.0
_variants = itertools.count()


# --- child side: shared steps ---------------------------------------------------------------

def prepare(patch: DeclaredPatch) -> Callable[[], Any]:
    """Set the patch's environment, bring in the stand-in device if it needs vllm-ascend on
    a machine without an NPU, import and return the apply function."""
    from harness.stack import devices

    os.environ.update(patch.env)
    if patch.standin and devices.device_kind() != "npu":
        from harness.invariance import standin

        standin.stand_in_native_names()
    import_upstream(split(patch.apply)[0], skip_inits=patch.skip_inits)
    try:
        apply: Callable[[], Any] = resolve(patch.apply)
    except AttributeError as exc:  # a release before (or after) the patch: not its finding
        raise UpstreamApiMoved(f"upstream API moved: {patch.releases()} has no {patch.apply} "
                            f"({exc})") from None
    # A running engine has its layers imported before any patch runs (vLLM loads the
    # platform, its ops and attention backends first); a fresh process that let the patch
    # import them in its own order would meet import cycles the engine never meets
    # (vllm-ascend 0.23.0.post1: sfa_v1 before vllm_ascend.ops -> a circular import of
    # device_op). Import the targets as the engine has them: in their declared order.
    for path in patch.targets:
        importlib.import_module(split(path)[0])
    return apply


def _locations(patch: DeclaredPatch) -> list[str]:
    return [*patch.targets, *([patch.spawn_entry] if patch.spawn_entry else [])]


def snapshot(patch: DeclaredPatch) -> dict[str, Any]:
    """The raw object at every target and at the spawn entry."""
    return {path: resolve(path, raw=True) for path in _locations(patch)}


def _function(obj: Any) -> Any:
    return obj.__func__ if isinstance(obj, (staticmethod, classmethod)) else obj


def _error(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def _source_prints(obj: Any) -> dict[str, str] | None:
    try:
        prints = fingerprints(inspect.getsource(_function(obj)))
    except (OSError, TypeError, SyntaxError):
        return None
    return {"text": prints.text, "meaning": prints.meaning}


def _marked(obj: Any, marker: str) -> bool:
    return bool(getattr(_function(obj), marker, False))


# --- applies --------------------------------------------------------------------------------

def check_applies(patch: DeclaredPatch) -> dict[str, Any]:
    try:
        apply = prepare(patch)
        before = snapshot(patch)
    except ImportError as exc:
        return {"unimportable": _error(exc)}
    rows = {path: {"fingerprint": _source_prints(obj)} for path, obj in before.items()}
    try:
        apply()
    except Exception as exc:  # noqa: BLE001 - the outcome under test
        return {"raised": _error(exc), "cause": _error(exc.__cause__) if exc.__cause__ else None,
                "targets": rows}
    after = snapshot(patch)
    for path, row in rows.items():
        row["status"] = "kept" if after[path] is before[path] else "replaced"
        row["marked"] = _marked(after[path], patch.marker)
    return {"raised": None, "targets": rows}


def judge_applies(patch: DeclaredPatch, got: dict[str, Any]) -> list[str]:
    if got.get("raised"):
        cause = f" (caused by {got['cause']})" if got.get("cause") else ""
        return [f"{patch.apply} raised on {patch.releases()}: {got['raised']}{cause}"]
    return [f"{path} was replaced without the marker {patch.marker}"
            for path, row in got["targets"].items()
            if path in patch.targets and path not in patch.guarded_by
            and row["status"] == "replaced" and not row["marked"]]


# --- idempotent -----------------------------------------------------------------------------

def check_idempotent(patch: DeclaredPatch) -> dict[str, Any]:
    apply = prepare(patch)
    apply()
    first = snapshot(patch)
    try:
        apply()
    except Exception as exc:  # noqa: BLE001 - e.g. its own replacement fails its fingerprint
        return {"changed": {}, "second_raised": _error(exc)}
    second = snapshot(patch)
    return {"changed": {path: f"{first[path]!r} -> {second[path]!r}"
                        for path in first if second[path] is not first[path]}}


def judge_idempotent(patch: DeclaredPatch, got: dict[str, Any]) -> list[str]:
    if got.get("second_raised"):
        return [f"a second apply raised {got['second_raised']} (the replacement it finds is "
                "not recognised as its own: no marker?)"]
    return [f"a second apply replaced {path} again ({change})"
            for path, change in got["changed"].items()]


# --- propagates -----------------------------------------------------------------------------

def _spawned_engine(patch: DeclaredPatch, entry: bytes, replaced: list[str], conn: Any) -> None:
    """A fresh spawn process, as vLLM starts its engine core: the upstream entry is swapped
    for a probe (the engine main: it reports what is patched when it runs), then the
    installed entry, unpickled by reference, is called."""
    try:
        prepare(patch)
        assert patch.spawn_entry is not None
        pristine = {path: resolve(path, raw=True) for path in replaced}
        seen: dict[str, Any] = {}

        def probe(*args: Any, **kwargs: Any) -> str:
            seen.update({path: resolve(path, raw=True) is not pristine[path]
                         for path in replaced})
            return "engine main ran"

        raw_entry = resolve(patch.spawn_entry, raw=True)
        install(patch.spawn_entry,
                staticmethod(probe) if isinstance(raw_entry, staticmethod) else probe)
        try:
            ran = pickle.loads(entry)()
        except Exception as exc:  # noqa: BLE001 - the outcome under test
            conn.send({"raised": _error(exc), "patched": seen})
            return
        conn.send({"raised": None, "ran": ran, "patched": seen})
    except BaseException:  # noqa: BLE001 - report, never hang the parent
        conn.send({"failed": traceback.format_exc()})


def check_propagates(patch: DeclaredPatch) -> dict[str, Any]:
    import multiprocessing

    if patch.spawn_entry is None:
        return {"entry": None}
    apply = prepare(patch)
    before = snapshot(patch)
    apply()
    after = snapshot(patch)
    replaced = [p for p in patch.targets if after[p] is not before[p]]
    entry = _function(after[patch.spawn_entry])
    if after[patch.spawn_entry] is before[patch.spawn_entry]:
        return {"entry": "upstream", "replaced": replaced}
    try:
        data = pickle.dumps(entry)
    except Exception as exc:  # noqa: BLE001
        return {"entry": repr(entry), "replaced": replaced, "unpicklable": _error(exc)}
    ctx = multiprocessing.get_context("spawn")
    ours, theirs = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_spawned_engine, args=(patch, data, replaced, theirs))
    proc.start()
    theirs.close()
    report = ours.recv() if ours.poll(SPAWN_TIMEOUT_S) else {
        "failed": f"the spawned process sent nothing in {SPAWN_TIMEOUT_S:.0f} s"}
    proc.join(5)
    if proc.is_alive():  # it and whatever it started, by the reaper's one ladder
        reaper.end_tree(proc.pid)
        proc.join()
    return {"entry": f"{entry.__module__}.{entry.__qualname__}", "replaced": replaced, **report}


def judge_propagates(patch: DeclaredPatch, got: dict[str, Any]) -> list[str]:
    if got["entry"] is None:
        return []
    if got["entry"] == "upstream":
        if got["replaced"]:
            return [f"{', '.join(got['replaced'])} replaced, but no spawn entry installed at "
                    f"{patch.spawn_entry}: a spawned engine process runs unpatched"]
        return []
    if "unpicklable" in got:
        return [f"the installed entry {got['entry']} cannot be pickled by reference, so "
                f"spawn cannot start it: {got['unpicklable']}"]
    if "failed" in got:
        return [f"the spawned process failed before the entry ran:\n{got['failed']}"]
    problems = []
    if got["raised"]:
        problems.append(f"in a spawned process the entry {got['entry']} raised {got['raised']}"
                        + (" (its original is None: the entry did not re-apply the patch "
                           "before calling it)" if "NoneType" in got["raised"] else ""))
    unpatched = [p for p in got["replaced"] if not got["patched"].get(p)]
    if unpatched and got["patched"]:
        problems.append(f"in a spawned process the engine main ran with {', '.join(unpatched)} "
                        "unpatched")
    return problems


# --- upstream edits -------------------------------------------------------------------------

def _mutated(source: str) -> str:
    """The source changed in meaning: the first ``if`` negated, else the first method call
    renamed, else the first return made ``return None``."""
    tree = ast.parse(source)
    nodes = list(ast.walk(tree))
    for node in nodes:
        if isinstance(node, ast.If):
            node.test = ast.UnaryOp(op=ast.Not(), operand=node.test)
            return ast.unparse(tree)
    for node in nodes:
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            node.func.attr += "_changed"
            return ast.unparse(tree)
    for node in nodes:
        if isinstance(node, ast.Return):
            node.value = ast.Constant(None)
            return ast.unparse(tree)
    raise ValueError("nothing to change in meaning")


def variant(source: str, kind: str) -> str:
    """``source`` (a dedented ``def``) changed in one kind (``whitespace``, ``comments``,
    ``meaning``)."""
    lines = source.splitlines()
    func = ast.parse(source).body[0]
    assert isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef))
    first = func.body[0].lineno - 1  # the first statement (or docstring) line, 0-based
    indent = lines[first][:len(lines[first]) - len(lines[first].lstrip())]
    if kind == "whitespace":  # a blank line in the body and trailing spaces
        return "\n".join([*lines[:first], "", *(line + "  " for line in lines[first:])]) + "\n"
    if kind == "comments":
        return "\n".join([*lines[:first], f"{indent}# npu-regress: a comment-only change",
                          *lines[first:]]) + "\n"
    if kind == "meaning":
        return _mutated(source) + "\n"
    raise ValueError(f"unknown kind of change {kind!r}; one of {KINDS[1:]}")


def _compile_like(source: str, original: Any) -> Any:
    """A function from ``source`` in ``original``'s module globals, whose source
    ``inspect.getsource`` can read (registered with linecache, as a file would be)."""
    filename = f"<npu-regress edit {next(_variants)}: {original.__qualname__}>"
    lines = source.splitlines(keepends=True)
    linecache.cache[filename] = (len(source), None, lines, filename)
    namespace: dict[str, Any] = {}
    exec(compile(source, filename, "exec"), original.__globals__, namespace)  # noqa: S102
    func = namespace[original.__name__]
    func.__qualname__ = original.__qualname__
    func.__module__ = original.__module__
    return func


def check_upstream_edit(patch: DeclaredPatch, target: str, kind: str) -> dict[str, Any]:
    apply = prepare(patch)
    raw = resolve(target, raw=True)
    original = _function(raw)
    source = textwrap.dedent(inspect.getsource(original))
    changed = variant(source, kind)
    measured = classify(fingerprints(source), fingerprints(changed))
    func = _compile_like(changed, original)
    install(target, type(raw)(func) if isinstance(raw, (staticmethod, classmethod)) else func)
    try:
        apply()
    except Exception as exc:  # noqa: BLE001 - the outcome under test
        return {"kind": kind, "measured": measured, "raised": _error(exc)}
    kept = _function(resolve(target, raw=True)) is func
    return {"kind": kind, "measured": measured, "raised": None,
            "status": "kept" if kept else "replaced"}


def judge_upstream_edit(patch: DeclaredPatch, target: str, got: dict[str, Any]) -> list[str]:
    kind, raised = got["kind"], got["raised"]
    if got["measured"] != kind:
        return [f"the {kind} variant of {target} measured as a {got['measured']} change"]
    if kind == "meaning" and not raised:
        return [f"{target} changed in meaning, and {patch.apply} did not raise: it "
                f"{got['status']} the changed upstream (no fail-fast on a meaning change)"]
    if kind != "meaning" and raised:
        return [f"a {kind}-only change of {target} made {patch.apply} raise ({raised}): its "
                f"fingerprint rejects {kind} changes, so a reformatted upstream fails start-up"]
    return []


# --- behaviour ------------------------------------------------------------------------------

def check_behaviour(patch: DeclaredPatch, behaviour: Behaviour) -> dict[str, Any]:
    apply = prepare(patch)
    table: Callable[[Any], dict[str, str]] = resolve(behaviour.table)
    original = _function(resolve(behaviour.target, raw=True))
    before = table(original)
    apply()
    patched = _function(resolve(behaviour.target, raw=True))
    if patched is original:
        return {"kept": True, "original": before}
    return {"kept": False, "original": before, "patched": table(patched)}


def judge_behaviour(behaviour: Behaviour, got: dict[str, Any]) -> tuple[list[str], list[str]]:
    """(problems, the cases that differ)."""
    if got["kept"]:
        return [], []
    before, after = got["original"], got["patched"]
    differ = sorted(c for c in set(before) | set(after) if before.get(c) != after.get(c))
    problems = [f"{behaviour.target} behaves differently, outside the patch's declared "
                f"intent, for {case}: upstream {before.get(case)!r}, patched "
                f"{after.get(case)!r}" for case in differ if case not in behaviour.intent]
    return problems, differ
