"""The checker: a problem's tests, run in a process of their own against a program that lives in
another (its sandbox, runner.py), joined to it by a channel that carries plain data only.

The tests run here, in a fresh namespace, with every name they use from the program bound to a
stand-in: a function the program defined becomes a proxy that sends the arguments as plain data
(wire.py), waits for the answer and rebuilds it from the parsed frame as exact built-in types, so
`==`, `isinstance` and everything else run on the checker's own objects. The problem's trusted
setup code (HumanEval's prompt: `poly`, `encode_cyclic`) runs here too, never the program's copy
of it. Builtins are never taken from the program.

A channel fault decides the verdict whatever the tests do with the exception (a bare `except`
in a test cannot swallow it): forged_output (bytes that are not a well-formed answer),
bad_return_type (a value that is not plain data), channel_eof (the channel ended: the trainer
tells a crash from a closed channel), needs_objects (the tests need the program's objects in
this process: a callback argument, an instance of the program's class, or an argument the program
changed in place that the failing test then read).

Processes: `zygote` runs once per trainer, imports what checkers need, and forks one checker per
program (`serve_job`); a fork costs about a millisecond where a fresh interpreter costs tens. The
trainer hands each job its descriptors over a socket (judge.py). This module imports nothing but
the standard library, wire.py and channel.py, so the zygote starts with `python -I -S`.
"""

from __future__ import annotations

import builtins
import os
import resource
import signal
import sys

from mentor_fast.rewards import wire
from mentor_fast.rewards.channel import Channel, Fault, ProgramObject, source_line


def proxy(chan: Channel, name: str):
    def call(*args, **kwargs):
        return chan.call(name, args, kwargs)

    call.__name__ = call.__qualname__ = name
    return call


def _code_names(code) -> set[str]:
    """Every global or attribute name the code (and the functions in it) uses, and every string
    constant that could be one (APPS's call tests look the function up as `globals()[name]`)."""
    out = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, type(code)):
            out |= _code_names(const)
        elif type(const) is str and const.isidentifier():
            out.add(const)
    return out


def bind(g: dict, chan: Channel, listed: dict, tests, entry_point: str) -> None:
    """Bind in `g` each name the tests use that only the program defines (never a builtin, never a
    name the setup defined), and the entry point whatever the setup holds under its name."""
    wanted = {n for n in _code_names(tests) if n in listed and not n.startswith("__") and n not in g
              and not hasattr(builtins, n)}
    if entry_point:
        wanted.add(entry_point)
    if "SOURCE" in wanted and entry_point != "SOURCE" and listed["SOURCE"][0] == "value":
        wanted.discard("SOURCE")
        _stdio(g, chan)
    for name in sorted(wanted):
        kind, _ = listed.get(name, ("call", ""))
        if kind == "call":
            g[name] = proxy(chan, name)
        elif kind == "value":
            g[name] = chan.get(name)
        elif kind == "module" and name.partition(".")[0] in getattr(sys, "stdlib_module_names", ()):
            g[name] = __import__(name)  # the checker's own copy of the module the tests name
        else:
            g[name] = ProgramObject(chan, name, kind)


class _Script:
    """What `compile(SOURCE, ...)` returns in the tests: the program, which runs in its own process."""


def _stdio(g: dict, chan: Channel) -> None:
    """Stdio tests (data/code_sources.py) `exec(compile(SOURCE, ...), scope)` with stdin and stdout
    swapped: here that runs the program in its process on the same stdin and prints what it printed."""
    source, script = "# the program runs in its own process\n", _Script()
    g["SOURCE"] = source

    def compile_(src, *args, **kwargs):
        return script if src is source else builtins.compile(src, *args, **kwargs)

    def exec_(code, *args, **kwargs):
        if code is not script:
            return builtins.exec(code, *args, **kwargs)  # noqa: S102 -- the tests' own exec
        sys.stdout.write(chan.run(sys.stdin.read()))
        return None

    g["__builtins__"] = {**vars(builtins), "compile": compile_, "exec": exec_}


def _frames(tb, names=("<tests>", "<setup>")) -> list:
    out = []
    while tb is not None:
        if tb.tb_frame.f_code.co_filename in names:
            out.append(tb)
        tb = tb.tb_next
    return out


def _reads_changed(chan: Channel, frames: list, line: str) -> str:
    """The function whose argument, changed in place by the program, the failing test line reads
    (by a name the failing frame binds to that object)."""
    if not frames or not chan.mutated or not line:
        return ""
    import re

    frame = frames[-1].tb_frame
    words = set(re.findall(r"[^\W\d]\w*", line))
    held = [v for scope in (frame.f_locals, frame.f_globals) for k, v in list(scope.items()) if k in words]
    return next((fn for fn, objs in chan.mutated if any(v is o for v in held for o in objs)), "")


