"""The checker's end of the channel to a program's process (runner.py is the other end).

Checker side (standard library only: the zygote starts with `python -I -S`).

`Channel` sends requests and reads answers as plain data (wire.py, decoder.py) and rebuilds every
answer as the checker's own objects. Mutable containers keep their identity and stay in step with
the program's copies while the program holds them (runner.py's docstring has the protocol), so a
test that checks aliasing, identity or that an argument was (not) changed in place sees what it
would see in one process. The first fault is kept (sticky) and decides the verdict, whatever the
tests do with the exception that carries it.

`stand_in` turns the program's exception into one of the checker's own classes. An ordinary error
(ValueError, KeyError, a class of the program's derived from one) arrives as a subclass of the
built-in with the program's message and arguments, so `except ValueError` in a test means what it
says. What would steer the tests' control flow instead of reporting an error does not cross as
itself: StopIteration and StopAsyncIteration (which `map`, `zip`, `all` and `for` read as the end
of their data) arrive as a RuntimeError, as PEP 479 has it inside generators; SystemExit,
KeyboardInterrupt, GeneratorExit and other BaseExceptions end the tests with an error that no
`except` in them can catch.
"""

from __future__ import annotations

import _thread
import builtins
import sys

from mentor_fast.rewards.inside import wire
from mentor_fast.rewards.inside.decoder import Decoder

_KINDS = ("call", "class", "value", "module", "object")
_REPLY = {"ok", "raise", "refused"}
_EXTRA = {"sync", "held", "out", "err"}


class Fault(BaseException):
    """The verdict is decided; BaseException so that `except Exception` in a test does not catch it."""

    status = ""
    test_line = ""
    exception = ""  # the program's exception's type, for ProgramExit
    traceback = ""


class Forged(Fault):
    status = "forged_output"


class ChannelEnded(Fault):
    status = "channel_eof"


class Unsupported(Fault):
    """The tests need what the checker cannot give them faithfully."""

    status = "unsupported"


class ProgramExit(Fault):
    """The program raised SystemExit, KeyboardInterrupt, GeneratorExit or another BaseException."""

    status = "error"


def source_line(tests: list[str], lineno: int | None) -> str:
    """Line `lineno` of the tests' source, stripped ("" when there is none)."""
    return tests[lineno - 1].strip() if lineno and lineno <= len(tests) else ""


def _current_test_line(tests: list[str]) -> str:
    frame = sys._getframe(1)
    while frame is not None and frame.f_code.co_filename != "<tests>":
        frame = frame.f_back
    return source_line(tests, frame.f_lineno) if frame is not None else ""


