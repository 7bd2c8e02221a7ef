"""The `test_output` gate's knowledge: what the hidden tests of a code problem expect (the literal
values their asserts compare with), and where a hint states one. Tiny values (0, 1, True, None, "",
[], any <= 2 characters) count only where the hint states a result ("should return 0", "returns 1",
"== 0"), as the math gold_context gate does for short golds; larger ones count anywhere.
"""

from __future__ import annotations

import ast
import re
from fractions import Fraction
from typing import Any

from mentor_fast.tasks.numbers import find_numbers, normalize_math_text, outermost

_STATES_OUTPUT = re.compile(
    r"(?:\b(?:returns?|returning|returned|outputs?|prints?|printing|printed|gives?|giving|yields?|"
    r"evaluates?\s+to|expected|expects?|expecting|equals?|equal\s+to|produces?|answer|result)\b|==|->|=>|:)"
    r"(?:\s+(?:is|are|was|be|should\s+be|must\s+be|will\s+be|would\s+be|exactly|just|simply|always|then|"
    r"the\s+value|value|of))*\s*[`'\"(\[]?$",
    re.IGNORECASE,
)
_EMPTY_WORDS = {str: "string", list: "list", tuple: "tuple", dict: "dict(?:ionary)?", set: "set"}
MISSING = object()


def _has_call(node: ast.AST) -> bool:
    return any(isinstance(n, ast.Call) for n in ast.walk(node))


def literal(node: ast.AST) -> Any:
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return MISSING


def _expected(test: ast.AST) -> Any:
    """What an assert expects of the program: `f(x) == y` -> y, `f(x) is None` -> None,
    `abs(f(x) - y) < tol` -> y, `not f(x)` -> False, `f(x)` -> True."""
    if isinstance(test, ast.Compare) and len(test.ops) == 1:
        left, right, op = test.left, test.comparators[0], test.ops[0]
        if isinstance(op, (ast.Eq, ast.Is)) and _has_call(left) != _has_call(right):
            return literal(right if _has_call(left) else left)
        if (
            isinstance(op, (ast.Lt, ast.LtE))
            and isinstance(left, ast.Call)
            and getattr(left.func, "id", "") == "abs"
            and left.args
            and isinstance(left.args[0], ast.BinOp)
            and isinstance(left.args[0].op, ast.Sub)
        ):
            a, b = left.args[0].left, left.args[0].right
            return literal(b if _has_call(a) else a) if _has_call(a) != _has_call(b) else MISSING
        return MISSING
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not) and _has_call(test.operand):
        return False
    return True if isinstance(test, ast.Call) else MISSING


def expected_outputs(tests: str) -> list[Any]:
    """The literal values the tests' asserts expect, in order, duplicates dropped."""
    try:
        tree = ast.parse(tests)
    except SyntaxError:
        return []
    out: list[Any] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Assert):
            v = _expected(node.test)
            if v is not MISSING and not any(type(v) is type(o) and v == o for o in out):
                out.append(v)
    return out


def _number(v: Any) -> Fraction | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    try:
        return Fraction(repr(v)) if isinstance(v, float) else Fraction(v)
    except ValueError:  # inf, nan
        return None


def compact(text: str) -> str:
    return re.sub(r"\s+", "", text).replace('"', "'")


def _spans(hint: str, v: Any) -> tuple[str, list[tuple[int, int]], bool]:
    """(text searched, spans where `hint` writes the value v, whether v is tiny)."""
    num = _number(v)
    if num is not None:
        text = normalize_math_text(hint)
        spans = [(m.start, m.end) for m in outermost(find_numbers(text)) if num in m.values]
        return text, spans, len(repr(v)) <= 2
    if isinstance(v, bool) or v is None:
        flags = re.IGNORECASE if isinstance(v, bool) else 0
        return hint, [m.span() for m in re.finditer(rf"\b{v!r}\b", hint, flags)], True
    if isinstance(v, (str, list, tuple, dict, set)) and not v:
        forms = rf"{re.escape(repr(v))}|\"\"|\b(?:an?|the)\s+empty\s+{_EMPTY_WORDS[type(v)]}\b"
        return hint, [m.span() for m in re.finditer(forms, hint, re.IGNORECASE)], True
    if isinstance(v, str):
        s = v.strip()
        quoted = rf"['\"`]{re.escape(s)}['\"`]"
        if len(s) <= 3:  # "a", "yes", "ab" are words too: only quoted, and only where stated
            return hint, [m.span() for m in re.finditer(quoted, hint)], True
        bare = rf"(?<!\w){re.escape(s)}(?!\w)"
        return hint, [m.span() for m in re.finditer(f"{quoted}|{bare}", hint)], False
    if isinstance(v, (list, tuple, set, dict)):
        inner = compact(repr(v))[1:-1]
        text = compact(hint)
        spans = [m.span() for m in re.finditer(rf"[\[({{]{re.escape(inner)}[\])}}]", text)]
        return text, spans, False
    return hint, [], False


def in_question(v: Any, question: str) -> bool:
    return bool(question) and bool(_spans(question, v)[1])


def _states_output(text: str, start: int) -> bool:
    sentence = re.split(r"[.!?;\n]\s|\n", text[:start])[-1]
    return _STATES_OUTPUT.search(sentence.rstrip()) is not None or not text[:start].strip()


_LIST_MARKER = re.compile(r"\)\s")  # "Plan: 1) Keep ...": the number of a step, not a value


def stated_output(hint: str, outputs: tuple[Any, ...]) -> str | None:
    for v in outputs:
        text, spans, tiny = _spans(hint, v)
        for start, end in spans:
            if tiny and _LIST_MARKER.match(text, end):
                continue
            if not tiny or _states_output(text, start):
                return f"'{text[start:end]}' (a hidden test expects {v!r})"
    return None
