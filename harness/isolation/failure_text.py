"""A failure's statement: the lines a failure states, read from its exception or from a
report's text, the isolated child's traceback note left out. In the isolation core, which
adds that note, so that the pytest face (the ledger's matching), the results file and the
bisect (a failure's signature) read one statement the same way."""

from __future__ import annotations

from typing import Any

#: the note the isolation core adds to a child's exception (its traceback): no failure line
CHILD_TRACEBACK_NOTE = "--- traceback in isolated child"


def child_traceback_note(pid: int | None, traceback: str) -> str:
    """The note carrying an isolated child's traceback to the parent's exception."""
    return f"{CHILD_TRACEBACK_NOTE} (pid {pid}) ---\n{traceback}"


def failure_lines(longrepr: Any, excinfo: Any = None) -> list[str]:
    """The lines a failure states: the exception's message (pytest's rewritten-assert
    explanation, ``assert ...``, left out) and its notes (the child's traceback note left
    out); where the message is a list of problems (``- `` bullets, as the checks write
    them) the bullets stand for it, the header and context lines around them being no
    problem of their own. Read from the exception where the hook has it, else from the
    report's text."""
    exc = getattr(excinfo, "value", None)
    notes: list[str] = []
    if isinstance(exc, BaseException):
        message = str(exc)
        lines = f"{type(exc).__name__}: {message}".splitlines() if message \
            else [type(exc).__name__]
        for note in getattr(exc, "__notes__", None) or []:
            if isinstance(note, str) and not note.startswith(CHILD_TRACEBACK_NOTE):
                notes.extend(line.strip() for line in note.splitlines() if line.strip())
    else:
        crash = getattr(longrepr, "reprcrash", None)
        if crash is not None and getattr(crash, "message", None):
            lines = str(crash.message).splitlines()
        else:  # a plain-text longrepr: pytest's "E   " lines
            text = str(longrepr or "")
            lines = [line[1:] for line in text.splitlines() if line.startswith("E ")] \
                or text.splitlines()[-1:]
        cut = next((i for i, line in enumerate(lines)
                    if line.strip().startswith(CHILD_TRACEBACK_NOTE)), len(lines))
        lines = lines[:cut]
    kept: list[str] = []
    for line in (line.strip() for line in lines):
        if line.startswith("assert ") or line == "assert":
            break  # pytest's explanation runs to the end of the message
        if line:
            kept.append(line)
    bullets = [line[2:].strip() for line in kept if line.startswith("- ")]
    if kept and ": - " in kept[0]:  # "AssertionError: - first problem" (no header line)
        bullets.insert(0, kept[0].split(": - ", 1)[1].strip())
    return (bullets or kept) + notes
