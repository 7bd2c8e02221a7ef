"""The program's side: what runs in its sandboxed process, after isolation (isolate.py).

`main` runs the program's top level, sends the names it defined, then answers the checker's
requests until the checker closes the channel:

    {"call": name, "args": [v, ...], "kwargs": [[key, v], ...]}
        -> {"ok": v} (with "mutated": [i, ...] when arguments were changed in place)
         | {"raise": exception} | {"refused": why}
    {"get": name}   -> the name's value, answered the same way
    {"run": stdin}  -> the program bound to SOURCE (rewards/program.py) run as a script on that
                       input: {"ok": what it printed}

Values are plain data (wire.py); an exception is {"type", "message", "traceback"}.

Nothing here is trusted once the program runs: the program can reach this module through its
frames and replace any of it, or write on the channel itself. That buys it nothing. The checker
parses what arrives as plain data, compares in its own process and decides alone. This process
holds the channel's two ends and its own stdout and stderr; no test, expected value or verdict
ever reaches it.
"""

from __future__ import annotations

import io
import os
import resource
import sys

from mentor_fast.rewards import wire

_OUTPUT = 4 << 20  # characters of a script's printed output sent back
_MUTABLE = (list, dict, set, tuple)  # a tuple may hold a list


def main(spec_text: str, channel: list[int]) -> None:
    """The sandbox's entry point: isolate, limit, read the program from stdin, serve on `channel`
    (the descriptors to read requests from and to answer on)."""
    spec = wire.parse(spec_text)
    recv_fd, send_fd = channel
    if spec["isolate"]:
        from mentor_fast.rewards import isolate

        isolate.build_root(spec)
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


def exception(e: BaseException) -> str:
    """An exception as JSON text: its type's name, its message, its traceback without this file."""
    try:
        import traceback

        frames = [f for f in traceback.extract_tb(e.__traceback__) if f.filename != _OWN]
        tb = "".join(traceback.format_list(frames) + traceback.format_exception_only(type(e), e))
        info = (type(e).__name__, str(e), "Traceback (most recent call last):\n" + tb)
    except BaseException as inner:  # noqa: BLE001 -- a __str__ that raises, a replaced module
        info = (type(e).__name__, f"<unprintable: {type(inner).__name__}>", "")
    name, msg, tb = (str(x) if type(x) is str else "?" for x in info)
    return (f'{{"type":{wire.string(name[:100])},"message":{wire.string(msg[:500])},'
            f'"traceback":{wire.string(tb[-2000:])}}}')


def _kind(value: object) -> tuple[str, str]:
    if isinstance(value, type(sys)):
        name = getattr(value, "__name__", "")
        return "module", name if type(name) is str else ""
    if isinstance(value, type):
        return "class", ""
    if callable(value):
        return "call", ""
    return ("value" if wire.is_plain(value) else "object"), ""


class Server:
    def __init__(self, recv_fd: int, send_fd: int):
        self.reader, self.send_fd = wire.Reader(recv_fd), send_fd
        self.scope: dict = {"__name__": "__main__", "__builtins__": __builtins__}
        self.methods: dict[str, object] = {}  # entry points found on a `Solution` class

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
                self.call(request["call"], request["args"], request["kwargs"])
            elif "get" in request:
                self.answer(lambda name=request["get"]: self.scope[name])
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

    def call(self, name: str, args_node: list, kwargs_node: list) -> None:
        args = [wire.value(a) for a in args_node]
        kwargs = {k: wire.value(v) for k, v in kwargs_node}
        before = [wire.encode(a) if type(a) in _MUTABLE else None for a in args]
        self.answer(lambda: self.resolve(name)(*args, **kwargs), args, before)

    def answer(self, compute, args: list | None = None, before: list | None = None) -> None:
        try:
            result = compute()
        except BaseException as e:  # noqa: BLE001 -- the program's exception, whatever it is, goes back
            self.reply(**{"raise": exception(e)})
            return
        try:
            encoded = wire.encode(result)
        except BaseException as e:  # noqa: BLE001 -- Refused, or a type whose name cannot be read
            why = str(e) if isinstance(e, wire.Refused) else type(result).__name__
            self.reply(refused=wire.string(str(why)[:200]))
            return
        changed = [str(i) for i, (a, b) in enumerate(zip(args or (), before or ())) if b is not None and _changed(a, b)]
        if changed:
            self.reply(ok=encoded, mutated=f"[{','.join(changed)}]")
        else:
            self.reply(ok=encoded)

    def run(self, stdin: str) -> None:
        """The stdio program on `stdin`: its printed output, as the old in-process tests ran it."""
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


def _changed(arg: object, before: str) -> bool:
    try:
        return wire.encode(arg) != before
    except wire.Refused:
        return True


_OWN = Server.serve.__code__.co_filename
