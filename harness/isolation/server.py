"""The isolation server: every isolated child is started by one, which ends what it left.

Two kinds, one loop (``serve``). The forkserver imported torch once and forks each child at
fork cost. The spawn supervisor imports nothing heavy and starts each child as a fresh
interpreter (fork + exec): spawn's isolation, with the same containment. Either server is
the child subreaper of everything below it, so orphans of a returned, raised or crashed
child (a ``setsid``'d or double-forked grandchild) are re-parented to it and ended before
the parent hears the child's status; and it reads a pipe from the process that started it,
whose end (pytest SIGKILLed, an xdist worker gone) makes it end every descendant and exit:
nothing depends on a signal pytest must still be alive to send.

The forkserver is a fresh interpreter (spawned, so the pytest process's state never leaks into
it) that imports the preload list and then verifies that no accelerator was initialised
(a fork after CUDA or NPU init breaks the child). Each request forks one child, which
becomes a session leader, takes the request's environment, cwd and output files, and runs
exactly the same ``harness.isolation.child.main`` as a spawned child. The server reports the child's
pid, then its exit status, over the request's connection; it is single-threaded (SIGCHLD
wakes its select loop), so no other thread's locks are ever inherited by a child.

Limits: environment variables that a preloaded module reads at import time (for example
``OMP_NUM_THREADS`` for torch, ``TORCH_DEVICE_BACKEND_AUTOLOAD``) were read by the server;
a child's ``env`` can no longer change them. Use spawn for such checks, or a keyed server
(``harness.isolation.keyed``), started in the child's own environment.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import select
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from harness.isolation import messages, workdirs
from harness.isolation.messages import (
    Branch,
    Ended,
    Exec,
    Fork,
    NotStarted,
    Ready,
    Refused,
    Started,
    Unavailable,
    Warmed,
    WarmUp,
)

DEFAULT_PRELOAD = ("torch", "pytest", "harness")
#: a preload entry ending in this is optional: skipped where its package is not installed
OPTIONAL = "?"
START_TIMEOUT_S = 180.0

#: the folder holding the harness package, put on a fresh child's path before it imports us
PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])


class ForkServerUnavailable(RuntimeError):
    """The forkserver could not start or refused to serve; the message says why."""


class ServerGone(OSError):
    """A request met a dead isolation server (killed between two checks): the caller
    replaces the server and starts the child on the new one."""


#: longest socket path that fits in sockaddr_un (108 bytes with its NUL), with room to spare
SOCKET_PATH_MAX = 100


@contextlib.contextmanager
def reachable(sock_path: str) -> Any:
    """``sock_path``, or, where it is too long for a Unix socket (a deep TMPDIR: xdist and
    pytester folders, CI work trees), the same file through a descriptor of its folder
    (``/proc/self/fd/N/sock``): the socket stays in its private 0700 folder."""
    if len(os.fsencode(sock_path)) <= SOCKET_PATH_MAX:
        yield sock_path
        return
    folder = os.open(os.path.dirname(sock_path), os.O_PATH | os.O_DIRECTORY)
    try:
        yield f"/proc/self/fd/{folder}/{os.path.basename(sock_path)}"
    finally:
        os.close(folder)


# --- server side ------------------------------------------------------------------------

def accelerator_state() -> str | None:
    """Why forking from here would be unsafe (an initialised CUDA or NPU), or None."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    with contextlib.suppress(Exception):
        if torch.cuda.is_initialized():
            return "CUDA is initialised in the forkserver"
    npu = getattr(torch, "npu", None)
    with contextlib.suppress(Exception):
        if npu is not None and npu.is_initialized():
            return "the NPU is initialised in the forkserver"
    return _forks_poisoned(torch)


def _forks_poisoned(torch: Any) -> str | None:
    """Whether a fork of this process would be in torch's "bad fork" state. CUDA need not be
    initialised for that: asking for the device count (``torch.cuda.is_available()``, as
    a test module's ``skipif`` does at import) already registers torch's fork poison, and
    every forked child then fails with "Cannot re-initialize CUDA in forked subprocess"
    (seen on an H200: 44 cases of one run). One fork that only asks tells for sure."""
    cuda = getattr(torch, "cuda", None)
    in_bad_fork = getattr(cuda, "_is_in_bad_fork", None)
    if getattr(getattr(torch, "version", None), "cuda", None) is None or not callable(
            in_bad_fork):
        return None  # a build without CUDA has no fork poison
    pid = os.fork()
    if pid == 0:  # the probe: exit status 1 when poisoned
        os._exit(1 if in_bad_fork() else 0)
    _, status = os.waitpid(pid, 0)
    if os.WIFEXITED(status) and os.WEXITSTATUS(status) == 1:
        return ("CUDA was queried in the forkserver (a device count or is_available(): "
                "torch poisons forks from then on)")
    return None


