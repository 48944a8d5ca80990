"""The isolation server's messages, as typed classes: one JSON line each, tagged by ``kind``.

A request goes from the parent (``ForkServerLauncher``) to the server over its socket, and a
``Fork`` from the server to its spare child over a pipe; answers come back on the same
connection, the handshake on the server's stdout. ``decode`` names the message kinds it
accepts at that point of the conversation, so a message out of place is an error that says
so, never a dict read by the keys it happens to have."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any, ClassVar


class ProtocolError(ValueError):
    """A line that is not the message expected here (a bug, or a version mismatch between
    the parent and a server started from another checkout)."""


@dataclass(frozen=True)
class Message:
    kind: ClassVar[str] = ""


# --- requests ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Fork(Message):
    """Fork a child from the server (which holds the preload) and run the work folder's
    callable in it."""

    kind: ClassVar[str] = "fork"
    workdir: str
    env: dict[str, str]
    cwd: str


@dataclass(frozen=True)
class Exec(Message):
    """Start ``argv`` as a fresh interpreter (spawn isolation under the supervisor)."""

    kind: ClassVar[str] = "exec"
    workdir: str
    env: dict[str, str]
    cwd: str
    argv: list[str]


@dataclass(frozen=True)
class WarmUp(Message):
    """Run ``hook`` (``"module:function"``) with ``argument`` before the next child: import
    more (the collected test modules) into what every child is forked from."""

    kind: ClassVar[str] = "warm_up"
    hook: str
    argument: str


@dataclass(frozen=True)
class Branch(Message):
    """Fork a new server from this one: it takes ``env`` as its whole environment, imports
    ``preload`` on top of what this server holds, and serves on ``sock_path`` (a keyed
    server, ``harness.isolation.keyed``, that pays for its own imports only). Its handshake
    comes back on this connection, which it keeps: its end ends the branch."""

    kind: ClassVar[str] = "branch"
    env: dict[str, str]
    preload: list[str]
    sock_path: str


# --- answers ----------------------------------------------------------------------------

@dataclass(frozen=True)
class Ready(Message):
    """The handshake: the server serves; ``warmup`` is what its warm-up hook returned."""

    kind: ClassVar[str] = "ready"
    pid: int
    warmup: Any = None


@dataclass(frozen=True)
class Unavailable(Message):
    """The handshake of a server that will not serve: why, and, when its warm-up made
    forking unsafe, that reason apart (a server without the warm-up may still serve)."""

    kind: ClassVar[str] = "unavailable"
    error: str
    refused: str | None = None


@dataclass(frozen=True)
class Warmed(Message):
    kind: ClassVar[str] = "warmed"
    warmup: Any = None


@dataclass(frozen=True)
class Refused(Message):
    """The warm-up failed or made forking unsafe: the server serves no more."""

    kind: ClassVar[str] = "refused"
    reason: str


@dataclass(frozen=True)
class Started(Message):
    kind: ClassVar[str] = "started"
    pid: int


@dataclass(frozen=True)
class NotStarted(Message):
    kind: ClassVar[str] = "not_started"
    error: str


@dataclass(frozen=True)
class Ended(Message):
    """The child's exit status, as ``os.waitstatus_to_exitcode`` gives it."""

    kind: ClassVar[str] = "ended"
    status: int


KINDS: dict[str, type[Message]] = {cls.kind: cls for cls in (
    Fork, Exec, WarmUp, Branch, Ready, Unavailable, Warmed, Refused, Started, NotStarted, Ended)}
REQUESTS = (Fork, Exec, WarmUp, Branch)
HANDSHAKE = (Ready, Unavailable)


def encode(message: Message) -> bytes:
    return json.dumps({"kind": message.kind, **asdict(message)}).encode() + b"\n"


def decode(line: bytes | str, expected: tuple[type[Message], ...]) -> Any:
    """The message on ``line``, which must be one of ``expected``."""
    try:
        raw = json.loads(line)
        cls = KINDS[raw.pop("kind")]
        message = cls(**raw)
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ProtocolError(f"not an isolation-server message ({type(exc).__name__}: {exc}): "
                            f"{str(line)[:200]!r}") from None
    if not isinstance(message, expected):
        raise ProtocolError(f"expected {' or '.join(c.kind for c in expected)}, got "
                            f"{message.kind}: {str(line)[:200]!r}")
    return message


