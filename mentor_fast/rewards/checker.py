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
the standard library and wire.py, so the zygote starts with `python -I -S`.
"""

from __future__ import annotations

import builtins
import os
import resource
import signal
import sys

from mentor_fast.rewards import wire

_KINDS = ("call", "class", "value", "module", "object")
_GROUPS = tuple(getattr(builtins, n) for n in ("BaseExceptionGroup",) if hasattr(builtins, n))  # 3.11+


class Fault(BaseException):
    """The channel broke; BaseException so that `except Exception` in a test does not catch it."""

    status = ""
    test_line = ""


class Forged(Fault):
    status = "forged_output"


class BadReturn(Fault):
    status = "bad_return_type"


class ChannelEnded(Fault):
    status = "channel_eof"


class NeedsObjects(Fault):
    status = "needs_objects"


def _test_line(tests: list[str], lineno: int | None) -> str:
    return tests[lineno - 1].strip() if lineno and lineno <= len(tests) else ""


def _current_test_line(tests: list[str]) -> str:
    frame = sys._getframe(1)
    while frame is not None and frame.f_code.co_filename != "<tests>":
        frame = frame.f_back
    return _test_line(tests, frame.f_lineno) if frame is not None else ""


class Channel:
    """The checker's end: requests out, answers in, and the first fault (sticky)."""

    def __init__(self, send_fd: int, recv_fd: int, tests: list[str]):
        self.send_fd, self.reader, self.tests = send_fd, wire.Reader(recv_fd), tests
        self.fault: Fault | None = None
        self.calls = 0
        self.mutated: list[tuple[str, list[object]]] = []  # (function, the arguments it changed)

    def fail(self, fault: Fault) -> None:
        if self.fault is None:
            fault.test_line = _current_test_line(self.tests)
            self.fault = fault
        raise self.fault

    def receive(self) -> dict:
        try:
            msg = self.reader.next()
        except wire.Malformed as e:
            self.fail(Forged(f"the program's process sent {e}"))
        if msg is None:
            self.fail(ChannelEnded("the program's process closed the channel"))
        return msg

    def ask(self, frame: bytes) -> dict:
        if self.fault is not None:
            raise self.fault
        try:
            wire.send(self.send_fd, frame)
        except OSError:
            self.fail(ChannelEnded("the program's process closed the channel"))
        self.calls += 1
        return self.receive()

    def _encode_arg(self, name: str, where: object, arg: object) -> str:
        try:
            return wire.encode(arg)
        except wire.Refused as e:
            self.fail(NeedsObjects(f"argument {where} of {name}() is a {e}: it cannot cross to the program's "
                                   "process as plain data"))

    def call(self, name: str, args: tuple, kwargs: dict) -> object:
        enc = [self._encode_arg(name, i, a) for i, a in enumerate(args)]
        kw = [f"[{wire.string(str(k))},{self._encode_arg(name, repr(k), v)}]" for k, v in kwargs.items()]
        reply = self.ask(wire.message(call=wire.string(name), args=f"[{','.join(enc)}]", kwargs=f"[{','.join(kw)}]"))
        result = self.result(f"{name}()", reply)
        changed = reply.get("mutated")
        if changed is not None:
            if type(changed) is not list or not all(type(i) is int and 0 <= i < len(args) for i in changed):
                self.fail(Forged("a malformed list of changed arguments"))
            self.mutated.append((name, [args[i] for i in changed]))
        return result

    def get(self, name: str) -> object:
        """The value of a name the program defined; a ProgramObject when it is not plain data."""
        reply = self.ask(wire.message(get=wire.string(name)))
        if set(reply) == {"refused"}:
            return ProgramObject(self, name, "object")
        return self.result(name, reply)

    def run(self, stdin: str) -> str:
        out = self.result("the program", self.ask(wire.message(run=wire.string(stdin))))
        if type(out) is not str:
            self.fail(BadReturn(f"the program's printed output came back as a {type(out).__name__}"))
        return out

    def result(self, what: str, reply: dict) -> object:
        keys = set(reply)
        if keys in ({"ok"}, {"ok", "mutated"}):
            try:
                return wire.value(reply["ok"])
            except wire.Malformed as e:
                self.fail(Forged(f"{what} answered with {e}"))
        if keys == {"raise"}:
            raise stand_in(self.exception_info(reply["raise"]))
        if keys == {"refused"} and type(reply["refused"]) is str:
            self.fail(BadReturn(f"{what} returned a {reply['refused'][:200]}; only None, bool, int, float, str, "
                                "bytes and lists, tuples, dicts and sets of these cross"))
        self.fail(Forged(f"an answer for {what} that is none of ok, raise, refused"))

    def exception_info(self, node: object) -> dict:
        fields = ("type", "message", "traceback")
        if type(node) is not dict or set(node) != set(fields) or any(type(node[k]) is not str for k in fields):
            self.fail(Forged("a malformed exception"))
        return {k: node[k][:2000] for k in fields}

    def first(self) -> tuple[dict[str, tuple[str, str]], dict | None]:
        """The program's first message: the names it defined ({name: (kind, detail)}), or the
        exception its top level raised."""
        msg = self.receive()
        if set(msg) == {"error"}:
            return {}, self.exception_info(msg["error"])
        listed = msg.get("ready") if set(msg) == {"ready"} else None
        ok = type(listed) is list and all(
            type(e) is list and len(e) == 3 and all(type(x) is str for x in e) and e[1] in _KINDS for e in listed)
        if not ok:
            self.fail(Forged("a first message that is neither ready nor error"))
        return {n: (k, d) for n, k, d in listed if n.isidentifier()}, None