def _child_after_fork(req: Fork) -> None:
    """In the forked child (``_spare``, detached from the server): take the request's
    session, cwd, environment and output files, then run harness.isolation.child.main."""
    try:
        os.setsid()
        os.chdir(req.cwd)
        os.environ.clear()
        os.environ.update(req.env)
        workdir = Path(req.workdir)
        null = os.open(os.devnull, os.O_RDONLY)
        out = os.open(workdir / "stdout", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        err = os.open(workdir / "stderr", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        for src, dst in ((null, 0), (out, 1), (err, 2)):
            os.dup2(src, dst)
            os.close(src)
        from harness.isolation.child import main

        main(req.workdir)  # ends with os._exit(0)
    except OSError as exc:  # its output files cannot be made: a full or read-only disk
        from harness.isolation.child import exit_for_disk_error

        exit_for_disk_error(exc)
    except SystemExit as exc:  # sys.exit() in fn: exit with its code, as a spawned child would
        code = exc.code
        if code is not None and not isinstance(code, int):
            print(code, file=sys.stderr)
            code = 1
        _flush_and_exit(code or 0)
    finally:
        _flush_and_exit(70)  # never fall back into the server loop


def _spare(read_fd: int, closing: list[Any]) -> None:
    """A child forked ahead of its request (the fork of a server that holds torch takes
    milliseconds; done while the last child runs, it is off the next test's path): wait for
    the request on ``read_fd``, then become that child. End of file with no request: the
    server is gone or discarded us."""
    try:
        _leave_server(closing)
        from harness.isolation.child import die_with_parent

        die_with_parent()
        data = b""
        while chunk := os.read(read_fd, 65536):
            data += chunk
        os.close(read_fd)
        req = messages.decode(data, (Fork,)) if data else None
    except BaseException:  # noqa: BLE001 - never fall back into the server loop
        _flush_and_exit(70)
    if req is None:
        _flush_and_exit(0)
    _child_after_fork(req)


def _leave_server(closing: list[Any]) -> None:
    """In a process just forked from the server's loop: its signal wiring undone, and the
    server's descriptors (``_Server.descriptors``) closed."""
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    for obj in closing:
        with contextlib.suppress(OSError):
            obj.close() if hasattr(obj, "close") else os.close(obj)


def _flush_and_exit(code: int) -> None:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


class UnsafeWarmUp(Exception):
    """Raised by a warm-up hook when what it loaded makes forking from this server unsafe
    (an accelerator initialised, a thread started): the server refuses to serve, and the
    parent starts one without the warm-up (``ForkServerLauncher.refused``)."""


def serve(sock_path: str, preload: list[str], warmup: tuple[str, str] | None = None) -> None:
    """Entry point of the server process; prints one handshake line (``Ready`` or
    ``Unavailable``) on stdout, then serves until the process that started it is gone.

    ``warmup`` (``"module:function"``, argument): called after the preload, to import more
    (a pytest session's collected test modules); what it returns is in the handshake."""
    from harness.isolation.child import become_subreaper

    # No PR_SET_PDEATHSIG here: it would kill us before we end our descendants (and it
    # fires when the *thread* that started us exits). Our parent's death reaches us as EOF
    # on stdin instead.
    become_subreaper()
    failed = _import_preload(preload)
    if failed:
        _say(Unavailable(failed))
        return
    warmed: Any = None
    if warmup is not None:
        answer = _warm(WarmUp(*warmup))
        if isinstance(answer, Refused):
            _say(Unavailable(answer.reason, refused=answer.reason))
            return
        warmed = answer.warmup
    _serve_if_safe(sock_path, warmed, _say)


def _import_preload(preload: list[str]) -> str | None:
    """Import ``preload``; why it failed, or None."""
    import importlib
    import importlib.util

    from harness.isolation.child import collector_paused

    try:
        with collector_paused():
            for entry in preload:
                # torch is in the default warm-up, but a machine may have none (the plugin's
                # own tests on Python 3.10/3.12 here): left out when it is not installed, a
                # child that needs it then fails as under spawn; so is a module named with a
                # trailing "?" (``transformers?``: optional, where the stack has it); any other
                # module asked for, and one that is installed but fails to import, are reported
                name = entry.removesuffix(OPTIONAL)
                if (entry.endswith(OPTIONAL) or name.partition(".")[0] == "torch") \
                        and importlib.util.find_spec(name.partition(".")[0]) is None:
                    continue
                importlib.import_module(name)
    except BaseException as exc:  # noqa: BLE001 - reported to the parent, which decides
        return f"preloading {name!r} failed: {type(exc).__name__}: {exc}"
    return None


def _serve_if_safe(sock_path: str, warmed: Any, say: Callable[[messages.Message], None],
                   lifeline: int = 0) -> None:
    """Serve (``_Server``) unless what was loaded makes forking from here unsafe; the
    handshake says which."""
    bad = accelerator_state()
    if bad:
        say(Unavailable(bad + "; forked children would break"))
        return
    _freeze()
    _Server(sock_path, warmed, lifeline, say).run()


def _say(message: messages.Message) -> None:
    """The handshake, on stdout."""
    sys.stdout.write(messages.encode(message).decode())
    sys.stdout.flush()


class _Server:
    """The server's loop and its state: one method per request kind (``on_<kind>``, as
    xdist's controller has one per worker event), called by ``dispatch``.

    ``lifeline``: the descriptor whose end means that whoever started us is gone (stdin, a
    pipe from the parent process; a branch's request connection); ``say`` sends the
    handshake (stdout; a branch's connection)."""

    def __init__(self, sock_path: str, warmed: Any, lifeline: int = 0,
                 say: Callable[[messages.Message], None] | None = None) -> None:
        self.lifeline = lifeline
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        with reachable(sock_path) as short:
            self.listener.bind(short)
        self.listener.listen(64)
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_r, False)
        os.set_blocking(self.wake_w, False)
        signal.set_wakeup_fd(self.wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        #: child pid -> the connection waiting for its status
        self.waiting: dict[int, socket.socket] = {}
        self.execs: dict[int, subprocess.Popen[bytes]] = {}
        #: (pid, write end of its request pipe): at most one child forked ahead
        self.spare: list[tuple[int, int]] = []
        #: servers forked from this one (``on_branch``): they and their children are theirs
        self.branches: set[int] = set()
        (say or _say)(Ready(pid=os.getpid(), warmup=warmed))

    def run(self) -> None:
        from harness.isolation.child import end_descendants

        while True:
            try:
                ready, _, _ = select.select([self.listener, self.wake_r, self.lifeline],
                                            [], [])
            except InterruptedError:
                continue
            if self.lifeline in ready and not _read_or_eof(self.lifeline):
                # whoever started us is gone (SIGKILLed pytest, a dead xdist worker): nothing
                # of the session may outlive it
                end_descendants()
                os._exit(0)
            if self.wake_r in ready:
                with contextlib.suppress(BlockingIOError):
                    while os.read(self.wake_r, 512):
                        pass
            self.reap()
            if self.listener in ready:
                self.accept()

    def reap(self) -> None:
        """Our forked children, and orphans we adopted as their subreaper; each ended
        child's status goes to the connection that asked for it."""
        from harness.isolation.child import end_descendants

        ended: list[tuple[socket.socket, int]] = []
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            self.branches.discard(pid)
            spawned = self.execs.pop(pid, None)
            if spawned is not None:
                spawned.returncode = os.waitstatus_to_exitcode(status)  # reaped: never again
            conn = self.waiting.pop(pid, None)
            if conn is not None:
                ended.append((conn, os.waitstatus_to_exitcode(status)))
        if ended and not self.waiting:
            # no child in flight: every process still ours but the spare is an orphan a
            # child left behind (a setsid'd or double-forked grandchild); end it before
            # anyone hears the child ended
            end_descendants(keep=frozenset([*(pid for pid, _ in self.spare),
                                            *self.branches]))
        for conn, code in ended:
            _answer(conn, Ended(code))
            conn.close()

    def accept(self) -> None:
        conn, _ = self.listener.accept()
        try:
            request = messages.decode(_readline(conn).split(b"\n", 1)[0], messages.REQUESTS)
        except (OSError, ValueError) as exc:
            _answer(conn, NotStarted(f"{type(exc).__name__}: {exc}"))
            conn.close()
            return
        self.dispatch(conn, request)

    def dispatch(self, conn: socket.socket, request: messages.Message) -> None:
        getattr(self, f"on_{request.kind}")(conn, request)

    def on_warm_up(self, conn: socket.socket, request: WarmUp) -> None:
        """More to import before the first child (after collection)."""
        from harness.isolation.child import end_descendants

        answer = _warm(request)
        while self.spare:  # forked before the warm-up: it would not hold what it loaded
            os.close(self.spare.pop()[1])
        bad = accelerator_state()
        if bad and not isinstance(answer, Refused):
            answer = Refused(bad.replace(" in the forkserver", ""))
        _answer(conn, answer)
        conn.close()
        if isinstance(answer, Refused):  # forking from here is unsafe now: serve no more
            end_descendants()
            os._exit(0)
        _freeze()

    def on_fork(self, conn: socket.socket, request: Fork) -> None:
        try:
            pid = self.hand_to_spare(request)
        except OSError as exc:
            _answer(conn, NotStarted(f"{type(exc).__name__}: {exc}"))
            conn.close()
            return
        self.started(conn, pid)
        self.fork_spare()  # for the next request, while this child runs

    def on_exec(self, conn: socket.socket, request: Exec) -> None:
        """The spawn supervisor: a fresh interpreter."""
        try:
            proc = _exec_child(Path(request.workdir), request.argv, request.env, request.cwd)
        except OSError as exc:
            _answer(conn, NotStarted(f"{type(exc).__name__}: {exc}"))
            conn.close()
            return
        self.execs[proc.pid] = proc
        self.started(conn, proc.pid)

    def on_branch(self, conn: socket.socket, request: Branch) -> None:
        """A keyed server forked from this one (``_branch``); its handshake goes over
        ``conn``, which it keeps as its lifeline."""
        try:
            pid = os.fork()
        except OSError as exc:
            _answer(conn, Unavailable(f"the branch could not be forked: {exc}"))
            conn.close()
            return
        if pid == 0:
            _branch(conn, request, self.descriptors())
        self.branches.add(pid)
        conn.close()  # the branch holds its own end

    def descriptors(self) -> list[Any]:
        """What a process forked from the loop must close: the server's own."""
        return [self.listener, self.wake_r, self.wake_w, *self.waiting.values(),
                *(fd for _, fd in self.spare)]

    def started(self, conn: socket.socket, pid: int) -> None:
        self.waiting[pid] = conn
        _answer(conn, Started(pid))

    def fork_spare(self) -> None:
        read_fd, write_fd = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(write_fd)
            _spare(read_fd, self.descriptors())
        os.close(read_fd)
        self.spare.append((pid, write_fd))

    def hand_to_spare(self, request: Fork) -> int:
        for _ in range(2):  # a spare that died meanwhile (a stray kill): fork another
            if not self.spare:
                self.fork_spare()
            pid, write_fd = self.spare.pop()
            try:
                os.write(write_fd, messages.encode(request))  # blocks until it is all read
                return pid
            except OSError:
                continue
            finally:
                os.close(write_fd)
        raise OSError("could not hand the request to a forked child")


def _branch(conn: socket.socket, request: Branch, closing: list[Any]) -> None:
    """In the forked branch: drop the parent server's descriptors, take the request's whole
    environment, import its preload, check that forking is still safe, then serve on its
    own socket until ``conn`` ends. Never returns into the parent's loop."""
    try:
        _leave_server(closing)
        from harness.isolation.child import become_subreaper

        become_subreaper()  # not inherited across fork
        # stdout is the parent server's handshake pipe, which nobody reads any more: what
        # the imports print must not fill it (and block us)
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, 1)
        os.close(null)
        os.environ.clear()
        os.environ.update(request.env)
        say = lambda message: _answer(conn, message)  # noqa: E731
        failed = _import_preload(request.preload)
        if failed:
            say(Unavailable(failed))
        else:
            _serve_if_safe(request.sock_path, None, say, lifeline=conn.fileno())
    except BaseException:  # noqa: BLE001 - never fall back into the parent server's loop
        _flush_and_exit(70)
    _flush_and_exit(0)


def _answer(conn: socket.socket, message: messages.Message) -> None:
    with contextlib.suppress(OSError):
        conn.sendall(messages.encode(message))


def _warm(request: WarmUp) -> Warmed | Refused:
    """Run a warm-up hook (``"module:function"``, argument): what it returned, or why
    forking from here is no longer safe."""
    import importlib

    module, _, function = request.hook.partition(":")
    try:
        return Warmed(getattr(importlib.import_module(module), function)(request.argument))
    except UnsafeWarmUp as exc:
        return Refused(str(exc))
    except BaseException as exc:  # noqa: BLE001 - reported to the parent, which decides
        return Refused(f"the warm-up {request.hook} failed: {type(exc).__name__}: {exc}")


def _freeze() -> None:
    """What is loaded now is shared with every child: out of the collector's sight, a
    child's collections do not touch (and so copy) every page of it."""
    import gc

    gc.collect()
    gc.freeze()


def _read_or_eof(fd: int) -> bool:
    """Drain what is readable on ``fd``; False at end of file (or a broken pipe)."""
    try:
        return bool(os.read(fd, 4096))
    except BlockingIOError:
        return True
    except OSError:
        return False


def _exec_child(workdir: Path, argv: list[str], env: dict[str, str], cwd: str
                ) -> subprocess.Popen[bytes]:
    """Start ``argv`` as a session leader with ``env``, ``cwd`` and the work folder's output
    files (spawn isolation: from the supervisor, or directly without one)."""
    with open(workdir / "stdout", "wb") as out, open(workdir / "stderr", "wb") as err:
        return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                                env=env, cwd=cwd, start_new_session=True, close_fds=True)


