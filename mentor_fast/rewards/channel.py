"""The checker's end of the channel to a program's process (runner.py is the other end).

`Channel` sends requests and reads answers as plain data (wire.py), and rebuilds every answer as the
checker's own objects; the first fault is kept (sticky) and decides the verdict, whatever the tests
do with the exception that carries it. `stand_in` turns the program's exception into one of the
checker's own classes, so that `except ValueError` in a test still means what it says.
"""

from __future__ import annotations

import builtins
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


def source_line(tests: list[str], lineno: int | None) -> str:
    """Line `lineno` of the tests' source, stripped ("" when there is none)."""
    return tests[lineno - 1].strip() if lineno and lineno <= len(tests) else ""


def _current_test_line(tests: list[str]) -> str:
    frame = sys._getframe(1)
    while frame is not None and frame.f_code.co_filename != "<tests>":
        frame = frame.f_back
    return source_line(tests, frame.f_lineno) if frame is not None else ""


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
