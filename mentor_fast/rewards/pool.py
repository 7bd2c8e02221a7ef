"""Math verification in worker processes, with a wall-clock timeout per item enforced by the parent.

Why processes: math-verify's SIGALRM timeouts only work in a main thread (see rewards/math.py), and
some inputs never return to the interpreter loop in time (a power tower like 9^{9^{9^{9^{9}}}}
keeps sympy busy for minutes). Each worker checks one item at a time in its own main thread, with
math-verify's signal timeouts on as a cheap first line; the parent kills a worker whose item passes
`timeout_s`, scores that item 0 as a timeout, and starts a replacement. Workers start lazily on
first use and are reaped when killed or closed, so no zombies are left. They fork from a fork server
of our own (forkserver.py), one per process, which has imported math-verify (and sympy) once and
warmed it up: a worker, and the replacement of a killed one, starts in milliseconds instead of
importing them again (about 1.6 s on a 2-core machine). That server never imports the user's main
module, so a training script without a main guard works, and it is safe with torch's threads in
the parent, where a plain fork is not.
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import logging
import math
import os
import signal
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait

from mentor_fast.compat import Self
from mentor_fast.rewards.forkserver import Forked, ForkServer, ForkServerError
from mentor_fast.rewards.math import verify
from mentor_fast.rewards.verdict import Status, Verdict
from mentor_fast.types import Problem

_START_TIMEOUT_S = 120.0  # a worker that cannot warm up in this long is an error


def _warm_up() -> None:
    """The fork server's preparation: math-verify and sympy imported and their first parse done."""
    verify("\\boxed{\\frac{1}{2}}", "0.5", timeout_s=5)  # the server runs it in its main thread


SERVER = ForkServer("mentor_fast.rewards.pool:_warm_up")  # shared by every pool of this process
atexit.register(SERVER.stop)


class VerifierPoolError(RuntimeError):
    """The pool cannot run (a worker failed to start)."""


def _worker_main(conn: Connection, inner_timeout: int | None) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    if inner_timeout is None:  # the parent's wall-clock kill is the timeout; silence the warning
        logging.getLogger("math_verify").setLevel(logging.ERROR)
    verify("\\boxed{\\frac{1}{2}}", "0.5", timeout_s=inner_timeout)  # import and warm up before "ready"
    conn.send(("ready", os.getpid()))
    while True:
        try:
            msg = conn.recv()
        except EOFError:  # parent went away
            return
        if msg is None:
            return
        key, completion, gold = msg
        try:
            verdict = verify(completion, gold, timeout_s=inner_timeout)
        except Exception as e:  # noqa: BLE001 -- process boundary: reported by type, counted by the parent
            name = type(e).__name__
            verdict = Verdict(False, None, f"verifier crashed ({name})", Status.ERROR, name)
        conn.send((key, verdict))


@dataclass
class _Worker:
    proc: Forked
    conn: Connection
    started: float
    ready: bool = False
    task: int | None = None  # index into the current batch's unique items
    deadline: float = math.inf


@dataclass
class PoolCounters:
    """Cumulative over the pool's life."""

    items: int = 0
    timeouts: int = 0
    parse_errors: int = 0
    restarts: int = 0
    errors: collections.Counter = field(default_factory=collections.Counter)  # exception type -> n