class Channel:
    """The checker's end: requests out, answers in, the containers in step, and the first fault.
    `guard()` runs before each call (it fails the channel when the tests observe what cannot be
    honoured); `budget()` gives the recursion depth the tests left a call (None: untouched);
    `namedtuple(typename, fields)` may return the tests' own class for a namedtuple that arrives."""

    def __init__(self, send_fd: int, recv_fd: int, tests: list[str]):
        self.send_fd, self.reader, self.tests = send_fd, wire.Reader(recv_fd), tests
        self.fault: Fault | None = None
        self.calls = self.synced = 0
        self.table = wire.Table()  # the containers the program holds (and, during a call, its arguments)
        self.snaps: dict[int, str] = {}
        self.lock = _thread.allocate_lock()  # tests that call from threads: one request at a time
        self.guard = self.budget = lambda *a: None
        self.namedtuple = None
        self._classes: dict[tuple[str, type], type] = {}

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

    def _encode(self, enc: wire.Encoder, what: str, value: object) -> str:
        try:
            return enc.encode(value, top=True)
        except wire.Refused as e:
            self.fail(Unsupported(f"{what} is a {e}: it cannot cross to the program's process as plain data"))

    def _changes(self, enc: wire.Encoder) -> str:
        """What the tests did to the containers the program holds, since they last crossed."""
        out = []
        try:
            for k, obj in list(self.table.objs.items()):
                if enc.form(obj) != self.snaps.get(k):
                    out.append(f"[{k},{enc.body(obj)}]")
        except wire.Refused as e:
            self.fail(Unsupported(f"the tests put a {e} in a container the program holds: it cannot cross"))
        return f"[{','.join(out)}]"

    def call(self, name: str, args: tuple, kwargs: dict) -> object:
        with self.lock:
            if self.fault is not None:
                raise self.fault
            self.guard(name)
            enc = wire.Encoder(self.table)
            fields = {"call": wire.string(name), "sync": self._changes(enc)}
            enc_args = [self._encode(enc, f"argument {i} of {name}()", a) for i, a in enumerate(args)]
            kw = [f"[{wire.string(str(k))},{self._encode(enc, f'argument {k!r} of {name}()', v)}]"
                  for k, v in kwargs.items()]
            fields.update(args=f"[{','.join(enc_args)}]", kwargs=f"[{','.join(kw)}]")
            budget = self.budget()
            if budget is not None:
                fields["limit"] = str(budget)
            return self.result(f"{name}()", self.ask(wire.message(**fields)))

    def get(self, name: str) -> object:
        """The value of a name the program defined; a ProgramObject when it is not plain data."""
        with self.lock:
            reply = self.ask(wire.message(get=wire.string(name), sync=self._changes(wire.Encoder(self.table))))
            if set(reply) == {"refused"}:
                return ProgramObject(self, name, "object")
            return self.result(name, reply)

    def run(self, stdin: str) -> str:
        with self.lock:
            out = self.result("the program", self.ask(wire.message(run=wire.string(stdin))), stdio=True)
        if type(out) is not str:
            self.fail(Forged(f"the program's printed output came back as a {type(out).__name__}"))
        return out

    def result(self, what: str, reply: dict, stdio: bool = False) -> object:
        keys = set(reply)
        main = keys & _REPLY
        if len(main) != 1 or keys - _REPLY - _EXTRA or (not stdio and main != {"refused"} and "held" not in keys):
            self.fail(Forged(f"an answer for {what} that is not one of ok, raise, refused with its fields"))
        if main == {"refused"}:
            why = reply["refused"]
            why = why[:200] if type(why) is str else "?"
            done = "answered: " if why.startswith("an argument") else "returned a "
            self.fail(Unsupported(f"{what} {done}{why}; it cannot cross to the checker as plain data"))
        dec = Decoder(self.table, self.namedtuple)
        try:
            value = dec.value(reply["ok"]) if "ok" in keys else None
            self._apply(dec, reply)
        except wire.Malformed as e:
            self.fail(Forged(f"{what} answered with {e}"))
        if "raise" in keys:
            raise stand_in(self, self.exception_info(reply["raise"]), what)
        return value

    def _apply(self, dec: Decoder, reply: dict) -> None:
        """The answer's changes, the containers still held, and what the call printed."""
        sync, held = reply.get("sync", []), reply.get("held")
        if type(sync) is not list:
            raise wire.Malformed("changes that are not a list")
        for entry in sync:
            dec.sync(entry)
        self.synced += bool(sync)
        if held is not None:
            if type(held) is not list or not all(type(k) is int and k in self.table.objs for k in held):
                raise wire.Malformed("held containers that it never had")
            self.table.keep(held)
            enc = wire.Encoder(self.table)
            self.snaps = {k: enc.form(obj) for k, obj in self.table.objs.items()}
        for key, stream in (("out", sys.stdout), ("err", sys.stderr)):
            if key in reply:
                if type(reply[key]) is not str:
                    raise wire.Malformed(f"printed {key} that is not a str")
                stream.write(reply[key])  # the tests may have redirected it to read it

    def exception_info(self, node: object) -> dict:
        fields = ("type", "base", "message", "args", "traceback")
        if (type(node) is not dict or set(node) != set(fields)
                or any(type(node[k]) is not str for k in fields if k != "args")):
            self.fail(Forged("a malformed exception"))
        info = {k: node[k][:2000] for k in fields if k != "args"}
        base = builtins.__dict__.get(info["base"])
        if not (isinstance(base, type) and issubclass(base, BaseException)):
            self.fail(Forged(f"an exception whose base {info['base'][:50]!r} is no built-in exception"))
        try:
            args = None if node["args"] is None else Decoder().value(node["args"])
        except wire.Malformed:
            self.fail(Forged("an exception whose arguments are not plain data"))
        if args is not None and type(args) is not tuple:
            self.fail(Forged("an exception whose arguments are not a tuple"))
        return {**info, "base": base, "args": args}

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

    def exception_class(self, name: str, base: type, readable: bool) -> type:
        """The checker's class for the program's exception `name` derived from the built-in `base`;
        where its arguments could not cross (not `readable`), reading them is unsupported."""
        cls = self._classes.get((name, base, readable))
        if cls is None:
            attrs = {"__str__": lambda self: self.program_message, "__module__": "program"}
            if not readable:
                attrs["args"] = property(lambda e: self.fail(Unsupported(
                    f"the tests read the arguments of the program's {name}, which are not plain data")))
            cls = self._classes[name, base, readable] = type(name, (base,), attrs)
        return cls


