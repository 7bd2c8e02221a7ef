"""The program's side: what runs in its sandboxed process, after isolation (isolate.py, seccomp.py).

Sandbox side (standard library only). `main` runs the program's top level, sends the names it
defined, then answers the checker's requests until the checker closes the channel:

    {"call": name, "args": [v, ...], "kwargs": [[key, v], ...], "sync": [...], "limit": n}
        -> {"ok": v} | {"raise": exception} | {"refused": why}, with "sync", "held", "out", "err"
    {"get": name}   -> the name's value, answered the same way
    {"run": stdin}  -> the program bound to SOURCE (rewards/program.py) run as a script on that
                       input: {"ok": what it printed}

Values are plain data (wire.py, decoder.py). Mutable containers keep their identity across the
channel: both ends number them alike (`wire.Table`). A request's "sync" brings containers the
program holds up to date with what the tests did to them; an answer's "sync" carries what the call
did to the containers the program was given or holds (arguments changed in place), and "held" says
which of them the program still holds afterwards (a default argument, a global, a cache), so the
checker keeps those in step and forgets the rest. "out"/"err" carry what the call printed, so a
test that captures the output reads it. "limit" is the recursion depth the tests left the call
when they set one (sys.setrecursionlimit). An exception is {"type", "base" (its nearest built-in
class), "message", "args" (plain data, or null), "traceback"}.

Nothing here is trusted once the program runs: the program can reach this module through its
frames and replace any of it, or write on the channel itself. That buys it nothing. The checker
parses what arrives as plain data and decides alone; whatever the program sends is what some
program could have done. This process holds the channel's two ends and its own stdout and
stderr; no test, expected value or verdict ever reaches it.
"""

from __future__ import annotations

import builtins
import io
import os
import resource
import sys

from mentor_fast.rewards.inside import wire
from mentor_fast.rewards.inside.decoder import Decoder

_OUTPUT = 4 << 20  # characters of a script's printed output sent back


def main(spec_text: str, channel: list[int]) -> None:
    """The sandbox's entry point: isolate, limit, read the program from stdin, serve on `channel`
    (the descriptors to read requests from and to answer on)."""
    spec = wire.parse(spec_text)
    recv_fd, send_fd = channel
    if spec["isolate"]:
        from mentor_fast.rewards.inside import isolate

        isolate.build_root(spec)
    from mentor_fast.rewards.inside import seccomp

    try:
        seccomp.install()
    except OSError:
        if spec["isolate"]:  # isolation without the filter is not what the run says it is: the probe fails
            raise
    mb = 1 << 20
    for name, value in (("RLIMIT_AS", spec["memory_mb"] * mb), ("RLIMIT_CPU", spec["cpu_s"]),
                        ("RLIMIT_FSIZE", spec["file_mb"] * mb), ("RLIMIT_NPROC", spec["processes"]),
                        ("RLIMIT_NOFILE", spec["open_files"])):
        resource.setrlimit(getattr(resource, name), (value, value))
    program = sys.stdin.buffer.read().decode("utf-8", "replace")
    fd = os.open(os.devnull, os.O_RDONLY)
    os.dup2(fd, 0)
    os.close(fd)
    Server(recv_fd, send_fd).serve(program)
    _flush()
    os._exit(0)


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:  # the program may have closed or replaced them
            stream.flush()
        except BaseException:  # noqa: BLE001, S110 -- its own objects: anything may come out, and nothing matters
            pass


def _base(t: type) -> str:
    return next((c.__name__ for c in t.__mro__ if builtins.__dict__.get(c.__name__) is c), "BaseException")