class MathVerifierPool:
    """`verify_batch(completions, golds)` in `workers` processes with a per-item wall-clock timeout."""

    def __init__(self, workers: int = 2, timeout_s: float = 5.0, signal_timeouts: bool = True):
        """signal_timeouts: also use math-verify's SIGALRM timeouts inside the workers (cheaper than a
        kill and restart); False leaves only the parent's wall-clock kill (used by the tests)."""
        if workers < 1:
            raise ValueError(f"MathVerifierPool needs workers >= 1, got {workers}")
        if timeout_s <= 0:
            raise ValueError(f"MathVerifierPool needs timeout_s > 0, got {timeout_s}")
        self.workers = workers
        self.timeout_s = float(timeout_s)
        # Inside a worker a completion costs up to 2 signal-timed calls (parse, compare); keep their
        # sum near timeout_s. signal.alarm takes whole seconds.
        self._inner = max(1, int(timeout_s // 2)) if signal_timeouts else None
        self._pool: list[_Worker] = []
        self._owner = os.getpid()
        self.counters = PoolCounters()

    # -- lifecycle -------------------------------------------------------------------------------

    def _spawn(self) -> _Worker:
        try:
            proc, conn = SERVER.spawn(_worker_main, self._inner)
        except ForkServerError as e:
            raise VerifierPoolError(str(e)) from None
        return _Worker(proc, conn, time.monotonic())

    def _kill(self, w: _Worker) -> None:
        if w.proc.is_alive():
            w.proc.kill()
        w.proc.join()  # reap: no zombie
        w.conn.close()
        w.proc.close()

    def _replace(self, w: _Worker) -> None:
        self._kill(w)
        self._pool[self._pool.index(w)] = self._spawn()
        self.counters.restarts += 1

    def _disown_if_forked(self) -> bool:
        """In a copy of this pool in a forked process (a DataLoader worker, say) the workers are the
        parent's: leave them alone (no message, no kill) and start this process's own if it scores."""
        if self._owner == os.getpid():
            return False
        self._pool, self._owner = [], os.getpid()
        return True

    def start(self) -> None:
        """Start the workers (otherwise done on the first `verify_batch`)."""
        self._disown_if_forked()
        while len(self._pool) < self.workers:
            self._pool.append(self._spawn())

    def close(self) -> None:
        if self._disown_if_forked():
            return
        for w in self._pool:
            with contextlib.suppress(OSError):  # already dead: killed below anyway
                w.conn.send(None)
        deadline = time.monotonic() + 5.0
        for w in self._pool:
            w.proc.join(max(0.0, deadline - time.monotonic()))
            self._kill(w)
        self._pool = []

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        if getattr(self, "_pool", None):
            self.close()

    @property
    def pids(self) -> list[int]:
        return [w.proc.pid for w in self._pool]

    # -- scoring ---------------------------------------------------------------------------------

    def check(self, completions: list[str], problems: list[Problem]) -> list[Verdict]:
        """The reward registry's Verifier: each completion against its problem's gold."""
        return self.verify_batch(completions, [p.gold for p in problems])

    def describe(self) -> str:
        return f"math-verify in {self.workers} worker processes, {self.timeout_s:g} s per answer"

    def pop_metrics(self) -> dict[str, float]:
        return {}  # the scorer counts what math verdicts say

    def verify_batch(self, completions: list[str], golds: list[str]) -> list[Verdict]:
        if len(completions) != len(golds):
            raise ValueError(f"{len(completions)} completions but {len(golds)} golds")
        self.start()
        # Identical (completion, gold) pairs are common in a group; check each once.
        unique = list(dict.fromkeys(zip(completions, golds, strict=True)))
        results: list[Verdict | None] = [None] * len(unique)
        todo = collections.deque(range(len(unique)))
        while todo or any(w.task is not None for w in self._pool):
            self._dispatch(todo, unique)
            self._collect(results)
            self._expire(results)
        by_pair = dict(zip(unique, results, strict=True))
        out = [by_pair[pair] for pair in zip(completions, golds, strict=True)]
        self._count(out)
        return out

    def _dispatch(self, todo: collections.deque, unique: list[tuple[str, str]]) -> None:
        for w in list(self._pool):
            if todo and w.ready and w.task is None:
                i = todo.popleft()
                try:
                    w.conn.send((i, *unique[i]))
                except OSError:  # it died while idle (killed from outside): retry the item elsewhere
                    todo.appendleft(i)
                    self._replace(w)
                    continue
                w.task, w.deadline = i, time.monotonic() + self.timeout_s

    def _collect(self, results: list[Verdict | None]) -> None:
        now = time.monotonic()
        waiting = [w for w in self._pool if w.task is not None or not w.ready]
        deadlines = [w.deadline if w.ready else w.started + _START_TIMEOUT_S for w in waiting]
        timeout = max(0.0, min(deadlines, default=now) - now)
        ready = set(wait([w.conn for w in waiting], timeout=timeout))
        for w in list(waiting):
            if w.conn not in ready:
                continue
            try:
                key, payload = w.conn.recv()
            except (EOFError, OSError):  # the worker died (OOM kill, segfault) without answering
                self._worker_died(w, results)
                continue
            if key == "ready":
                w.ready = True
            else:
                results[key] = payload
                w.task, w.deadline = None, math.inf

    def _worker_died(self, w: _Worker, results: list[Verdict | None]) -> None:
        if not w.ready:
            w.proc.join()
            code = w.proc.exitcode
            # Killed by a signal (OOM killer, an outside kill) while importing: start another. An
            # ordinary exit during start is a broken environment (e.g. math-verify missing): stop.
            if code is None or code >= 0 or self.counters.restarts >= 10 * max(1, len(self._pool)):
                raise VerifierPoolError(f"a verifier worker exited during start (exit code {code})")
            self._replace(w)
            return
        if w.task is not None:
            w.proc.join(5.0)
            code = w.proc.exitcode
            results[w.task] = Verdict(False, None, f"verifier worker died (exit code {code})",
                                      Status.ERROR, "WorkerDied")
        self._replace(w)

    def _expire(self, results: list[Verdict | None]) -> None:
        now = time.monotonic()
        for w in list(self._pool):
            if w.ready and w.task is not None and now >= w.deadline:
                results[w.task] = Verdict(False, None, f"verifier timed out after {self.timeout_s:g}s",
                                          Status.TIMEOUT, "WallClockTimeout")
                self._replace(w)
            elif not w.ready and now >= w.started + _START_TIMEOUT_S:
                self._kill(w)
                self._pool.remove(w)
                raise VerifierPoolError(f"a verifier worker did not start within {_START_TIMEOUT_S:g}s")

    def _count(self, verdicts: list[Verdict]) -> None:
        c = self.counters
        c.items += len(verdicts)
        for v in verdicts:
            c.timeouts += v.status is Status.TIMEOUT
            c.parse_errors += v.parse_error
            if v.status is Status.ERROR:
                c.errors[v.error] += 1

    @property
    def timeouts(self) -> int:
        return self.counters.timeouts

    @property
    def parse_errors(self) -> int:
        return self.counters.parse_errors