class PEP479(RuntimeError):
    """The program raised StopIteration or StopAsyncIteration: here a RuntimeError, so that `map`,
    `zip`, `all` or a `for` loop in the tests does not read it as the end of their data."""


def stand_in(chan: Channel, info: dict, what: str) -> BaseException:
    """The program's exception as one of the checker's own (see the module docstring)."""
    name, base, message, args = info["type"], info["base"], info["message"], info["args"]
    name = name if name.isidentifier() else "Exception"
    if not issubclass(base, Exception):
        fault = ProgramExit(f"{what} raised {name}" + (f": {message}" if message else ""))
        fault.exception, fault.traceback = name, info["traceback"]
        chan.fail(fault)
    if issubclass(base, _STEERING):
        e = PEP479(f"{what} raised {name}" + (f": {message}" if message else ""))
        e.program_type = name
    else:
        cls = chan.exception_class(name, base, args is not None)
        try:
            e = cls(*args) if args is not None else cls(message)
        except BaseException:  # noqa: BLE001 -- a built-in whose constructor wants other arguments
            e = BaseException.__new__(cls)
            BaseException.__init__(e, *(args or ()))
        e.program_message = message
    e.program_traceback = info["traceback"]
    return e


_STEERING = (StopIteration, StopAsyncIteration, *(getattr(builtins, n) for n in ("ExceptionGroup",)
                                                   if hasattr(builtins, n)))  # 3.11+


class Remote:
    """A function of the program's, as the tests see it: calling it runs it in the program's
    process. Anything else the tests ask of it (its source, code, signature, defaults, __wrapped__,
    attributes) lives in that process: unsupported, never a stand-in's answer."""

    def __init__(self, chan: Channel, name: str):
        object.__setattr__(self, "_chan", chan)
        object.__setattr__(self, "_name", name)

    def __call__(self, *args, **kwargs):
        return self._chan.call(self._name, args, kwargs)

    __name__ = property(lambda self: self._name)

    def _refuse(self, attr: str = "__doc__"):
        self._chan.fail(Unsupported(f"the tests read {attr} of the program's {self._name}: its functions live in "
                                    "its process (only calls cross)"))

    __getattr__ = _refuse
    __doc__ = property(_refuse)

    def __setattr__(self, attr: str, value: object) -> None:
        self._refuse(attr)

    def __repr__(self) -> str:
        return f"<the program's function {self._name}>"


class ProgramObject:
    """A name the tests use that is bound to an object of the program's: any use is unsupported."""

    def __init__(self, chan: Channel, name: str, kind: str):
        self._chan, self._name, self._kind = chan, name, kind

    def _refuse(self, *args, **kwargs):
        self._chan.fail(Unsupported(f"the tests use the program's {self._kind} {self._name!r}: the program's "
                                    "objects stay in its process, only plain data crosses"))

    __call__ = __getattr__ = __getitem__ = __iter__ = __len__ = __bool__ = __contains__ = _refuse
    __eq__ = __ne__ = __lt__ = __le__ = __gt__ = __ge__ = __add__ = __sub__ = __mul__ = _refuse
    __hash__ = object.__hash__

    def __repr__(self) -> str:
        return f"<the program's {self._kind} {self._name}>"
