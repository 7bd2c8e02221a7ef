"""The checker: a problem's tests, run in a process of their own against a program that lives in
another (its sandbox, runner.py), joined to it by a channel that carries plain data only.

Checker side (standard library only, with wire.py, decoder.py and channel.py: the zygote starts
with `python -I -S`). The tests run here, in a fresh namespace, after the problem's trusted setup
code (HumanEval's prompt: `poly`, `encode_cyclic`); a setup or tests that do not compile, or a
setup that raises, is `bad_problem` before the program is asked anything. The names the tests and
the setup read and define nowhere (their free global names, never their string constants, so no
expected value is ever named to the program) are bound to the program's: a function becomes a
`Remote` whose calls run in the program's process, a plain value is fetched, a standard-library
module is imported here. The entry point is always the program's, whatever the setup holds under
its name. Builtins are never taken from the program.

What the tests observe must be the program, or the verdict says it is not (`unsupported`): a guard
runs before every call and refuses one made while the tests trace or profile (sys.settrace), patch
anything with unittest.mock (but sys.stdout/sys.stderr, whose printed output the call brings back),
replace a builtin or sys.stdin, or rebind a name of the program's (a recursion counter). The tests'
recursion limit (sys.setrecursionlimit) is carried to the call.

A channel fault decides the verdict whatever the tests do with the exception (a bare `except`
cannot swallow it): forged_output, channel_eof (the trainer tells a crash from a closed channel),
unsupported, and an error for SystemExit and the other BaseExceptions the program raises.

Processes: `zygote` runs once per trainer, imports what checkers need, and forks one checker per
program (`serve_job`); a fork costs about a millisecond where a fresh interpreter costs tens.
"""

from __future__ import annotations

import builtins
import os
import resource
import signal
import sys

from mentor_fast.rewards.inside import wire
from mentor_fast.rewards.inside.channel import Channel, Fault, ProgramObject, Remote, Unsupported, source_line

_LOADS = frozenset({"LOAD_NAME", "LOAD_GLOBAL", "LOAD_FROM_DICT_OR_GLOBALS"})
_STORES = frozenset({"STORE_NAME", "STORE_GLOBAL", "DELETE_NAME", "DELETE_GLOBAL"})
_PATCHES: list = []  # unittest.mock patchers entered and not yet exited (see _watch_patches)


def global_names(code) -> tuple[set[str], set[str], set[str], set[str]]:
    """(the global names `code` and its functions read, those they bind, those an `except` names,
    the identifier-like strings they hold)."""
    import dis

    loads, stores, caught, strings, todo = set(), set(), set(), set(), [code]
    while todo:
        c = todo.pop()
        strings.update(k for k in c.co_consts if type(k) is str and k.isidentifier())
        recent: list[str] = []  # the names loaded since the last other instruction: `except (A, B):`
        for ins in dis.get_instructions(c):
            if ins.opname in _LOADS:
                loads.add(ins.argval)
                recent.append(ins.argval)
                continue
            if ins.opname in _STORES:
                stores.add(ins.argval)
            elif ins.opname in ("CHECK_EXC_MATCH", "CHECK_EG_MATCH", "JUMP_IF_NOT_EXC_MATCH"):
                caught.update(recent)
            if ins.opname != "BUILD_TUPLE":
                recent = []
        todo += [k for k in c.co_consts if isinstance(k, type(code))]
    return loads, stores, caught, strings


def bind(g: dict, chan: Channel, listed: dict, wanted: set[str], strings: set[str],
         entry_point: str) -> dict[str, object]:
    """Bind in `g` each wanted name that only the program defines, and the entry point whatever the
    setup holds under its name; returns what was bound. A string of the tests that names a function
    of the program's (APPS's `globals()[name]`) is bound too, and costs nothing until called: the
    program hears of it only when the tests call it, so a string that is an expected value is
    never named to it."""
    wanted = {n for n in wanted if n in listed and not n.startswith("__") and n not in g}
    wanted |= {n for n in strings if listed.get(n, ("",))[0] == "call" and not n.startswith("__") and n not in g}
    if entry_point:
        wanted.add(entry_point)
    if "SOURCE" in wanted and entry_point != "SOURCE" and listed["SOURCE"][0] == "value":
        wanted.discard("SOURCE")
        _stdio(g, chan)
    bound = {}
    for name in sorted(wanted):
        kind, _ = listed.get(name, ("call", ""))
        if kind == "call":
            bound[name] = Remote(chan, name)
        elif kind == "value":
            bound[name] = chan.get(name)
        elif kind == "module" and name.partition(".")[0] in getattr(sys, "stdlib_module_names", ()):
            bound[name] = __import__(name)  # the checker's own copy of the module the tests name
        else:
            bound[name] = ProgramObject(chan, name, kind)
    g.update(bound)
    return bound


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


