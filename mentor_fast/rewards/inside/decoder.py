"""Plain data rebuilt from a parsed frame: the other half of wire.py (whose docstring has the format).

Sandbox side and checker side alike (both processes load it; standard library only). Whatever the
sender wrote, the receiver ends up holding objects of its own, of exact built-in or standard-library
types, and no code of the sender runs. A container numbered in the shared `Table` is registered
before its contents are read, in the order the encoder numbered it, so references inside it (to
itself, to a sibling) resolve to the same object on this side.
"""

from __future__ import annotations

import builtins
import sys

from mentor_fast.rewards.inside.wire import (
    _FACTORIES,
    MAX_DEPTH,
    MAX_FRAME,
    MAX_HEX,
    MAX_ITEMS,
    Malformed,
    Table,
)

_NAMEDTUPLES: dict[tuple[str, tuple[str, ...]], type] = {}


def _collections():
    import collections

    return collections


def tag_of(obj: object) -> str:
    """The wire tag of a numbered container this side built."""
    t = type(obj)
    tag = {list: "l", set: "s", dict: "d", bytearray: "x"}.get(t)
    if tag is None:
        c = sys.modules.get("collections")
        tag = {c.deque: "q", c.OrderedDict: "O", c.Counter: "C", c.defaultdict: "D"}.get(t) if c else None
    return tag or "?"


def _int(node: object, what: str) -> int:
    if type(node) is int:
        return node
    if type(node) is list and len(node) == 2 and node[0] == "i":
        return _unhex("i", node[1])
    raise Malformed(f"{what} that is not an int")


def _empty(tag: str, body: object):
    """The empty container a definition with this tag starts as (None: not a mutable container tag)."""
    if tag in ("l", "s", "d", "x"):
        return {"l": list, "s": set, "d": dict, "x": bytearray}[tag]()
    if tag not in ("q", "O", "C", "D"):
        return None
    c = _collections()
    if tag == "q":
        if type(body) is not list or len(body) != 2 or not (body[0] is None or type(body[0]) is int and body[0] >= 0):
            raise Malformed("a deque that is not [maxlen, items]")
        return c.deque(maxlen=body[0])
    return c.OrderedDict() if tag == "O" else c.Counter() if tag == "C" else c.defaultdict()