def exception(e: BaseException) -> str:
    """An exception as JSON text (see the module docstring), its traceback without this file."""
    try:
        import traceback

        frames = [f for f in traceback.extract_tb(e.__traceback__) if f.filename != _OWN]
        tb = "".join(traceback.format_list(frames) + traceback.format_exception_only(type(e), e))
        info = (type(e).__name__, _base(type(e)), str(e), "Traceback (most recent call last):\n" + tb)
    except BaseException as inner:  # noqa: BLE001 -- a __str__ that raises, a replaced module
        info = (type(e).__name__, _base(type(e)), f"<unprintable: {type(inner).__name__}>", "")
    try:
        args = BaseException.__dict__["args"].__get__(e)
        if isinstance(e, OSError) and len(args) == 2 and (e.filename, e.filename2) != (None, None):
            args = (*args, e.filename, None, e.filename2)  # what OSError's constructor takes back
        args = wire.encode(args)
    except BaseException:  # noqa: BLE001 -- arguments that are not plain data: a test that reads them is told so
        args = "null"
    name, base, msg, tb = (str(x) if type(x) is str else "?" for x in info)
    return (f'{{"type":{wire.string(name[:100])},"base":{wire.string(base)},"message":{wire.string(msg[:500])},'
            f'"args":{args if len(args) < 1 << 16 else "null"},"traceback":{wire.string(tb[-2000:])}}}')


def _kind(value: object) -> tuple[str, str]:
    if isinstance(value, type(sys)):
        name = getattr(value, "__name__", "")
        return "module", name if type(name) is str else ""
    if isinstance(value, type):
        return "class", ""
    if callable(value):
        return "call", ""
    return ("value" if wire.plain_type(type(value)) else "object"), ""