def verdict(outcome: BaseException | None, chan: Channel, tests: list[str]) -> dict:
    out = {"passed": False, "stage": "tests", "exception": "", "message": "", "test_line": "", "traceback": "",
           "calls": chan.calls, "mutated": len(chan.mutated)}
    if chan.fault is not None:
        return {**out, "status": chan.fault.status, "message": str(chan.fault), "test_line": chan.fault.test_line}
    if outcome is None:
        return {**out, "passed": True, "status": "passed"}
    import traceback

    frames = _frames(outcome.__traceback__)
    lines = [f'  File "{tb.tb_frame.f_code.co_filename}", line {tb.tb_lineno}, in {tb.tb_frame.f_code.co_name}\n'
             + (f"    {source_line(tests, tb.tb_lineno)}\n" if tb.tb_frame.f_code.co_filename == "<tests>" else "")
             for tb in frames]
    remote = getattr(outcome, "program_traceback", "")
    text = ("Traceback (most recent call last):\n" + "".join(lines)
            + (f"in the program's process:\n{remote.partition(chr(10))[2]}" if remote
               else "".join(traceback.format_exception_only(type(outcome), outcome))))
    name = type(outcome).__name__
    test = next((tb for tb in reversed(frames) if tb.tb_frame.f_code.co_filename == "<tests>"), None)
    out.update(exception=name, message=str(outcome)[:500], traceback=text[-2000:],
               test_line=source_line(tests, test.tb_lineno) if test else "")
    changed = _reads_changed(chan, frames, out["test_line"]) if name == "AssertionError" else ""
    if changed:
        return {**out, "status": "needs_objects", "message": f"the program changed an argument of {changed}() in "
                "place and the failing test reads it: that object stays in the program's process"}
    return {**out, "status": "failed" if name == "AssertionError" else "error"}


def judge(job: dict, chan: Channel) -> dict:
    """Run the job's tests against the program behind `chan`; the verdict as a dict."""
    tests = chan.tests
    try:
        code = compile(job["tests"], "<tests>", "exec")
    except SyntaxError as e:
        return verdict(e, chan, tests)
    g: dict = {"__name__": "__main__", "__builtins__": builtins}
    if job["setup"]:
        try:
            setup = compile(job["setup"], "<setup>", "exec")
        except SyntaxError:  # a prompt that is no program of its own: the tests get the program's names
            setup = None
        if setup is not None:
            exec(setup, g)  # noqa: S102 -- the dataset's prompt: trusted code
    try:
        names, error = chan.first()
    except Fault:
        return verdict(None, chan, tests)
    if error is not None:
        return {"passed": False, "status": "error", "stage": "program", "exception": error["type"][:100],
                "message": error["message"][:500], "test_line": "", "traceback": error["traceback"], "calls": 0,
                "mutated": 0}
    try:
        bind(g, chan, names, code, job["entry_point"])
        exec(code, g)  # noqa: S102 -- the dataset's tests: trusted code
        outcome = None
    except BaseException as e:  # noqa: BLE001 -- the tests' outcome, whatever it is
        outcome = e
    return verdict(outcome, chan, tests)


def serve_job(job_fd: int, send_fd: int, recv_fd: int) -> None:
    """One checker: the job from the trainer on `job_fd`, the program on the other two; the verdict
    goes back on `job_fd`."""
    job = wire.Reader(job_fd).next()
    signal.alarm(int(job["timeout_s"]) + 2)  # the trainer stops waiting at its deadline; this ends the work
    mb = job["memory_mb"] << 20
    resource.setrlimit(resource.RLIMIT_AS, (mb, mb))
    chan = Channel(send_fd, recv_fd, job["tests"].splitlines())
    try:
        result = judge(job, chan)
    except BaseException as e:  # noqa: BLE001 -- a fault of the checker itself: reported, never a pass
        result = {"passed": False, "status": "checker_error", "stage": "checker", "exception": type(e).__name__,
                  "message": str(e)[:500], "test_line": "", "traceback": "", "calls": chan.calls, "mutated": 0}
    os.close(send_fd)  # the program's side reads the end of the channel and exits
    wire.send(job_fd, wire.message(**{k: wire.encode(v) for k, v in result.items()}))


def zygote(ctl_fd: int) -> None:
    """Fork one checker per job the trainer sends on `ctl_fd` (a message with three descriptors);
    return when the trainer closes it."""
    import socket

    for name in ("collections", "copy", "functools", "heapq", "itertools", "math", "random", "re", "string",
                 "traceback"):  # what tests import, once for every checker forked from here
        __import__(name)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the trainer's Ctrl-C is the trainer's
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the kernel reaps finished checkers
    ctl = socket.socket(fileno=ctl_fd)
    devnull = os.open(os.devnull, os.O_RDWR)
    while True:
        try:
            data, fds, _, _ = socket.recv_fds(ctl, 16, 3)
        except OSError:
            return
        if not data:
            return
        try:
            pid = os.fork() if len(fds) == 3 else -1
        except OSError:  # no process to be had: the trainer reads no verdict, a sandbox_error
            pid = -1
        if pid == 0:
            status = 1
            try:
                ctl.close()
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                os.dup2(devnull, 1)  # what the tests print goes nowhere
                os.dup2(devnull, 2)
                serve_job(*fds)
                status = 0
            finally:
                os._exit(status)
        for fd in fds:
            os.close(fd)
