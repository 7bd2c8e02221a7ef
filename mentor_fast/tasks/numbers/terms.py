"""Irrational terms c * sqrt(r) * pi^k ("2\\sqrt{3}", "two root three", "pi/2", "\\frac{\\pi}{2}")
in one canonical form, r square-free.
"""

from __future__ import annotations

import math
import re
from fractions import Fraction

from mentor_fast.tasks.numbers.numerals import WORD, Mention, Term, number_value, sign_position

_W1 = rf"(?:{WORD})"  # one number word
_TNUM = rf"(?:\d+(?:\.\d+)?|{_W1})"


def _body(s: str) -> str:
    """coefficient? radical? pi? (at least one of the last two is checked by the caller)."""
    return (
        rf"(?:(?P<c{s}>{_TNUM})\s*(?:\*\s*|times\s+)?)?"
        rf"(?:\\sqrt\s*(?:\{{\s*(?P<r{s}>\d+|{_W1})\s*\}}|(?P<q{s}>\d+|{_W1})(?![\d.])))?"
        rf"\s*(?:\*\s*)?(?P<pi{s}>\\pi\b)?"
    )


_TERM = re.compile(
    rf"(?<![\w.])(?P<sign>-\s*)?(?:\\frac\s*\{{\s*{_body('1')}\s*\}}\s*\{{\s*(?P<d1>\d+)\s*\}}"
    rf"|{_body('2')}(?:\s*(?:/|\bover\b|\bdivided\s+by\b)\s*(?P<d2>\d+|{_W1})(?![\d.]))?)",
    re.IGNORECASE,
)


def _square_free(n: int) -> tuple[int, int]:
    """n = s^2 * r with r square-free -> (s, r)."""
    s, k = 1, 2
    while k * k <= n:
        while n % (k * k) == 0:
            n, s = n // (k * k), s * k
        k += 1
    return s, n


def find_terms(text: str) -> list[Mention]:
    """Irrational terms c * sqrt(r) * pi^k in `text` (normalised), in canonical form (r square-free:
    "\\sqrt{12}" is 2 sqrt(3), kind "term_unsimplified": an expression to simplify)."""
    out = []
    for m in _TERM.finditer(text):
        s = "1" if m.group("d1") else "2"
        c, r, pi = m.group(f"c{s}"), m.group(f"r{s}") or m.group(f"q{s}"), m.group(f"pi{s}")
        d = m.group(f"d{s}")
        rad = number_value(r) if r else Fraction(1)
        den = number_value(d) if d else Fraction(1)
        if not (r or pi) or den == 0 or rad.denominator != 1 or not 0 < rad <= 10**6:
            continue
        root, free = _square_free(int(rad))
        if free == 1 and not pi:
            continue  # rational ("\\sqrt{16}")
        sign = -1 if m.group("sign") and sign_position(text[: m.start()]) else 1
        coef = sign * (number_value(c) if c else Fraction(1)) * root / den
        kind, term = "term_unsimplified" if root != 1 else "term", (coef, free, int(bool(pi)))
        out.append(Mention(m.start(), m.end(), frozenset(), kind, m.group(0).strip(), term=term))
    return out


def term_value(term: Term) -> float:
    coef, rad, pi = term
    return float(coef) * math.sqrt(rad) * math.pi**pi
