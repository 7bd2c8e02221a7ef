"""One program judged: its sandboxed process (sandbox.py, inside/runner.py) and a checker process
(inside/checker.py), joined by two pipes that carry plain data; the verdict comes back to the trainer on a
socket that only the checker holds.

    trainer --program on stdin--> program's process (namespaces, rlimits, its own root)
    trainer --job on a socket---> checker (forked by the zygote: tests, setup, entry point)
    checker <--requests/answers--> program's process      (two pipes: the program's only channel)
    checker --verdict-----------> trainer

The trainer reads the program's stdout and stderr (capped), and kills its namespace when the
verdict is in, when a stream passes its cap, or at the deadline. A checker outlives nothing: it
ends when it has sent its verdict, when the program's end of the channel closes, or at its alarm.
"""

from __future__ import annotations

import atexit
import json
import os
import selectors
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field

from mentor_fast.rewards import sandbox
from mentor_fast.rewards.sandbox import Isolation, Limits

_GRACE_S = 1.0  # after the channel ended: how long the program's process may take to exit
CHECKER_MODULES = ("wire", "decoder", "channel", "checker")  # what the checker's zygote loads
CHECKER_BOOT = sandbox.LOADER + (
    "import os\nfrom mentor_fast.rewards.inside import checker\n"
    "os.dup2(os.open(os.devnull, os.O_RDONLY), 0)\nchecker.zygote(int(sys.argv[1]))\n")


@dataclass
class JudgeRun:
    status: str  # "judged" (the checker's verdict), "timeout", "killed" (over an output cap), "sandbox_error"
    verdict: dict | None = None  # the checker's (checker.verdict)
    exited: bool = True  # for a verdict of channel_eof: whether the program's process had exited
    returncode: int | None = None
    stdout: str = ""
    stderr: str = ""
    wall_s: float = 0.0
    detail: str = ""
    truncated: list[str] = field(default_factory=list)  # streams cut at the cap


class _Zygote:
    """The process that forks checkers (checker.zygote), started on first use, one per trainer process."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.proc: subprocess.Popen | None = None
        self.sock: socket.socket | None = None
        self.owner = 0

    def submit(self, fds: list[int]) -> None:
        """Hand a job's descriptors (job socket, to the program, from the program) to a new checker."""
        with self.lock:
            for _ in range(2):
                if self.proc is None or self.owner != os.getpid() or self.proc.poll() is not None:
                    self._start()
                try:
                    socket.send_fds(self.sock, [b"j"], fds)
                    return
                except OSError:
                    self._stop()
            raise OSError("the checker zygote does not take jobs")

    def _start(self) -> None:
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-I", "-S", "-c", CHECKER_BOOT, str(theirs.fileno())], stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL, env={}, cwd="/", pass_fds=(theirs.fileno(),), start_new_session=True)
            self.proc.stdin.write(sandbox.code_blob(CHECKER_MODULES))
            self.proc.stdin.close()
        finally:
            theirs.close()
        self.sock, self.owner = mine, os.getpid()

    def _stop(self) -> None:
        if self.sock is not None:
            self.sock.close()
        if self.proc is not None and self.owner == os.getpid():
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = self.sock = None

    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None and self.owner == os.getpid() else None

    def close(self) -> None:
        with self.lock:
            self._stop()


ZYGOTE = _Zygote()
atexit.register(ZYGOTE.close)