class Guard:
    """Run before each call: the ways tests observe a function that a call across processes cannot
    honour (see the module docstring) end the verdict as unsupported."""

    def __init__(self, chan: Channel, g: dict, bound: dict[str, object]):
        self.chan, self.g, self.bound = chan, g, bound
        self.builtins = dict(vars(builtins))
        self.stdin, self.limit = sys.stdin, sys.getrecursionlimit()

    def __call__(self, name: str) -> None:
        why = ""
        if sys.gettrace() is not None or sys.getprofile() is not None:
            why = "trace or profile the program's frames (sys.settrace, sys.setprofile)"
        elif vars(builtins) != self.builtins and self._replaced():  # the comparison runs in C
            why = f"replaced builtins.{self._replaced()}"
        elif sys.stdin is not self.stdin:
            why = "replaced sys.stdin"
        elif any(self.g.get(n) is not v for n, v in self.bound.items()):
            why = f"rebound the program's {next(n for n, v in self.bound.items() if self.g.get(n) is not v)!r}"
        elif _PATCHES:
            why = f"patch {_PATCHES[0]} (unittest.mock)"
        if why:
            self.chan.fail(Unsupported(f"the tests {why} while calling {name}(): that stays in the checker's process, "
                                       "not the program's"))

    def _replaced(self) -> str:
        """A builtin the tests replaced ("" when they only added names)."""
        return next((k for k, v in self.builtins.items() if vars(builtins).get(k) is not v), "")

    def budget(self) -> int | None:
        """The recursion depth the tests' limit leaves a call, counted from the tests' first frame
        (None: the tests left the limit alone)."""
        limit = sys.getrecursionlimit()
        if limit == self.limit:
            return None
        frame, depth, seen = sys._getframe(1), 0, 0
        while frame is not None:
            depth += 1
            seen = depth if frame.f_code.co_filename in ("<tests>", "<setup>") else seen
            frame = frame.f_back
        return limit - seen - 2  # and a harness's own frames, as one process would have them


def _watch_patches() -> None:
    """Keep `_PATCHES` up to date with unittest.mock's patchers (imported by the zygote)."""
    mock = sys.modules.get("unittest.mock")
    if mock is None:
        return
    for cls in (mock._patch, mock._patch_dict):
        enter, leave = cls.__enter__, cls.__exit__

        def __enter__(self, enter=enter):
            out = enter(self)
            if not (getattr(self, "attribute", "") in ("stdout", "stderr") and self.getter() is sys):
                _PATCHES.append(_patch_name(self))  # printed output is carried back: that patch holds
            return out

        def __exit__(self, *exc, leave=leave):
            name = _patch_name(self)
            if name in _PATCHES:
                _PATCHES.remove(name)
            return leave(self, *exc)

        cls.__enter__, cls.__exit__ = __enter__, __exit__


def _patch_name(p) -> str:
    try:
        return f"{getattr(p.getter(), '__name__', '?')}.{p.attribute}" if hasattr(p, "getter") else "a dict"
    except Exception:  # noqa: BLE001 -- a target that no longer imports
        return "?"


def verdict(outcome: BaseException | None, chan: Channel, tests: list[str], caught: set[str]) -> dict:
    out = {"passed": False, "stage": "tests", "exception": "", "message": "", "test_line": "", "traceback": "",
           "calls": chan.calls, "synced": chan.synced}
    fault = chan.fault
    if fault is not None:
        return {**out, "status": fault.status, "exception": fault.exception, "message": str(fault),
                "test_line": fault.test_line, "traceback": fault.traceback}
    if outcome is None:
        return {**out, "passed": True, "status": "passed"}
    import traceback

    frames = []
    tb = outcome.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_filename in ("<tests>", "<setup>"):
            frames.append(tb)
        tb = tb.tb_next
    lines = [f'  File "{tb.tb_frame.f_code.co_filename}", line {tb.tb_lineno}, in {tb.tb_frame.f_code.co_name}\n'
             + (f"    {source_line(tests, tb.tb_lineno)}\n" if tb.tb_frame.f_code.co_filename == "<tests>" else "")
             for tb in frames]
    remote = getattr(outcome, "program_traceback", None)
    text = ("Traceback (most recent call last):\n" + "".join(lines)
            + (f"in the program's process:\n{remote.partition(chr(10))[2]}" if remote is not None
               else "".join(traceback.format_exception_only(type(outcome), outcome))))
    name = getattr(outcome, "program_type", type(outcome).__name__)
    test = next((tb for tb in reversed(frames) if tb.tb_frame.f_code.co_filename == "<tests>"), None)
    out.update(exception=name, message=str(outcome)[:500], traceback=text[-2000:],
               test_line=source_line(tests, test.tb_lineno) if test else "")
    if hasattr(outcome, "program_type") and name in caught:  # the tests meant to catch it
        return {**out, "status": "unsupported", "message": f"{out['message']}; the tests name {name}, which the "
                "program's exception never is here: it would steer the tests' loops (PEP 479)"}
    mine = name == "AssertionError" and remote is None  # the tests' own assertion, not the program's
    return {**out, "status": "failed" if mine else "error"}


