"""This machine's network, as the checks that start servers and ranks need it."""

from __future__ import annotations

import socket


def free_port(host: str = "") -> int:
    """A TCP port free on ``host`` (all interfaces by default) now; the caller binds it
    next (a rendezvous, a server), so another process could still take it first."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])
