"""Tolerant parsing of a model's replies: the first JSON object in a reply, and a hint in <hint> tags."""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Callable, Iterator
from typing import Any


def _scan(text: str, may_open: Callable[[], bool] = lambda: True) -> Iterator[tuple[int, str, bool]]:
    """(index, char, inside a quoted string) per character; a quote opens a string only when
    may_open() says so at that point (evaluated lazily, so a caller's loop state can decide)."""
    quote, escape = "", False
    for i, ch in enumerate(text):
        if quote:
            closing = not escape and ch == quote
            escape = not escape and ch == "\\"
            yield i, ch, True
            if closing:
                quote = ""
        elif ch in "\"'" and may_open():
            quote = ch
            yield i, ch, True
        else:
            yield i, ch, False


def _balanced_objects(text: str) -> list[str]:
    """Every brace-balanced {...} span, outermost first, skipping braces inside strings (a quote
    outside any object, like the apostrophe in "here's", opens nothing)."""
    spans, start, depth = [], -1, 0
    for i, ch, quoted in _scan(text, lambda: depth > 0):  # noqa: B023 (reads the current depth on purpose)
        if quoted:
            continue
        if ch == "{":
            if depth == 0:
                start = i
            depth += 1
        elif ch == "}" and depth > 0:
            depth -= 1
            if depth == 0:
                spans.append(text[start : i + 1])
    return spans


_JSON_WORDS = {"true": "True", "false": "False", "null": "None"}


def _python_literals(text: str) -> str:
    """true/false/null -> True/False/None outside strings (for ast.literal_eval)."""
    quoted = [q for _, _, q in _scan(text)]
    return re.sub(r"\b(?:true|false|null)\b",
                  lambda m: m.group(0) if quoted[m.start()] else _JSON_WORDS[m.group(0)], text)


def _loads(candidate: str) -> Any:
    no_trailing = re.sub(r",\s*([}\]])", r"\1", candidate)
    for text in (candidate, no_trailing):
        try:
            return json.loads(text, strict=False)
        except json.JSONDecodeError:
            pass
    try:  # single quotes, Python literals
        return ast.literal_eval(_python_literals(no_trailing))
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return None


def parse_json_object(text: str | None) -> dict[str, Any] | None:
    """The first JSON object in a model reply: code fences, text around it, trailing commas,
    single quotes and Python literals are tolerated. None when there is no usable object."""
    if not text:
        return None
    text = re.sub(r"```[A-Za-z0-9]*", "", text)
    for candidate in _balanced_objects(text):
        obj = _loads(candidate)
        if isinstance(obj, dict):
            return obj
    return None


def parse_hint(text: str | None) -> str | None:
    """The hint inside <hint>...</hint>; a reply without tags counts when it is plain text."""
    if not text:
        return None
    m = re.search(r"<hint>(.*?)(?:</hint>|$)", text, re.DOTALL | re.IGNORECASE)
    hint = m.group(1) if m else re.sub(r"^\s*hint\s*:", "", text, flags=re.IGNORECASE)
    hint = hint.strip().strip('"').strip()
    return hint or None
