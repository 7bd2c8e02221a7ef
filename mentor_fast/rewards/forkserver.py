"""A fork server of our own: a fresh interpreter that prepares once (imports, warm-up), then forks a
worker per request. The math-verify pool (pool.py) starts its workers here.

Why not multiprocessing's start methods: every process that "spawn" or "forkserver" starts first
re-imports the parent's main module (to find pickled functions defined there), and a
"forkserver" preloaded with "__main__" runs it in the server too. A user's training script written
as TRL's examples are, with no `if __name__ == "__main__":` guard, then runs again inside the worker,
builds another trainer and dies ("An attempt has been made to start a new process before the
current process has finished its bootstrapping phase"). This server is started as `python -c` with
the parent's sys.path and never imports the user's main module, whatever it is (a script, `python
-c`, stdin, a notebook's kernel, torchrun's rank). Why not fork the parent itself: the trainer has
threads (torch's OpenMP pool, the async mentor, tokenizers), and a fork copies the locks they hold
into a child with none of those threads to release them. The server has one thread and has not
imported torch; forking from it takes milliseconds.

Protocol, one request at a time (a lock): the parent sends a length-prefixed pickle of (target,
args) with two descriptors attached (the worker's end of a socketpair, the write end of a status
pipe). The server forks, answers the child's pid, and when it reaps the child writes its exit code
(negative: killed by that signal, as multiprocessing reports it) into the status pipe. The server
exits when the parent's end of its control socket closes (the parent exited or stopped it), killing
its workers first; on Linux a worker also dies with the server (PR_SET_PDEATHSIG).
"""

from __future__ import annotations

import contextlib
import importlib
import os
import pickle
import select
import signal
import socket
import struct
import subprocess
import sys
import threading
import traceback
from collections.abc import Callable
from multiprocessing.connection import Connection, wait
from typing import Any

_INT = struct.Struct("!q")
_ORPHANED = -signal.SIGKILL if sys.platform.startswith("linux") else 255
_REPLY_TIMEOUT_S = 120.0  # the server's first answer waits for its preparation (imports: seconds)


class ForkServerError(RuntimeError):
    """The fork server could not start a worker (it failed to start, or died)."""


class Forked:
    """A worker forked by the server: the part of multiprocessing.Process's interface the pool uses."""

    def __init__(self, pid: int, status_fd: int) -> None:
        self.pid, self._status, self._code = pid, status_fd, None

    def poll(self, timeout: float | None = 0.0) -> int | None:
        """The exit code once the server has reaped the worker, else None (waits up to `timeout`)."""
        if self._code is None and self._status >= 0 and wait([self._status], timeout):
            data = os.read(self._status, _INT.size)  # 8 bytes into a pipe: written atomically
            # Nothing to read: the server died first, and on Linux took the worker with it (SIGKILL)
            self._code = _INT.unpack(data)[0] if len(data) == _INT.size else _ORPHANED
        return self._code

    @property
    def exitcode(self) -> int | None:
        return self.poll()

    def is_alive(self) -> bool:
        return self.poll() is None

    def join(self, timeout: float | None = None) -> None:
        self.poll(timeout)

    def kill(self) -> None:
        if self.is_alive():  # not yet reaped, so the pid is still this worker's
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)

    def close(self) -> None:
        if self._status >= 0:
            os.close(self._status)
            self._status = -1


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise EOFError("the fork server closed its control socket")
        buf += chunk
    return buf


