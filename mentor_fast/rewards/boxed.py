"""Brace-matched `\\boxed{...}` extraction, shared by the math verifier and the MATH data loader.

A regex cannot find the end of `\\boxed{\\frac{1}{2}}`; this counts braces instead. Escaped braces
(`\\{`, `\\}`, LaTeX set braces) do not open or close a group. Pure Python, no imports of note, so
the data package can use it without loading math-verify.
"""

from __future__ import annotations

import re

_BOXED_RE = re.compile(r"\\(?:boxed|fbox)\s*\{")


def _group_end(text: str, start: int) -> int | None:
    """Index of the `}` closing the group whose content starts at `start`, or None if unbalanced."""
    depth = 1
    i = start
    n = len(text)
    while i < n:
        ch = text[i]
        if ch == "\\":
            i += 2  # skip the escaped character (\{, \}, \\)
            continue
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return i
        i += 1
    return None


def boxed_contents(text: str) -> list[str]:
    """Contents of every complete `\\boxed{...}` / `\\fbox{...}` in order of their start."""
    out = []
    for m in _BOXED_RE.finditer(text):
        end = _group_end(text, m.end())
        if end is not None:
            out.append(text[m.end() : end])
    return out


def last_boxed(text: str) -> str | None:
    """Content of the last complete `\\boxed{...}` (by start position), stripped; None if there is none.

    An unclosed trailing `\\boxed{\\frac{1}{` (a truncated completion) is not complete, so an earlier
    complete box wins; nested boxes give the innermost, since it starts last.
    """
    for m in reversed(list(_BOXED_RE.finditer(text))):
        end = _group_end(text, m.end())
        if end is not None:
            return text[m.end() : end].strip()
    return None


def has_boxed(text: str) -> bool:
    """Whether the text tries to box anything (complete or not)."""
    return _BOXED_RE.search(text) is not None
