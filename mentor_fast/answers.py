"""The final answer of a math completion: brace-matched `\\boxed{...}` extraction.

One extractor for everyone who reads an answer: the math verifier (rewards/math.py), the MATH data
loader (data/jsonl.py), and the mentor, which must diagnose the answer the verifier scored and
unwrap a boxed gold the same way. A regex cannot find the end of `\\boxed{\\frac{1}{2}}`; this
counts braces instead. Escaped braces (`\\{`, `\\}`, LaTeX set braces) neither open nor close a
group. `\\fbox{...}` counts as a box. A box without braces (`\\boxed 5`) is not one.

Pure Python and imported by nothing heavy: it sits outside the rewards package so that reading an
answer never loads math-verify or the reward pools.
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


def unwrap_boxed(text: str) -> str:
    """A gold answer as the verifier reads it: the content of its last complete box, else the text."""
    boxed = last_boxed(text)
    return text if boxed is None else boxed