class Server:
    def __init__(self, recv_fd: int, send_fd: int):
        self.reader, self.send_fd = wire.Reader(recv_fd), send_fd
        self.scope: dict = {"__name__": "__main__", "__builtins__": __builtins__}
        self.methods: dict[str, object] = {}  # entry points found on a `Solution` class
        self.table = wire.Table()  # the containers that crossed and that the program holds
        self.snaps: dict[int, str] = {}  # their contents when they last crossed (Encoder.form)
        self.tees: dict[int, io.TextIOWrapper] = {}

    def tee(self, saved, fd: int) -> io.TextIOWrapper:
        """The stream a call prints to (kept from call to call unless the program closed it)."""
        stream = self.tees.get(fd)
        if stream is None or stream.closed:
            stream = self.tees[fd] = _Tee.stream(saved, fd)
        stream.buffer.copy.clear()
        return stream

    def reply(self, **fields: str) -> None:
        _flush()  # what the program printed so far reaches the trainer before the checker moves on
        frame = wire.message(**fields)
        if len(frame) > wire.MAX_FRAME:
            frame = wire.message(refused=wire.string(f"an answer over {wire.MAX_FRAME} bytes"))
        wire.send(self.send_fd, frame)

    def serve(self, program: str) -> None:
        try:
            import linecache  # the program's lines in its tracebacks

            linecache.cache["<program>"] = (len(program), None, program.splitlines(True), "<program>")
            exec(compile(program, "<program>", "exec"), self.scope)  # noqa: S102 -- the sandbox's purpose
        except BaseException as e:  # noqa: BLE001 -- SystemExit included: the tests never ran
            self.scope.clear()  # a memory bomb's garbage, before the report needs memory
            self.reply(error=exception(e))
            return
        names = [(k, *_kind(v)) for k, v in list(self.scope.items())[:10000]
                 if type(k) is str and not k.startswith("__") and len(k) <= 200]
        listed = ",".join(f"[{wire.string(n)},{wire.string(k)},{wire.string(d[:200])}]" for n, k, d in names)
        self.reply(ready=f"[{listed}]")
        while True:
            request = self.reader.next()
            if request is None:
                return
            if "call" in request:
                self.call(request)
            elif "get" in request:
                self.get(request["get"])
            elif "run" in request:
                self.run(request["run"])

    def resolve(self, name: str) -> object:
        if name in self.scope:
            return self.scope[name]
        if name not in self.methods:  # LeetCode-style rows: the function is a method of class Solution
            solution = self.scope.get("Solution")
            if not isinstance(solution, type) or not hasattr(solution, name):
                raise NameError(f"name {name!r} is not defined")
            self.methods[name] = getattr(solution(), name)
        return self.methods[name]

    def _receive(self, request: dict) -> tuple[list, dict]:
        """The request's changes applied and its arguments rebuilt, each container snapshotted."""
        mark, dec = self.table.next, Decoder(self.table)
        changed = [id(dec.sync(entry)) for entry in request.get("sync", ())]
        args = [dec.value(a) for a in request.get("args", ())]
        kwargs = {k: dec.value(v) for k, v in request.get("kwargs", ())}
        enc = wire.Encoder(self.table)
        for k, obj in self.table.objs.items():
            if k >= mark or id(obj) in changed:
                self.snaps[k] = enc.form(obj)
        return args, kwargs

    def call(self, request: dict) -> None:
        args, kwargs = self._receive(request)
        out = err = None
        saved = sys.stdout, sys.stderr, sys.getrecursionlimit()
        try:
            fn = self.resolve(request["call"])
            _flush()
            out, err = self.tee(saved[0], 1), self.tee(saved[1], 2)
            sys.stdout, sys.stderr = out, err
            if type(request.get("limit")) is int:  # the tests' recursion limit, counted from the call
                sys.setrecursionlimit(_depth() + request["limit"])
            outcome = [True, fn(*args, **kwargs)]
        except BaseException as e:  # noqa: BLE001 -- the program's exception, whatever it is, goes back
            outcome = [False, exception(e)]
        finally:
            sys.setrecursionlimit(saved[2])
            printed = [_restore(out, "stdout", saved[0]), _restore(err, "stderr", saved[1])]
        roots = [*args, *kwargs.values()]
        del args, kwargs
        self.answer(outcome, roots, printed)

    def get(self, name: str) -> None:
        try:
            outcome = [True, self.scope[name]]
        except BaseException as e:  # noqa: BLE001 -- the program replaced its scope's lookup
            outcome = [False, exception(e)]
        self.answer(outcome, [], ["", ""], top=False)

    def answer(self, outcome: list, roots: list, printed: list[str], top: bool = True) -> None:
        """Reply with the value (or exception), the changes to held containers, and which are held.
        `outcome` is [ok, value or exception text], emptied here so that no frame holds the value."""
        fields = {k: wire.string(v) for k, v in zip(("out", "err"), printed, strict=True) if v}
        mark, enc = self.table.next, wire.Encoder(self.table)
        ok, value = outcome
        outcome.clear()
        what = ""
        try:
            if ok:
                fields = {"ok": enc.encode(value, top=top), **fields}
                roots.append(value)
            else:
                fields = {"raise": value, **fields}
            value, what = None, "an argument or a kept container changed to hold "
            sync = [f"[{k},{enc.body(obj)}]" for k, obj in list(self.table.objs.items())
                    if k < mark and enc.form(obj) != self.snaps.get(k)]
        except BaseException as e:  # noqa: BLE001 -- Refused, or a type whose name cannot be read
            self.table.rollback(mark)
            why = str(e) if isinstance(e, wire.Refused) else type(e).__name__
            self.reply(refused=wire.string(f"{what}{why}"[:200]))
            return
        held = retained(self.table, roots)
        del roots
        self.table.keep(held)
        self.snaps = {k: enc.form(obj) for k, obj in self.table.objs.items()}
        self.reply(**fields, sync=f"[{','.join(sync)}]", held=f"[{','.join(map(str, held))}]")

    def run(self, stdin: str) -> None:
        """The stdio program on `stdin`: what it printed, run as `__main__` in a fresh namespace (SystemExit ends
        it normally)."""
        source = self.scope.get("SOURCE")
        out = io.TextIOWrapper(io.BytesIO(), encoding="utf-8")
        saved = sys.stdin, sys.stdout
        sys.stdin, sys.stdout = io.TextIOWrapper(io.BytesIO(stdin.encode("utf-8", "replace")), encoding="utf-8"), out
        failure = None
        try:
            exec(compile(source, "<solution>", "exec"),  # noqa: S102 -- the sandbox's purpose
                 {"__name__": "__main__", "exit": sys.exit, "quit": sys.exit})
        except SystemExit:
            pass
        except BaseException as e:  # noqa: BLE001 -- goes back to the checker as the program's exception
            failure = e
        finally:
            sys.stdin, sys.stdout = saved
        try:
            out.flush()
            printed = out.buffer.getvalue()[:_OUTPUT].decode("utf-8", "replace")
        except BaseException as e:  # noqa: BLE001 -- the script closed its stdout
            failure = failure or e
        if failure is not None:
            self.reply(**{"raise": exception(failure)})
            return
        self.reply(ok=wire.string(printed))