def _bad_problem(what: str, e: BaseException) -> dict:
    where = f" (line {e.lineno})" if isinstance(e, SyntaxError) and e.lineno else ""
    return {"passed": False, "status": "bad_problem", "stage": what, "exception": type(e).__name__,
            "message": f"the problem's {what} {'does not compile' if isinstance(e, SyntaxError) else 'raised'}"
                       f"{where}: {str(e)[:300]}", "test_line": "", "traceback": "", "calls": 0, "synced": 0}


def judge(job: dict, chan: Channel) -> dict:
    """Run the job's tests against the program behind `chan`; the verdict as a dict."""
    g: dict = {"__name__": "__main__", "__builtins__": builtins}
    codes = []
    for what in ("setup", "tests"):
        try:
            codes.append(compile(job[what], f"<{what}>", "exec"))
        except (SyntaxError, ValueError) as e:  # ValueError: a NUL byte
            return _bad_problem(what, e)
    try:
        exec(codes[0], g)  # noqa: S102 -- the dataset's prompt: trusted code
    except Exception as e:  # noqa: BLE001 -- an import the checker lacks, a helper that fails at import
        return _bad_problem("setup", e)
    read, defined, caught, strings = (a | b for a, b in zip(*map(global_names, codes), strict=True))
    try:
        names, error = chan.first()
    except Fault:
        return verdict(None, chan, chan.tests, caught)
    if error is not None:
        return {"passed": False, "status": "error", "stage": "program", "exception": error["type"][:100],
                "message": error["message"][:500], "test_line": "", "traceback": error["traceback"], "calls": 0,
                "synced": 0}
    try:
        free = set(vars(builtins)) | defined
        bound = bind(g, chan, names, read - free, strings - free, job["entry_point"])
        guard = Guard(chan, g, {n: v for n, v in bound.items() if isinstance(v, Remote)})
        chan.guard, chan.budget = guard, guard.budget
        chan.namedtuple = lambda name, fields: _namedtuple(g, name, fields)
        exec(codes[1], g)  # noqa: S102 -- the dataset's tests: trusted code
        outcome = None
    except BaseException as e:  # noqa: BLE001 -- the tests' outcome, whatever it is
        outcome = e
    return verdict(outcome, chan, chan.tests, caught)


def _namedtuple(g: dict, name: str, fields: tuple[str, ...]):
    """The tests' or the setup's own namedtuple class of that name and fields, if they have one."""
    cls = g.get(name)
    ok = isinstance(cls, type) and issubclass(cls, tuple) and getattr(cls, "_fields", None) == fields
    return cls if ok else None


def serve_job(job_fd: int, send_fd: int, recv_fd: int) -> None:
    """One checker: the job from the trainer on `job_fd`, the program on the other two; the verdict
    goes back on `job_fd`."""
    job = wire.Reader(job_fd).next()
    signal.alarm(int(job["timeout_s"]) + 2)  # the trainer stops waiting at its deadline; this ends the work
    mb = job["memory_mb"] << 20
    resource.setrlimit(resource.RLIMIT_AS, (mb, mb))
    chan = Channel(send_fd, recv_fd, job["tests"].splitlines())
    _watch_patches()
    try:
        result = judge(job, chan)
    except BaseException as e:  # noqa: BLE001 -- a fault of the checker itself: reported, never a pass
        result = {"passed": False, "status": "checker_error", "stage": "checker", "exception": type(e).__name__,
                  "message": str(e)[:500], "test_line": "", "traceback": "", "calls": chan.calls, "synced": 0}
    os.close(send_fd)  # the program's side reads the end of the channel and exits
    wire.send(job_fd, wire.message(**{k: wire.encode(v) for k, v in result.items()}))


def zygote(ctl_fd: int) -> None:
    """Fork one checker per job the trainer sends on `ctl_fd` (a message with three descriptors);
    return when the trainer closes it."""
    import socket

    for name in ("collections", "copy", "dis", "functools", "heapq", "itertools", "math", "random", "re",
                 "string", "traceback", "unittest.mock"):  # what tests import, once for every checker forked here
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
