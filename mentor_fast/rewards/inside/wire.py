"""Plain data between a program's process and its checker: the one encoding both ends speak.

Sandbox side and checker side alike: both processes load this file from its compiled code
(rewards/sandbox.py's LOADER), so it imports the standard library only.

A value travels as JSON text. None, bool, int, float and str are JSON's own literals; anything
else is a two-element array [tag, payload]:

    ["i", "-1f"]  an int at or beyond 2**63, in hex      ["b", "00ff"]  bytes, in hex ("" is b"")
    ["c", [re, im]]  complex                              ["R", [start, stop, step]]  range
    ["F", [num, den]]  fractions.Fraction                 ["M", "1.10"]  decimal.Decimal
    ["t", [...]]  ["f", [...]]  tuple, frozenset          ["n", [typename, [field, ...], [...]]]  a namedtuple
    ["g", [...]]  an iterator (a generator, map, zip...), its items drawn by the sender
    ["l", [...]]  ["s", [...]]  ["d", [[key, value], ...]]  ["x", "00ff"]   list, set, dict, bytearray
    ["q", [maxlen, [...]]]  ["O", pairs]  ["C", pairs]  ["D", [factory, pairs]]  deque, OrderedDict,
                                                          Counter, defaultdict (factory: a builtin type's name)
    ["r", k]      the mutable container numbered k (see Table)

Mutable containers keep their identity across the channel: each side numbers them in the order
they first cross (`Table`), and a container that crosses again, or twice in one value, travels as
["r", k]. So `[[0] * 3] * 3` arrives with its three rows one object, a function that returns its
argument returns the caller's own object, and a container changed in place can be brought up to
date on the other side (runner.py, channel.py). Tuples and the other immutable values carry no
identity.

`Encoder` takes the exact types above only: a subclass (other than a namedtuple), an object whose
__eq__ says True, a function... is `Refused` by its type's name. `Decoder` rebuilds exact types
from a parsed frame and raises `Malformed` on anything else (a JSON object where a value should be,
an unknown tag, an unhashable key, a reference to a container the sender does not hold, nesting
past MAX_DEPTH), so the receiver ends up holding its own objects; no code of the sender runs.

Messages are one JSON object per line (`message`, `Reader`), at most MAX_FRAME bytes of ASCII. It
parses with CPython's JSON accelerator `_json` directly: importing the `json` package costs an
interpreter about 10 ms at start.
"""

from __future__ import annotations

import builtins
import math
import os
import sys

MAX_FRAME = 16 << 20  # bytes in one message
MAX_DEPTH = 100  # nested containers in one value
MAX_HEX = 1 << 16  # hex digits of one big int (a long decimal or hex int costs the parser more than linear time)
MAX_ITEMS = 1 << 20  # items drawn from one iterator
_BIG = 1 << 63
_CONSTANTS = {"NaN": float("nan"), "Infinity": float("inf"), "-Infinity": float("-inf")}
_FACTORIES = ("int", "float", "complex", "str", "bytes", "bool", "list", "tuple", "set", "frozenset", "dict")
_SCALARS = (type(None), bool, int, float, str)


class Refused(Exception):
    """A value that is not plain data; the message names its type."""


class Malformed(Exception):
    """Bytes that are not a well-formed frame of plain data."""


def _short_int(text: str) -> int:
    if len(text) > 20:  # the encoder writes big ints in hex; long decimals cost quadratic time before 3.11
        raise Malformed("a decimal int longer than 20 digits")
    return int(text)


class _Scanner:
    """The attributes _json.make_scanner reads (json.JSONDecoder's)."""

    strict = True
    object_hook = None
    object_pairs_hook = None
    parse_float = float
    parse_int = int if sys.version_info >= (3, 11) else staticmethod(_short_int)  # 3.11 caps int() at 4300 digits
    parse_constant = _CONSTANTS.__getitem__


try:
    from _json import encode_basestring_ascii as _string
    from _json import make_scanner

    _scan = make_scanner(_Scanner())
except ImportError:  # an interpreter without the accelerator: the package's own (slower to import)
    import json

    _string = json.encoder.encode_basestring_ascii
    _scan = json.JSONDecoder(parse_constant=_CONSTANTS.__getitem__).scan_once


def string(text: str) -> str:
    """A str as a JSON literal (ASCII, every other character escaped)."""
    return _string(text)