def stand_in(info: dict) -> BaseException:
    """The program's exception as the checker's own: a subclass of the built-in of that name (so
    `except ValueError` in a test still works) carrying the message, or of Exception."""
    name, message = info["type"], info["message"]
    name = name if name.isidentifier() else "Exception"
    base = getattr(builtins, name, None)
    if not (isinstance(base, type) and issubclass(base, BaseException)) or issubclass(base, _GROUPS):
        base = Exception
    try:
        e = type(name, (base,), {"__str__": lambda self: message, "__module__": "program"})(message)
    except TypeError:  # a built-in whose constructor wants more (UnicodeDecodeError)
        e = type(name, (Exception,), {"__str__": lambda self: message, "__module__": "program"})(message)
    e.program_traceback = info["traceback"]
    return e


class ProgramObject:
    """A name the tests use that is bound to an object of the program's: any use is needs_objects."""

    def __init__(self, chan: Channel, name: str, kind: str):
        self._chan, self._name, self._kind = chan, name, kind

    def _refuse(self, *args, **kwargs):
        self._chan.fail(NeedsObjects(f"the tests use the program's {self._kind} {self._name!r}: the program's "
                                     "objects stay in its process, only plain data crosses"))

    __call__ = __getattr__ = __getitem__ = __iter__ = __len__ = __bool__ = __contains__ = _refuse
    __eq__ = __ne__ = __lt__ = __le__ = __gt__ = __ge__ = __add__ = __sub__ = __mul__ = _refuse
    __hash__ = object.__hash__

    def __repr__(self) -> str:
        return f"<the program's {self._kind} {self._name}>"


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
    if "SOURCE" in wanted and listed["SOURCE"][0] == "value" and entry_point != "SOURCE":
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
             + (f"    {_test_line(tests, tb.tb_lineno)}\n" if tb.tb_frame.f_code.co_filename == "<tests>" else "")
             for tb in frames]
    remote = getattr(outcome, "program_traceback", "")
    text = ("Traceback (most recent call last):\n" + "".join(lines)
            + (f"in the program's process:\n{remote.partition(chr(10))[2]}" if remote
               else "".join(traceback.format_exception_only(type(outcome), outcome))))
    name = type(outcome).__name__
    test = next((tb for tb in reversed(frames) if tb.tb_frame.f_code.co_filename == "<tests>"), None)
    out.update(exception=name, message=str(outcome)[:500], traceback=text[-2000:],
               test_line=_test_line(tests, test.tb_lineno) if test else "")
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
        if len(fds) == 3 and os.fork() == 0:
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
