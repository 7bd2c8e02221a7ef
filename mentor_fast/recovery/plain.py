"""Typed records as plain data (dicts, lists, numbers, strings, None) and back, for checkpoints.

A method's state_dict holds only plain data, so a checkpoint names no class: renaming or moving one
does not break resume, and the state survives a JSON round trip. `to_plain` writes a dataclass as
the dict of its fields; `from_plain(cls, data)` rebuilds it from the field types (nested
dataclasses, `X | None`, lists, tuples, dicts, enums, Literals). A JSON round trip turns dict keys
into strings and tuples into lists; the field types turn them back.

Fields typed `Any` hold plain data, except a verifier's structured result (Rollout.verifier_detail),
which is stored with a stable name from DETAIL_TYPES, not its class path.
"""

from __future__ import annotations

import dataclasses
import enum
import importlib
import types
import typing
from typing import Any, TypeVar

T = TypeVar("T")

# stable name -> "module:Class" of a dataclass a field typed Any may hold (imported when met)
DETAIL_TYPES: dict[str, str] = {"code_result": "mentor_fast.rewards.code:CodeResult"}
_TAG = "__detail__"


def _detail_class(name: str) -> type:
    module, cls = DETAIL_TYPES[name].split(":")
    return getattr(importlib.import_module(module), cls)


def to_plain(obj: Any) -> Any:
    """obj as plain data: dataclasses as dicts of their fields, enums as their values, tuples as
    lists, dict keys as strings."""
    if isinstance(obj, enum.Enum):
        return obj.value
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        anys = {f.name for f in dataclasses.fields(obj) if f.type in ("Any", Any)}
        return {f.name: (_any_to_plain if f.name in anys else to_plain)(getattr(obj, f.name))
                for f in dataclasses.fields(obj)}
    if isinstance(obj, (list, tuple)):
        return [to_plain(x) for x in obj]
    if isinstance(obj, dict):
        return {_plain_key(k): to_plain(v) for k, v in obj.items()}
    if hasattr(obj, "tolist"):  # numpy scalars and arrays in a data row's columns
        return obj.tolist()
    raise TypeError(f"{type(obj).__name__} is not plain data and has no plain form")


def _plain_key(key: Any) -> str:
    if isinstance(key, enum.Enum):
        return str(key.value)
    if isinstance(key, (str, int)) and not isinstance(key, bool):
        return str(key)
    raise TypeError(f"dict key {key!r} ({type(key).__name__}) has no plain form")


def _any_to_plain(obj: Any) -> Any:
    """A value of a field typed Any: a registered detail type is tagged with its stable name."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        for name in DETAIL_TYPES:
            if isinstance(obj, _detail_class(name)):
                return {_TAG: name, **to_plain(obj)}
        raise TypeError(f"{type(obj).__name__} in a field typed Any: add it to recovery.plain.DETAIL_TYPES")
    return to_plain(obj)


_HINTS: dict[type, dict[str, Any]] = {}


def _hints(cls: type, ns: dict[str, Any] | None) -> dict[str, Any]:
    """cls's field types; `ns` names what its module imports only for type checking."""
    if cls not in _HINTS:
        _HINTS[cls] = typing.get_type_hints(cls, localns=ns)
    return _HINTS[cls]


def from_plain(tp: type[T] | Any, data: Any, ns: dict[str, Any] | None = None, **given: Any) -> T:
    """The value of type `tp` that `to_plain` wrote as `data`. A dataclass's fields named in `given`
    take those values (e.g. a record shared by several others, rebuilt once)."""
    if tp is Any:
        if isinstance(data, dict) and _TAG in data:
            return from_plain(_detail_class(data[_TAG]), {k: v for k, v in data.items() if k != _TAG})
        return data
    if dataclasses.is_dataclass(tp):
        hints = _hints(tp, ns)
        kwargs = {f.name: from_plain(hints[f.name], data[f.name], ns)
                  for f in dataclasses.fields(tp) if f.init and f.name in data and f.name not in given}
        return tp(**kwargs, **given)
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in args if a is not type(None)]
        if data is None:
            return None
        if len(inner) != 1:
            raise TypeError(f"cannot rebuild a value of {tp}: more than one type besides None")
        return from_plain(inner[0], data, ns)
    if origin is typing.Literal:
        return data
    if origin is list:
        return [from_plain(args[0], x, ns) for x in data]
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(from_plain(args[0], x, ns) for x in data)
        return tuple(from_plain(a, x, ns) for a, x in zip(args, data, strict=True))
    if origin is dict:
        key = int if args[0] is int else (lambda k: from_plain(args[0], k, ns))  # keys were written as strings
        return {key(k): from_plain(args[1], v, ns) for k, v in data.items()}
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return tp(data)
    if tp in (int, float, str, bool):
        return data  # as written: a float field holding an int stays an int, as in the run
    raise TypeError(f"cannot rebuild a value of {tp} from plain data")


def is_plain(data: Any) -> bool:
    """Whether `data` is made of dicts with string keys, lists, numbers, strings, booleans and None."""
    if data is None or type(data) in (bool, int, float, str):
        return True
    if type(data) is list:
        return all(is_plain(x) for x in data)
    if type(data) is dict:
        return all(type(k) is str and is_plain(v) for k, v in data.items())
    return False