class Table:
    """The mutable containers that have crossed, numbered in the order they first crossed; both ends
    keep one and number alike. Entries that the program no longer holds are dropped (`keep`)."""

    __slots__ = ("ids", "next", "objs")

    def __init__(self) -> None:
        self.objs: dict[int, object] = {}
        self.ids: dict[int, int] = {}  # id(obj) -> its number; objs holds obj, so the id stays its own
        self.next = 0

    def add(self, obj: object) -> int:
        k = self.next
        self.next += 1
        self.objs[k] = obj
        self.ids[id(obj)] = k
        return k

    def keep(self, numbers) -> None:
        """Forget every container but `numbers`."""
        keep = set(numbers)
        for k in [k for k in self.objs if k not in keep]:
            del self.ids[id(self.objs.pop(k))]

    def rollback(self, mark: int) -> None:
        """Forget the containers numbered from `mark` on (an answer that could not be sent)."""
        for k in range(mark, self.next):
            obj = self.objs.pop(k, None)
            if obj is not None:
                del self.ids[id(obj)]
        self.next = mark


def _mutable_tags() -> dict[type, str]:
    tags = {list: "l", set: "s", dict: "d", bytearray: "x"}
    coll = sys.modules.get("collections")  # a program that never imported it holds none of these
    if coll is not None:
        tags.update({coll.deque: "q", coll.OrderedDict: "O", coll.Counter: "C", coll.defaultdict: "D"})
    return tags


def plain_type(t: type) -> bool:
    """Whether values of type `t` can cross (their contents may still not)."""
    if t in _SCALARS or t in (bytes, complex, range, tuple, frozenset) or t in _mutable_tags() or _is_namedtuple(t):
        return True
    fractions, decimal = sys.modules.get("fractions"), sys.modules.get("decimal")
    return (fractions is not None and t is fractions.Fraction) or (decimal is not None and t is decimal.Decimal)


def _is_namedtuple(t: type) -> bool:
    fields = t.__dict__.get("_fields")
    return t.__bases__ == (tuple,) and type(fields) is tuple and all(type(f) is str for f in fields)


def _well_named(t: type, n: int) -> bool:
    """A namedtuple the other side can rebuild: identifiers for its name and fields, one per item."""
    fields, name = t._fields, t.__name__
    ok = type(name) is str and name.isidentifier() and len(fields) == n == len(set(fields))
    return ok and all(f.isidentifier() for f in fields)


def _is_iterator(value: object) -> bool:
    try:
        return hasattr(type(value), "__next__") and iter(value) is value
    except BaseException:  # noqa: BLE001 -- an __iter__ that raises: not data
        return False


class Encoder:
    """Values -> JSON text, numbering mutable containers in `table`. With define=False (a snapshot
    to compare), a container not yet numbered is written "?" and numbered nowhere. Iterators are
    drawn (and so used up) only at the top of a value: `top=True`."""

    def __init__(self, table: Table | None = None, define: bool = True):
        self.table = table if table is not None else Table()
        self.define = define
        self.tags = _mutable_tags()

    def encode(self, value: object, top: bool = False) -> str:
        if top and _is_iterator(value):
            items = []
            for item in value:
                if len(items) >= MAX_ITEMS:
                    raise Refused(f"an iterator of more than {MAX_ITEMS} items")
                items.append(item)
            return f'["g",[{",".join(self._enc(x, 1) for x in items)}]]'
        return self._enc(value, 0)

    def body(self, obj: object) -> str:
        """A numbered container's tag and contents, as a definition reads: ["l", [...]]."""
        return self._container(obj, self.tags[type(obj)], 0)

    def form(self, obj: object) -> str:
        """The contents of numbered container `obj` with every container in it as a reference (or "?")."""
        saved, self.define = self.define, False
        try:
            return self._container(obj, self.tags[type(obj)], 0)
        finally:
            self.define = saved

    def _enc(self, v: object, depth: int) -> str:
        t = type(v)
        if v is None:
            return "null"
        if t is bool:
            return "true" if v else "false"
        if t is int:
            return int.__repr__(v) if -_BIG < v < _BIG else _hex("i", format(v, "x"), MAX_HEX)
        if t is float:
            return _float(v)
        if t is str:
            return _string(v)
        if t is bytes:
            return _hex("b", v.hex(), MAX_FRAME)
        if depth >= MAX_DEPTH:
            raise Refused(f"a value nested deeper than {MAX_DEPTH}")
        tag = self.tags.get(t)
        if tag is not None:
            k = self.table.ids.get(id(v))
            if k is not None:
                return f'["r",{k}]'
            if not self.define:
                return '"?"'
            self.table.add(v)
            return self._container(v, tag, depth)
        if t is tuple or t is frozenset:
            return f'["{"t" if t is tuple else "f"}",[{",".join(self._enc(x, depth + 1) for x in v)}]]'
        return self._other(v, t, depth)

    def _container(self, v, tag: str, depth: int) -> str:
        enc = self._enc
        if tag in ("l", "s"):
            return f'["{tag}",[{",".join(enc(x, depth + 1) for x in v)}]]'
        if tag == "x":
            return _hex("x", bytes(v).hex(), MAX_FRAME)
        if tag == "q":
            items = ",".join(enc(x, depth + 1) for x in v)
            return f'["q",[{"null" if v.maxlen is None else v.maxlen},[{items}]]]'
        items = type(v).items(v) if tag == "O" else dict.items(v)  # an OrderedDict's order is its own, not its dict's
        pairs = ",".join(f"[{enc(k, depth + 1)},{enc(x, depth + 1)}]" for k, x in items)
        if tag == "D":
            factory = v.default_factory
            if factory is not None and not (factory in map(builtins.__dict__.get, _FACTORIES)):
                raise Refused(f"a defaultdict whose default_factory is {_name(type(factory))}, not a builtin type")
            return f'["D",[{"null" if factory is None else _string(factory.__name__)},[{pairs}]]]'
        return f'["{tag}",[{pairs}]]'

    def _other(self, v: object, t: type, depth: int) -> str:
        if t is complex:
            return f'["c",[{_float(v.real)},{_float(v.imag)}]]'
        if t is range:
            return f'["R",[{self._enc(v.start, depth)},{self._enc(v.stop, depth)},{self._enc(v.step, depth)}]]'
        if _is_namedtuple(t) and _well_named(t, tuple.__len__(v)):
            items = ",".join(self._enc(x, depth + 1) for x in tuple.__iter__(v))
            fields = ",".join(map(_string, t._fields))
            return f'["n",[{_string(t.__name__)},[{fields}],[{items}]]]'
        fractions, decimal = sys.modules.get("fractions"), sys.modules.get("decimal")
        if fractions is not None and t is fractions.Fraction:
            return f'["F",[{self._enc(v.numerator, depth)},{self._enc(v.denominator, depth)}]]'
        if decimal is not None and t is decimal.Decimal:
            text = decimal.Decimal.__str__(v)
            if len(text) > MAX_HEX:
                raise Refused(f"a Decimal over {MAX_HEX} characters")
            return f'["M",{_string(text)}]'
        raise Refused("an iterator inside a value (only a value that is itself an iterator is drawn)"
                      if _is_iterator(v) else _name(t))