class ForkServer:
    """`spawn(target, *args)` runs `target(conn, *args)` in a process forked from a server that has
    called `prepare` ("module:function") once. The server starts on the first spawn and again when
    it has died; a process forked from the parent gets a server of its own."""

    def __init__(self, prepare: str) -> None:
        self.prepare = prepare
        self._proc: subprocess.Popen | None = None
        self._ctl: socket.socket | None = None
        self._owner = 0  # the pid that started the server
        self._lock = threading.Lock()
        self.starts = 0
        os.register_at_fork(after_in_child=self._forget)

    def _forget(self) -> None:
        """In a process forked from the parent (a DataLoader worker, say): the parent's server is not
        this process's; it starts its own if it needs one. The lock may have been held by a thread
        the fork did not copy."""
        self._lock = threading.Lock()
        if self._ctl is not None:
            self._ctl.close()  # this process's copy: the parent's server still sees the parent's
        self._ctl, self._proc, self._owner = None, None, 0

    def _ensure_running(self) -> None:
        if self._proc is not None and self._owner == os.getpid() and self._proc.poll() is None:
            return
        if self._owner == os.getpid():
            self._stop()
        ours, theirs = socket.socketpair()
        code = (f"import sys; sys.path[:] = {[str(p) for p in sys.path]!r}; "
                f"from mentor_fast.rewards.forkserver import serve; serve({theirs.fileno()}, {self.prepare!r})")
        self._proc = subprocess.Popen([sys.executable, "-c", code], pass_fds=[theirs.fileno()],
                                      stdin=subprocess.DEVNULL)
        theirs.close()
        self._ctl, self._owner = ours, os.getpid()
        self.starts += 1

    def spawn(self, target: Callable[..., Any], *args: Any) -> tuple[Forked, Connection]:
        payload = pickle.dumps((target, args))
        with self._lock:
            self._ensure_running()
            mine, child = socket.socketpair()
            status_r, status_w = os.pipe()
            try:
                socket.send_fds(self._ctl, [_INT.pack(len(payload)) + payload], [child.fileno(), status_w])
                self._ctl.settimeout(_REPLY_TIMEOUT_S)
                (pid,) = _INT.unpack(_recv_exact(self._ctl, _INT.size))
            except (OSError, EOFError) as e:  # a timeout is an OSError
                os.close(status_r)
                mine.close()
                self._stop()
                raise ForkServerError(f"the fork server ({self.prepare}) did not start a worker: {e} (its error, "
                                      "if any, is printed above)") from None
            finally:
                child.close()
                os.close(status_w)
        return Forked(pid, status_r), Connection(mine.detach())

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None and self._owner == os.getpid() else None

    def _stop(self) -> None:
        if self._ctl is not None:
            self._ctl.close()  # the server reads EOF: it kills its workers and exits
            self._ctl = None
        if self._proc is not None:
            try:
                self._proc.wait(5.0)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
            self._proc = None

    def stop(self) -> None:
        """Stop the server (and any worker it still runs); the next spawn starts another."""
        with self._lock:
            if self._owner == os.getpid():
                self._stop()


# -- the server process --------------------------------------------------------------------------


def serve(ctl_fd: int, prepare: str) -> None:
    """The server's main loop (run by `python -c`, see ForkServer._ensure_running)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole process group: the parent decides
    module, _, name = prepare.partition(":")
    getattr(importlib.import_module(module), name)()
    ctl = socket.socket(fileno=ctl_fd)
    wake_r, wake_w = os.pipe()
    for fd in (wake_r, wake_w):
        os.set_blocking(fd, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # a handler, so that SIGCHLD writes to the wakeup fd
    children: dict[int, int] = {}  # pid -> the write end of its status pipe
    try:
        while True:
            ready, _, _ = select.select([ctl, wake_r], [], [])
            if wake_r in ready:
                with contextlib.suppress(BlockingIOError):
                    while os.read(wake_r, 512):
                        pass
                _reap(children)
            if ctl in ready and not _fork_one(ctl, children, (wake_r, wake_w)):
                return
    finally:
        for pid in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def _fork_one(ctl: socket.socket, children: dict[int, int], wake: tuple[int, int]) -> bool:
    """Serve one request; False when the parent has closed the control socket."""
    head, fds, _, _ = socket.recv_fds(ctl, _INT.size, 2)
    if not head:
        return False
    (n,) = _INT.unpack(head + _recv_exact(ctl, _INT.size - len(head)))
    target, args = pickle.loads(_recv_exact(ctl, n))
    conn_fd, status_w = fds
    server = os.getpid()
    pid = os.fork()
    if pid == 0:
        _run_child(target, args, conn_fd, server, [ctl.fileno(), *wake, status_w, *children.values()])
    os.close(conn_fd)
    children[pid] = status_w
    ctl.sendall(_INT.pack(pid))
    return True


def _reap(children: dict[int, int]) -> None:
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        fd = children.pop(pid, None)
        if fd is not None:
            with contextlib.suppress(OSError):  # the parent closed its end: nobody to tell
                os.write(fd, _INT.pack(os.waitstatus_to_exitcode(status)))
            os.close(fd)


def _run_child(target: Callable[..., Any], args: tuple, conn_fd: int, server: int, server_fds: list[int]) -> None:
    code = 1
    try:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        _die_with(server)
        for fd in server_fds:
            os.close(fd)
        target(Connection(conn_fd), *args)
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else int(e.code is not None)
    except BaseException:  # noqa: BLE001 -- a worker's crash: its traceback, then a non-zero exit
        traceback.print_exc()
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def _die_with(server: int) -> None:
    """Linux: the kernel kills this worker when the server exits, however it exits."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    pr_set_pdeathsig = 1
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != server:  # the server died before the prctl took effect
        os._exit(1)
