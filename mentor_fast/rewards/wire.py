"""Plain data between a program's process and its checker: the one encoding both ends speak.

A value travels as JSON text. None, bool, int, float and str are JSON's own literals; anything
else is a two-element array [tag, payload]:

    ["i", "-1f"]          an int at or beyond 2**63, in hex
    ["b", "00ff"]         bytes, in hex
    ["l", [...]]  ["t", [...]]  ["s", [...]]  ["f", [...]]   list, tuple, set, frozenset
    ["d", [[key, value], ...]]                               dict

`encode` takes the exact built-in types only: a subclass of int, an object whose __eq__ says True,
a generator, a proxy... is `Refused` by its type's name. `value` rebuilds exact built-in types from
a parsed frame and raises `Malformed` on anything else (a JSON object where a value should be, an
unknown tag, an unhashable key, nesting past MAX_DEPTH), so whatever the other end sends, the
receiver ends up holding nothing but its own plain objects; no code of the sender runs.

Messages are one JSON object per line (`message`, `Reader`), at most MAX_FRAME bytes of ASCII.

Both processes load this file: the checker as a module, the sandbox from its compiled code
(rewards/sandbox.py), since the sandbox may not see the checkout. It uses the standard library
only, and parses with CPython's JSON accelerator `_json` directly: importing the `json` package
costs an interpreter about 10 ms at start.
"""

from __future__ import annotations

import math
import os
import sys

MAX_FRAME = 16 << 20  # bytes in one message
MAX_DEPTH = 100  # nested containers in one value
MAX_HEX = 1 << 16  # hex digits of one big int or one bytes value (32 KiB)
_BIG = 1 << 63
_PLAIN = (type(None), bool, int, float, str, bytes, list, tuple, set, frozenset, dict)
_TAGS = {"l": list, "t": tuple, "s": set, "f": frozenset}
_CONSTANTS = {"NaN": float("nan"), "Infinity": float("inf"), "-Infinity": float("-inf")}


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


def is_plain(x: object) -> bool:
    return type(x) in _PLAIN


def encode(value: object, depth: int = 0) -> str:
    """`value` as JSON text, or Refused when it (or anything inside it) is not plain data."""
    t = type(value)
    if value is None:
        return "null"
    if t is bool:
        return "true" if value else "false"
    if t is int:
        return int.__repr__(value) if -_BIG < value < _BIG else _hex("i", format(value, "x"))
    if t is float:
        if value - value == 0:
            return float.__repr__(value)
        return "NaN" if math.isnan(value) else "Infinity" if value > 0 else "-Infinity"
    if t is str:
        return _string(value)
    if t is bytes:
        return _hex("b", value.hex())
    if depth >= MAX_DEPTH:
        raise Refused(f"a value nested deeper than {MAX_DEPTH}")
    if t is dict:
        items = ",".join(f"[{encode(k, depth + 1)},{encode(v, depth + 1)}]" for k, v in dict.items(value))
        return f'["d",[{items}]]'
    tag = {list: "l", tuple: "t", set: "s", frozenset: "f"}.get(t)
    if tag is None:
        raise Refused(f"{t.__module__}.{t.__qualname__}" if t.__module__ != "builtins" else t.__qualname__)
    return f'["{tag}",[{",".join(encode(x, depth + 1) for x in value)}]]'


def _hex(tag: str, digits: str) -> str:
    if len(digits) > MAX_HEX:
        raise Refused(f"an int or bytes over {MAX_HEX} hex digits")
    return f'["{tag}","{digits}"]'


def parse(text: str) -> object:
    """JSON text -> the parser's dicts, lists, strs, ints, floats, bools and None (no code runs)."""
    try:
        node, end = _scan(text, 0)
    except (ValueError, StopIteration, RecursionError, KeyError, Malformed) as e:
        raise Malformed(f"not JSON ({type(e).__name__})") from None
    if end != len(text):
        raise Malformed(f"extra data after character {end}")
    return node


def value(node: object, depth: int = 0) -> object:
    """A parsed value (see `parse`) -> the plain data it encodes, built of exact built-in types."""
    t = type(node)
    if node is None or t is bool or t is int or t is float or t is str:
        return node  # the parser's own objects
    if t is not list or len(node) != 2 or type(node[0]) is not str:
        raise Malformed(f"a {t.__name__} where a value should be")
    if depth >= MAX_DEPTH:
        raise Malformed(f"a value nested deeper than {MAX_DEPTH}")
    tag, body = node
    if tag in ("i", "b"):
        return _unhex(tag, body)
    if type(body) is not list:
        raise Malformed(f"tag {tag!r} with a {type(body).__name__} body")
    if tag == "d":
        out: dict = {}
        for pair in body:
            if type(pair) is not list or len(pair) != 2:
                raise Malformed("a dict entry that is not a [key, value] pair")
            key = value(pair[0], depth + 1)
            try:
                out[key] = value(pair[1], depth + 1)
            except TypeError:
                raise Malformed(f"an unhashable dict key ({type(key).__name__})") from None
        return out
    kind = _TAGS.get(tag)
    if kind is None:
        raise Malformed(f"unknown tag {tag[:20]!r}")
    items = [value(x, depth + 1) for x in body]
    try:
        return items if kind is list else kind(items)
    except TypeError:
        raise Malformed(f"an unhashable element in a {kind.__name__}") from None


def _unhex(tag: str, body: object) -> int | bytes:
    digits = body[1:] if type(body) is str and body[:1] == "-" and tag == "i" else body
    if type(digits) is not str or not digits or len(digits) > MAX_HEX or digits.strip("0123456789abcdef"):
        raise Malformed(f"tag {tag!r} needs lowercase hex digits")
    if tag == "i":
        return int(body, 16)
    if len(digits) % 2:
        raise Malformed("bytes with an odd number of hex digits")
    return bytes.fromhex(digits)


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