def _name(t: type) -> str:
    module, name = getattr(t, "__module__", "?"), getattr(t, "__qualname__", "?")
    return name if module == "builtins" else f"{module}.{name}"


def _float(v: float) -> str:
    if v - v == 0:
        return float.__repr__(v)
    return "NaN" if math.isnan(v) else "Infinity" if v > 0 else "-Infinity"


def _hex(tag: str, digits: str, cap: int) -> str:
    if len(digits) > cap:
        raise Refused(f"an int or bytes over {cap} hex digits")
    return f'["{tag}","{digits}"]'


def encode(value: object) -> str:
    """`value` as JSON text with no identity kept across values; Refused when it is not plain data."""
    return Encoder().encode(value)


def parse(text: str) -> object:
    """JSON text -> the parser's dicts, lists, strs, ints, floats, bools and None (no code runs)."""
    try:
        node, end = _scan(text, 0)
    except (ValueError, StopIteration, RecursionError, KeyError, Malformed) as e:
        raise Malformed(f"not JSON ({type(e).__name__})") from None
    if end != len(text):
        raise Malformed(f"extra data after character {end}")
    return node


def message(**fields: str) -> bytes:
    """One frame: a JSON object of `fields`, each already JSON text (`encode`, `string`, ...)."""
    return ("{" + ",".join(f'"{k}":{v}' for k, v in fields.items()) + "}\n").encode("ascii")


def send(fd: int, frame: bytes) -> None:
    view = memoryview(frame)
    while view:
        view = view[os.write(fd, view):]


class Reader:
    """Frames from a file descriptor: `next()` -> the next message (a dict), or None at the end."""

    def __init__(self, fd: int):
        self.fd = fd
        self.buf = bytearray()
        self._seen = 0  # bytes of buf already searched for a newline

    def next(self) -> dict | None:
        while True:
            i = self.buf.find(b"\n", self._seen)
            if i >= 0:
                line = bytes(self.buf[:i])
                del self.buf[: i + 1]
                self._seen = 0
                return _message(line)
            self._seen = len(self.buf)
            if len(self.buf) > MAX_FRAME:
                raise Malformed(f"a frame over {MAX_FRAME} bytes")
            chunk = os.read(self.fd, 1 << 16)
            if not chunk:
                if self.buf:
                    raise Malformed("the channel ended inside a frame")
                return None
            self.buf += chunk


def _message(line: bytes) -> dict:
    if len(line) > MAX_FRAME:
        raise Malformed(f"a frame over {MAX_FRAME} bytes")
    try:
        text = line.decode("ascii")
    except UnicodeDecodeError:
        raise Malformed("a frame that is not ASCII") from None
    node = parse(text)
    if type(node) is not dict:
        raise Malformed(f"a frame that is a {type(node).__name__}, not a message")
    return node
