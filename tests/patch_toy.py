"""A small "upstream" (an engine with a wake-up and a spawn entry) and patches of it, one
written carefully and seven broken on purpose: the patch guard's negative controls. The
real declared set (verl's GLM-5.2 patches) runs against the real releases in the suite."""

from __future__ import annotations

import inspect
from typing import Any

from harness.patches import Behaviour, DeclaredPatch
from harness.patches.fingerprint import fingerprints

MARKER = "_toy_patched"
_original_run_engine: Any = None


class Engine:
    def __init__(self) -> None:
        self.calls: list[str] = []

    def wake_up(self, tags: list[str] | None = None) -> bool:
        """Wake the executor, then resume scheduling."""
        if tags is None or tags:
            self.calls.append(f"wake {tags}")
        self.calls.append("resume")
        return True

    @staticmethod
    def run_engine(*args: Any, **kwargs: Any) -> str:
        return "engine ran"


#: what the careful patch was written against: the meaning of the pristine source
KNOWN_MEANING = fingerprints(inspect.getsource(Engine.wake_up)).meaning
#: what a verl-style patch compares: the whitespace-free text (comments included)
KNOWN_TEXT = "".join(inspect.getsource(Engine.wake_up).split())
#: what the strictest patch compares: the source exactly, every space of it
KNOWN_SOURCE = inspect.getsource(Engine.wake_up)


def wake_up_table(wake_up: Any) -> dict[str, str]:
    table = {}
    for case, tags in (("tags=None", None), ("tags=['weights']", ["weights"]),
                       ("tags=[]", [])):
        engine = Engine()
        returned = wake_up(engine, tags)
        table[case] = f"returned {returned!r}, calls {engine.calls}"
    return table


def _patched_wake_up(self: Engine, tags: list[str] | None = None) -> bool:
    if tags is None or tags:
        self.calls.append(f"wake {tags}")
    if tags is None:  # resume only after a full wake-up (the fix)
        self.calls.append("resume")
    return True


def _overreaching_wake_up(self: Engine, tags: list[str] | None = None) -> None:
    _patched_wake_up(self, tags)  # the fix, and a return value lost on the way


def _apply(*, check: str = "meaning", mark: bool = True, reapply_in_entry: bool = True,
           replacement: Any = None, install_entry: bool = True) -> None:
    global _original_run_engine
    current = Engine.wake_up
    if mark and getattr(current, MARKER, False):
        return
    source = inspect.getsource(current)
    if check == "meaning" and fingerprints(source).meaning != KNOWN_MEANING:
        raise RuntimeError("unknown Engine.wake_up implementation")
    if check == "text" and "".join(source.split()) != KNOWN_TEXT:
        raise RuntimeError("unknown Engine.wake_up implementation (text)")
    if check == "exact" and source != KNOWN_SOURCE:
        raise RuntimeError("unknown Engine.wake_up implementation (exact source)")

    def wake_up(self: Engine, tags: list[str] | None = None) -> Any:
        return (replacement or _patched_wake_up)(self, tags)

    if mark:
        setattr(wake_up, MARKER, True)
    Engine.wake_up = wake_up  # type: ignore[method-assign]
    if not install_entry:
        return
    entry = _entry if reapply_in_entry else _entry_without_reapply
    if Engine.run_engine is not entry:
        _original_run_engine = Engine.run_engine
        Engine.run_engine = staticmethod(entry)  # type: ignore[method-assign]


def _entry(*args: Any, **kwargs: Any) -> Any:
    apply_careful()
    return _original_run_engine(*args, **kwargs)


def _entry_without_reapply(*args: Any, **kwargs: Any) -> Any:
    return _original_run_engine(*args, **kwargs)


def apply_careful() -> None:
    _apply()


def apply_without_marker() -> None:
    _apply(mark=False)


def apply_without_marker_or_fingerprint() -> None:
    _apply(mark=False, check="none")


def apply_without_reapply_in_entry() -> None:
    _apply(reapply_in_entry=False)


def apply_without_fingerprint() -> None:
    _apply(check="none")


def apply_with_text_fingerprint() -> None:
    _apply(check="text")


def apply_overreaching() -> None:
    _apply(replacement=_overreaching_wake_up)


def apply_with_exact_source() -> None:
    """Compares the target's source exactly: a reformatted upstream fails start-up."""
    _apply(check="exact")


def apply_wrapping_its_entry_again() -> None:
    """Its wake-up is marked and left alone on a second apply, but every apply wraps the
    spawn entry once more: an engine started after two applies re-applies twice."""
    global _original_run_engine
    if _original_run_engine is None:
        _original_run_engine = Engine.run_engine
    inner = Engine.run_engine

    def entry(*args: Any, **kwargs: Any) -> Any:
        apply_careful()
        return inner(*args, **kwargs)

    Engine.run_engine = staticmethod(entry)  # type: ignore[method-assign]
    _apply(install_entry=False)


#: the cases where the fix is meant to change behaviour: a wake-up that is not full
INTENT = frozenset({"tags=['weights']", "tags=[]"})


def declared(apply: str) -> DeclaredPatch:
    return DeclaredPatch(
        name=f"toy-{apply}", apply=f"tests.patch_toy:{apply}",
        targets=("tests.patch_toy:Engine.wake_up",), marker=MARKER,
        spawn_entry="tests.patch_toy:Engine.run_engine",
        behaviours=(Behaviour("tests.patch_toy:Engine.wake_up", "tests.patch_toy:wake_up_table",
                              INTENT),))