def _readline(conn: socket.socket) -> bytes:
    """Bytes up to and including at least one newline (possibly more after it)."""
    buf = b""
    while b"\n" not in buf:
        chunk = conn.recv(65536)
        if not chunk:
            raise OSError("connection closed mid-message")
        buf += chunk
    return buf


# --- parent side ------------------------------------------------------------------------

class _ForkedHandle:
    def __init__(self, conn: socket.socket, pid: int, rest: bytes = b"",
                 server: ForkServerLauncher | None = None) -> None:
        self.conn = conn
        self.pid = pid
        self._rc: int | None = None
        # a child that ends at once: its status can arrive in the same read as its pid
        self._buf = rest
        self.server = server
        #: how the server died while this child ran ("pid 123, killed by SIGKILL"), or None
        self.server_died: str | None = None

    def wait(self, timeout: float | None) -> int | None:
        if self._rc is not None:
            return self._rc
        self.conn.settimeout(timeout)
        try:
            while b"\n" not in self._buf:
                chunk = self.conn.recv(4096)
                if not chunk:  # the server died: its children die with it (or are ended)
                    self._rc = -signal.SIGKILL
                    if self.server is not None:
                        self.server_died = self.server.ended(wait=2.0)
                    return self._rc
                self._buf += chunk
        except (TimeoutError, BlockingIOError):
            return None
        self._rc = messages.decode(self._buf.split(b"\n", 1)[0], (Ended,)).status
        self.conn.close()
        return self._rc