def _depth() -> int:
    frame, n = sys._getframe(1), 0
    while frame is not None:
        frame, n = frame.f_back, n + 1
    return n


class _Tee(io.RawIOBase):
    """A call's stdout or stderr: written through to the process's own stream at once (the trainer's
    tails keep it, even when the call then crashes), and kept to send back with the answer."""

    def __init__(self, fd: int):
        self.fd, self.copy = fd, bytearray()

    @classmethod
    def stream(cls, saved, fd: int) -> io.TextIOWrapper:
        try:
            fd = saved.fileno()
        except BaseException:  # noqa: BLE001, S110 -- the program replaced the stream: the descriptor it had
            pass
        return io.TextIOWrapper(cls(fd), encoding="utf-8", errors="replace", write_through=True)

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:
        data = bytes(data)
        if len(self.copy) < _OUTPUT:
            self.copy += data[: _OUTPUT - len(self.copy)]
        try:
            wire.send(self.fd, data)
        except OSError:  # the stream is closed: what it printed still goes back to the tests
            pass
        return len(data)


def _restore(capture, name: str, saved) -> str:
    """Put the stream back (unless the program replaced it itself); returns what the call printed."""
    if capture is None:
        return ""
    if getattr(sys, name) is capture:
        setattr(sys, name, saved)
    try:
        capture.flush()
        return capture.buffer.copy.decode("utf-8", "replace")
    except BaseException:  # noqa: BLE001 -- the program closed or replaced what it was given
        return ""


_CHILDREN = (list, tuple, set, frozenset, dict)


def _children(obj: object):
    if isinstance(obj, dict):
        for k, v in dict.items(obj):
            yield k
            yield v
    elif isinstance(obj, _CHILDREN) or type(obj).__name__ == "deque":
        yield from obj


def retained(table: wire.Table, roots: list) -> list[int]:
    """The numbers of the containers the program still holds after a call, in order.

    A container is held when something other than this bookkeeping refers to it (the program's
    globals, a default argument, a cache, a closure), or when a held container contains it. The
    bookkeeping's references are counted exactly: the table's, `roots`' (the call's arguments and
    its result), one per occurrence inside another container reached here, and this function's
    own (the `nodes` dict, the loop variable, getrefcount's argument)."""
    nodes: dict[int, object] = {}
    edges: dict[int, int] = {}
    for r in roots:
        edges[id(r)] = edges.get(id(r), 0) + 1
    r = None
    todo = [*roots, *table.objs.values()]
    while todo:
        obj = todo.pop()
        if id(obj) in nodes or not (isinstance(obj, _CHILDREN) or type(obj).__name__ == "deque"):
            continue
        nodes[id(obj)] = obj
        for child in _children(obj):
            if isinstance(child, _CHILDREN) or type(child).__name__ == "deque":
                edges[id(child)] = edges.get(id(child), 0) + 1
                todo.append(child)
        child = None
    obj = None
    held: set[int] = set()
    for key in nodes:  # noqa: PLC0206 -- not .items(): its iterator keeps the last pair, a reference of its own
        node = nodes[key]
        own = 3 + edges.get(key, 0) + (key in table.ids)  # nodes, `node`, getrefcount's argument
        if sys.getrefcount(node) > own and key not in held:
            _mark(node, held)
    node = None
    return sorted(table.ids[key] for key in held if key in table.ids)


def _mark(obj: object, held: set[int]) -> None:
    todo = [obj]
    while todo:
        obj = todo.pop()
        if id(obj) not in held:
            held.add(id(obj))
            todo.extend(c for c in _children(obj) if isinstance(c, _CHILDREN) or type(c).__name__ == "deque")


_OWN = Server.serve.__code__.co_filename