def judge(program: str, tests: str, timeout_s: float, limits: Limits | None = None,
          isolation: Isolation = Isolation.NAMESPACES, entry_point: str = "", setup: str = "") -> JudgeRun:
    """Run `program` in its sandbox and `tests` (after the trusted `setup`) in a checker against it.
    Raises SandboxError when namespaces were asked for and this machine has none."""
    limits = limits or Limits()
    prefix, userns = sandbox.launcher(isolation)
    t0 = time.monotonic()
    to_r, to_w = os.pipe()
    from_r, from_w = os.pipe()
    mine, theirs = socket.socketpair()
    try:
        try:
            proc = sandbox.start(program, limits, prefix, userns, to_r, from_w)
        except OSError as e:
            mine.close()
            return JudgeRun("sandbox_error", detail=f"cannot start: {e}")
        finally:
            os.close(to_r)
            os.close(from_w)
        try:
            ZYGOTE.submit([theirs.fileno(), to_w, from_r])
            job = {"tests": tests, "setup": setup, "entry_point": entry_point, "timeout_s": timeout_s,
                   "memory_mb": limits.memory_mb + 1024}
            mine.settimeout(max(0.1, timeout_s))
            mine.sendall(json.dumps(job).encode() + b"\n")
            mine.setblocking(False)
        except OSError as e:
            _kill(proc)
            for f in (proc.stdout, proc.stderr):
                f.close()
            proc.wait()
            mine.close()
            return JudgeRun("sandbox_error", detail=f"the checker did not start: {e}")
    finally:
        theirs.close()
        os.close(to_w)
        os.close(from_r)
    return _Collector(proc, mine, limits.output_bytes).run(t0, t0 + timeout_s)


def _kill(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # unshare and, through --kill-child, the namespace
    except ProcessLookupError:
        pass


class _Collector:
    """Reads the program's stdout and stderr and the checker's verdict without blocking on any."""

    def __init__(self, proc: subprocess.Popen, verdict: socket.socket, cap: int):
        self.proc, self.sock, self.cap = proc, verdict, cap
        self.bufs = {"stdout": bytearray(), "stderr": bytearray()}
        self.cut: list[str] = []
        self.verdict = b""
        self.sel = selectors.DefaultSelector()
        for f, name in ((proc.stdout, "stdout"), (proc.stderr, "stderr"), (verdict, "verdict")):
            os.set_blocking(f.fileno(), False)
            self.sel.register(f.fileno(), selectors.EVENT_READ, name)

    def pump(self, deadline: float, until) -> bool:
        """Read whatever is ready until `until()` holds (True) or the deadline passes (False)."""
        while not until():
            left = deadline - time.monotonic()
            if left <= 0 or not self.sel.get_map():
                return until()
            for key, _ in self.sel.select(min(left, 0.5)):
                try:
                    chunk = os.read(key.fd, 65536)
                except OSError:  # ECONNRESET: the checker went without reading its job
                    chunk = b""
                if not chunk:
                    self.sel.unregister(key.fd)
                elif key.data == "verdict":
                    self.verdict += chunk[: 1 << 20]
                else:
                    buf = self.bufs[key.data]
                    buf += chunk[: max(0, self.cap - len(buf))]
                    if len(buf) >= self.cap and key.data not in self.cut:
                        self.cut.append(key.data)
        return True

    def _open(self, name: str) -> bool:
        return any(k.data == name for k in self.sel.get_map().values())

    def run(self, t0: float, deadline: float) -> JudgeRun:
        try:
            done = self.pump(deadline, lambda: bool(self.cut) or not self._open("verdict"))
            run = JudgeRun("killed" if self.cut else "judged" if done else "timeout")
            if run.status == "judged":
                run = self._read_verdict(run, deadline)
        finally:
            _kill(self.proc)
            self.sock.close()
            self.pump(time.monotonic() + 1.0, lambda: not self._open("stdout") and not self._open("stderr"))
            self.sel.close()
            self.proc.stdout.close()
            self.proc.stderr.close()
            self.proc.wait()
        run.returncode, run.wall_s, run.truncated = self.proc.returncode, time.monotonic() - t0, self.cut
        run.stdout, run.stderr = (bytes(self.bufs[k]).decode("utf-8", "replace") for k in ("stdout", "stderr"))
        return run

    def _read_verdict(self, run: JudgeRun, deadline: float) -> JudgeRun:
        try:
            run.verdict = json.loads(self.verdict)
        except ValueError:
            return JudgeRun("sandbox_error", detail="the checker ended without a verdict")
        if run.verdict.get("status") == "channel_eof":  # a crash, or a closed channel in a live process?
            self.pump(min(deadline, time.monotonic() + _GRACE_S),
                      lambda: not self._open("stdout") and not self._open("stderr"))
            grace = time.monotonic() + 0.05
            while self.proc.poll() is None and time.monotonic() < min(deadline, grace):
                time.sleep(0.005)
            run.exited = self.proc.poll() is not None
        return run