def _server_environ(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` for a server: with this package and this interpreter's path importable."""
    return dict(env, PYTHONPATH=os.pathsep.join(
        p for p in [PACKAGE_ROOT, *sys.path] if isinstance(p, str) and p))


class ForkServerLauncher:
    name = "forkserver"

    def __init__(self, preload: tuple[str, ...] = DEFAULT_PRELOAD,
                 warmup: tuple[str, str] | None = None,
                 env: dict[str, str] | None = None) -> None:
        """``env``: the server's environment (default this process's): a keyed server
        (``harness.isolation.keyed``) imports its preload in its children's environment."""
        self._start_state(preload)
        code = (
            f"import sys; sys.path.insert(0, {PACKAGE_ROOT!r}); "
            "from harness.isolation.server import serve; "
            f"serve({self.sock_path!r}, {list(self.preload)!r}"
            + (f", {warmup!r})" if warmup else ")")
        )
        self.proc = subprocess.Popen(
            # stdin: a pipe we never write; its end tells the server we are gone
            [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            env=_server_environ(os.environ if env is None else env), start_new_session=True,
        )
        atexit.register(self.close)

    def _start_state(self, preload: tuple[str, ...]) -> None:
        """What a launcher knows before its server's handshake."""
        self.preload = tuple(preload)
        self._dir = str(workdirs.make("fs"))
        self.sock_path = os.path.join(self._dir, "sock")
        self._error: str | None = None
        self._ready = False
        #: what the warm-up hook returned (handshake), or why the server refused to serve
        #: after it (then no other server of this kind would serve either)
        self.warmed: Any = None
        self.refused: str | None = None
        #: how the server this one replaced ended, until a child's result has said so
        self.replaced: str | None = None

    def ensure_ready(self) -> None:
        """Wait for the server's handshake (it boots while we do other work); raise
        ``ForkServerUnavailable`` with its reason if it cannot serve."""
        if not self._ready and self._error is None:
            hello = self._handshake()
            if isinstance(hello, Unavailable):
                self._error = hello.error
                self.refused = hello.refused
                self.close()
            else:
                self._ready = True
                self.warmed = hello.warmup
        if self._error is not None:
            raise ForkServerUnavailable(self._error)
        if not self.alive():
            raise ForkServerUnavailable(f"the forkserver died (exit code {self.proc.returncode})")

    def _handshake(self) -> Ready | Unavailable:
        assert self.proc.stdout is not None
        timer = threading.Timer(START_TIMEOUT_S, self.proc.kill)
        timer.start()
        try:
            raw = self.proc.stdout.readline()
        finally:
            timer.cancel()
        if not raw:
            rc = self.proc.wait()
            return Unavailable(f"the forkserver exited (code {rc}) before it was ready")
        try:
            return messages.decode(raw, messages.HANDSHAKE)
        except messages.ProtocolError as exc:
            self.proc.kill()
            return Unavailable(f"the forkserver's handshake was not one: {exc}")

    def warm(self, warmup: tuple[str, str]) -> None:
        """Ask the running server to run a warm-up hook (``serve``'s ``warmup``) before its
        next child: what it returned lands in ``warmed``; a refusal ends the server, and
        ``refused`` says why (``ensure_ready`` then raises ``ForkServerUnavailable``)."""
        self.ensure_ready()
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            with reachable(self.sock_path) as short:
                conn.connect(short)
            conn.sendall(messages.encode(WarmUp(*warmup)))
            answer = messages.decode(_readline(conn).split(b"\n", 1)[0], (Warmed, Refused))
        except (OSError, ValueError) as exc:
            answer = Refused(f"the warm-up request failed: {type(exc).__name__}: {exc}")
        finally:
            conn.close()
        if isinstance(answer, Refused):
            self.refused = self._error = answer.reason
            self.close()
        else:
            self.warmed = answer.warmup

    def alive(self) -> bool:
        return self.proc.poll() is None

    def ended(self, wait: float = 0.0) -> str:
        """How the server process ended, for messages: ``pid 123, killed by SIGKILL``."""
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(wait)
        rc = self.proc.returncode
        if rc is None:
            return f"pid {self.proc.pid}, still running but not answering"
        if rc < 0:
            with contextlib.suppress(ValueError):
                return f"pid {self.proc.pid}, killed by {signal.Signals(-rc).name}"
        return f"pid {self.proc.pid}, exit code {rc}"

    def start(self, workdir: Path, env: dict[str, str], cwd: str,
              argv: list[str] | None = None) -> _ForkedHandle:
        """A child forked from the server, or ``argv`` started by it (spawn)."""
        self.ensure_ready()
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        request = Fork(str(workdir), env, cwd) if argv is None else \
            Exec(str(workdir), env, cwd, argv)
        try:
            with reachable(self.sock_path) as short:
                conn.connect(short)
            conn.sendall(messages.encode(request))
            line, rest = _readline(conn).split(b"\n", 1)
        except OSError as exc:
            conn.close()
            # a server killed a moment ago may not be reaped yet: give it a little time
            ended = self.ended(wait=2.0)
            if self.alive():
                raise
            raise ServerGone(f"{ended}") from exc
        answer = messages.decode(line, (Started, NotStarted))
        if isinstance(answer, NotStarted):
            conn.close()
            raise OSError(f"the isolation server could not start the child: {answer.error}")
        return _ForkedHandle(conn, answer.pid, rest, self)

    def close(self) -> None:
        if self.proc.poll() is None:
            # EOF first: the server ends its descendants (what a child left) and exits
            with contextlib.suppress(OSError):
                self.proc.stdin.close()  # type: ignore[union-attr]
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(2.0)
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        with contextlib.suppress(OSError):
            os.unlink(self.sock_path)
            os.rmdir(self._dir)


class _BranchProcess:
    """The little of ``subprocess.Popen`` a launcher uses, for a branch: a process that is
    not our child (the session's server forked it), watched through psutil."""

    def __init__(self, pid: int, lifeline: socket.socket) -> None:
        self.pid = pid
        self.stdin = lifeline  # closing it ends the branch, as stdin's end ends a server
        self.returncode: int | None = None

    def poll(self) -> int | None:
        import psutil

        if self.returncode is None and self.pid > 0:  # pid: known from the handshake
            try:
                if psutil.Process(self.pid).status() == psutil.STATUS_ZOMBIE:
                    self.returncode = 0
            except psutil.NoSuchProcess:
                self.returncode = 0
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        import time

        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(f"branch {self.pid}", timeout or 0)
            time.sleep(0.02)
        return self.returncode  # type: ignore[return-value]

    def kill(self) -> None:
        import psutil

        from harness.isolation import reaper

        with contextlib.suppress(psutil.Error):
            reaper.kill_now([psutil.Process(self.pid)])


class BranchedServer(ForkServerLauncher):
    """A keyed server forked from a running forkserver (``parent``): what that one imported
    (the session's preload, torch's compiler...) is there at no cost, and the branch imports
    only ``preload``, in ``env``, its children's whole environment."""

    def __init__(self, parent: ForkServerLauncher, preload: tuple[str, ...],
                 env: dict[str, str]) -> None:
        parent.ensure_ready()
        own = [m for m in preload if m not in parent.preload]
        self._start_state((*parent.preload, *own))
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            with reachable(parent.sock_path) as short:
                conn.connect(short)
            conn.sendall(messages.encode(Branch(_server_environ(env), own, self.sock_path)))
        except OSError as exc:
            conn.close()
            raise ForkServerUnavailable(f"the forkserver could not branch: {exc}") from exc
        self._conn = conn
        self.proc = _BranchProcess(-1, conn)  # type: ignore[assignment]
        atexit.register(self.close)

    def _handshake(self) -> Ready | Unavailable:
        timer = threading.Timer(START_TIMEOUT_S, lambda: self._conn.shutdown(socket.SHUT_RDWR))
        timer.start()
        try:
            raw = _readline(self._conn).split(b"\n", 1)[0]
            hello = messages.decode(raw, messages.HANDSHAKE)
        except (OSError, ValueError) as exc:
            return Unavailable(f"the branched forkserver did not answer: {exc}")
        finally:
            timer.cancel()
        if isinstance(hello, Ready):
            self.proc.pid = hello.pid
        return hello

    def ended(self, wait: float = 0.0) -> str:
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(wait)
        state = "ended" if self.proc.poll() is not None else "still running but not answering"
        return f"pid {self.proc.pid} (branched from the session's forkserver), {state}"

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._conn.close()  # its lifeline: it ends what it started and exits
        if self.proc.pid > 0:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(2.0)
            if self.proc.poll() is None:
                self.proc.kill()
        with contextlib.suppress(OSError):
            os.unlink(self.sock_path)
            os.rmdir(self._dir)


class ReplacingForkServer:
    """A forkserver launcher that outlives its server: when the server dies (an OOM kill, a
    stray ``kill -9``), the next child gets a new one, with one warning naming the dead
    server. If the replacement dies too, ``allow_spawn`` (``--isolation auto``) goes on with
    spawn and says so; otherwise every later start raises ``ForkServerUnavailable`` with
    the reason (explicit ``--isolation forkserver``)."""

    def __init__(self, factory: Callable[[], ForkServerLauncher], *, allow_spawn: bool,
                 warn: Callable[[str], None]) -> None:
        self._factory = factory
        self._allow_spawn = allow_spawn
        self._warn = warn
        self.server = factory()
        self._deaths: list[str] = []
        self._spawn: Any = None

    @property
    def name(self) -> str:
        return "spawn" if self._spawn is not None else "forkserver"

    def ensure_ready(self) -> None:
        self.server.ensure_ready()

    def start(self, workdir: Path, env: dict[str, str], cwd: str) -> Any:
        if self._spawn is not None:
            return self._spawn.start(workdir, env, cwd)
        note = None
        if self.server._ready and not self.server.alive():
            note = self._replace(self.server.ended())
            if self._spawn is not None:
                return noted(self._spawn.start(workdir, env, cwd), note)
        try:
            return noted(self.server.start(workdir, env, cwd), note)
        except ServerGone as exc:  # died between the check above and the request
            note = self._replace(str(exc))
            launcher = self._spawn or self.server
            return noted(launcher.start(workdir, env, cwd), note)

    def _replace(self, ended: str) -> str:
        """A new server for the dead one (or spawn, or the reason none can be had); the
        note the next child's result carries."""
        self._deaths.append(ended)
        self.server.close()
        if len(self._deaths) >= 2:
            why = (f"the forkserver died ({self._deaths[0]}), and its replacement too "
                   f"({self._deaths[-1]})")
            if not self._allow_spawn:
                raise ForkServerUnavailable(why)
            self._warn(f"{why}: isolating with spawn from now on")
            self._spawn = SpawnLauncher()
            return f"{why}: this check was started with spawn"
        self.server = self._factory()
        self.server.ensure_ready()
        note = (f"the forkserver died ({ended}) before this check; replaced by a new one "
                f"(pid {self.server.proc.pid})")
        self._warn(note.replace(" before this check; replaced by", "; started"))
        return note

    def close(self) -> None:
        self.server.close()


def noted(handle: Any, note: str | None) -> Any:
    """``handle`` carrying ``note`` (how its server was replaced) to the child's result."""
    if note:
        handle.notes = [*getattr(handle, "notes", ()), note]
    return handle


class _PopenHandle:
    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        self.proc = proc
        self.pid = proc.pid

    def wait(self, timeout: float | None) -> int | None:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None


def spawn_argv(workdir: Path) -> list[str]:
    """The command line of a spawned child for ``workdir``."""
    return [sys.executable, "-c", (f"import sys; sys.path.insert(0, {PACKAGE_ROOT!r}); "
                                   "from harness.isolation.child import main; "
                                   f"main({str(workdir)!r})")]


class SpawnLauncher:
    """A fresh interpreter per child: slowest, and the only choice once a device is live here.

    Started by this process's spawn supervisor (a light isolation server: no preload), which
    contains what the child leaves behind; directly, with a warning, if no supervisor can
    run here."""

    name = "spawn"
    _warned = False

    def start(self, workdir: Path, env: dict[str, str], cwd: str) -> Any:
        try:
            try:
                supervisor = get_forkserver_launcher(())
                handle = supervisor.start(workdir, env, cwd, spawn_argv(workdir))
            except ServerGone:  # killed since the last child: a new one serves
                supervisor = get_forkserver_launcher(())
                handle = supervisor.start(workdir, env, cwd, spawn_argv(workdir))
            if supervisor.replaced:
                note = (f"the spawn supervisor died ({supervisor.replaced}) before this "
                        f"check; replaced by a new one (pid {supervisor.proc.pid})")
                supervisor.replaced = None
                return noted(handle, note)
            return handle
        except ForkServerUnavailable as exc:
            if not SpawnLauncher._warned:
                SpawnLauncher._warned = True
                import warnings

                warnings.warn(f"npu-regress: the spawn supervisor is unavailable ({exc}): "
                              "children start directly, and what a crashed child or a "
                              "SIGKILLed pytest leaves behind may survive", RuntimeWarning,
                              stacklevel=2)
        return _PopenHandle(_exec_child(workdir, spawn_argv(workdir), env, cwd))


_servers: dict[tuple[tuple[str, ...], int], ForkServerLauncher] = {}
_servers_lock = threading.Lock()


def get_forkserver_launcher(preload: tuple[str, ...] = DEFAULT_PRELOAD) -> ForkServerLauncher:
    """This process's forkserver for ``preload``, started on first use (and restarted if it
    died). Raises ``ForkServerUnavailable`` with the reason when it cannot serve."""
    key = (tuple(preload), os.getpid())
    with _servers_lock:
        server = _servers.get(key)
        if server is None or (server._ready and not server.alive()) or \
                server.proc.poll() is not None:
            dead = server
            server = _servers[key] = ForkServerLauncher(tuple(preload))
            if dead is not None:  # said once, on the next child's result
                server.replaced = dead.ended()
    server.ensure_ready()
    return server