class Decoder:
    """Parsed values -> objects, numbering mutable containers in `table` as the encoder did.
    namedtuple(typename, fields) may return a class the receiver prefers (the tests' own)."""

    def __init__(self, table: Table | None = None, namedtuple=None):
        self.table = table if table is not None else Table()
        self.namedtuple = namedtuple

    def value(self, node: object, depth: int = 0) -> object:
        t = type(node)
        if node is None or t is bool or t is int or t is float or t is str:
            return node  # the parser's own objects
        if t is not list or len(node) != 2 or type(node[0]) is not str:
            raise Malformed(f"a {t.__name__} where a value should be")
        if depth >= MAX_DEPTH:
            raise Malformed(f"a value nested deeper than {MAX_DEPTH}")
        tag, body = node
        if tag == "r":
            obj = self.table.objs.get(body) if type(body) is int else None
            if obj is None:
                raise Malformed("a reference to a container the sender does not hold")
            return obj
        if tag in ("i", "b"):
            return _unhex(tag, body)
        obj = _empty(tag, body)
        if obj is not None:
            self.table.add(obj)
            self.fill(obj, tag, body, depth)
            return obj
        return self._immutable(tag, body, depth)

    def sync(self, entry: object) -> object:
        """Apply [k, [tag, contents]]: container k's new contents, in place; returns the container."""
        if type(entry) is not list or len(entry) != 2 or type(entry[0]) is not int:
            raise Malformed("a change that is not [number, contents]")
        obj = self.table.objs.get(entry[0])
        node = entry[1]
        if obj is None or type(node) is not list or len(node) != 2 or node[0] != tag_of(obj):
            raise Malformed("a change to a container the sender does not hold, or of another type")
        self.fill(obj, node[0], node[1], 1)
        return obj

    def _items(self, body: object, depth: int) -> list:
        if type(body) is not list:
            raise Malformed(f"a container whose contents are a {type(body).__name__}")
        return [self.value(x, depth + 1) for x in body]

    def _pairs(self, body: object, depth: int) -> list[tuple]:
        if type(body) is not list or not all(type(p) is list and len(p) == 2 for p in body):
            raise Malformed("a mapping entry that is not a [key, value] pair")
        return [(self.value(k, depth + 1), self.value(v, depth + 1)) for k, v in body]

    def fill(self, obj, tag: str, body: object, depth: int) -> None:
        try:
            if tag == "l":
                obj[:] = self._items(body, depth)
            elif tag == "s":
                items = self._items(body, depth)
                obj.clear()
                obj.update(items)
            elif tag == "x":
                obj[:] = _unhex("b", body)
            elif tag == "q":
                if body[0] != obj.maxlen:
                    raise Malformed("a deque whose maxlen changed")
                items = self._items(body[1], depth)
                obj.clear()
                obj.extend(items)
            else:
                if tag == "D":
                    if type(body) is not list or len(body) != 2 or not (body[0] is None or body[0] in _FACTORIES):
                        raise Malformed("a defaultdict that is not [factory, pairs] with a builtin type as factory")
                    obj.default_factory = None if body[0] is None else getattr(builtins, body[0])
                    body = body[1]
                pairs = self._pairs(body, depth)
                dict.clear(obj) if tag != "O" else obj.clear()
                for k, v in pairs:
                    (dict.__setitem__ if tag != "O" else type(obj).__setitem__)(obj, k, v)
        except TypeError:
            raise Malformed(f"an unhashable key or element in a {type(obj).__name__}") from None

    def _immutable(self, tag: str, body: object, depth: int) -> object:
        if tag in ("t", "f", "g"):
            items = self._items(body, depth)
            if tag == "g" and len(items) > MAX_ITEMS:
                raise Malformed(f"an iterator of more than {MAX_ITEMS} items")
            try:
                return tuple(items) if tag == "t" else frozenset(items) if tag == "f" else iter(items)
            except TypeError:
                raise Malformed("an unhashable element in a frozenset") from None
        if type(body) is not list and tag != "M":
            raise Malformed(f"tag {tag[:20]!r} with a {type(body).__name__} body")
        if tag == "n":
            return self._namedtuple(body, depth)
        if tag == "c" and len(body) == 2 and all(type(x) in (int, float) for x in body):
            return complex(*body)
        if tag == "R" and len(body) == 3:
            start, stop, step = (_int(x, "a range bound") for x in body)
            if step == 0:
                raise Malformed("a range with step 0")
            return range(start, stop, step)
        if tag == "F" and len(body) == 2:
            num, den = _int(body[0], "a numerator"), _int(body[1], "a denominator")
            if den <= 0:
                raise Malformed("a Fraction whose denominator is not positive")
            from fractions import Fraction

            return Fraction(num, den)
        if tag == "M" and type(body) is str and len(body) <= MAX_HEX:
            import decimal

            try:
                return decimal.Decimal(body)
            except decimal.InvalidOperation:
                raise Malformed("a Decimal that does not parse") from None
        raise Malformed(f"unknown tag {tag[:20]!r} or a malformed body")

    def _namedtuple(self, body: list, depth: int) -> tuple:
        if len(body) != 3 or type(body[0]) is not str or not body[0].isidentifier() or type(body[1]) is not list:
            raise Malformed("a namedtuple that is not [typename, fields, items]")
        fields = tuple(body[1])
        if not all(type(f) is str and f.isidentifier() for f in fields) or len(set(fields)) != len(fields):
            raise Malformed("a namedtuple whose fields are not distinct identifiers")
        items = self._items(body[2], depth)
        if len(items) != len(fields):
            raise Malformed("a namedtuple with as many items as fields")
        cls = self.namedtuple(body[0], fields) if self.namedtuple else None
        if cls is None:
            cls = _NAMEDTUPLES.get((body[0], fields))
        if cls is None:
            try:
                cls = _collections().namedtuple(body[0], fields, rename=True)
            except (ValueError, TypeError):  # a keyword for a typename
                raise Malformed(f"a namedtuple typename {body[0][:50]!r} that cannot name a class") from None
            _NAMEDTUPLES[body[0], fields] = cls
        return tuple.__new__(cls, items)


def _unhex(tag: str, body: object) -> int | bytes:
    digits = body[1:] if type(body) is str and body[:1] == "-" and tag == "i" else body
    cap = MAX_HEX if tag == "i" else MAX_FRAME
    if type(digits) is not str or (tag == "i" and not digits) or len(digits) > cap or digits.strip("0123456789abcdef"):
        raise Malformed(f"tag {tag!r} needs lowercase hex digits")
    if tag == "i":
        return int(body, 16)
    if len(digits) % 2:
        raise Malformed("bytes with an odd number of hex digits")
    return bytes.fromhex(digits)


def value(node: object) -> object:
    """A parsed value -> the plain data it encodes (no identity kept across values)."""
    return Decoder().value(node)
