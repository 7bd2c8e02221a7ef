"""Spoken and composite number forms: "three quarters", "one and a half", "3 over 4", "1 1/2",
"minus seven", "7 below zero", "2 to the 10th", "2.5e3", "0.\\overline{3}", "one point five". Each is
reported beside its parts (numerals.py); `outermost` keeps one reading per span.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from fractions import Fraction

from mentor_fast.tasks.numbers.numerals import ONES, WORD, WORDS, Mention, number_value

_W1 = rf"(?:{WORD})"  # one number word
_N1 = rf"(?:\d+|{_W1})"  # a whole number in digits or one word
_ORDINAL_TEXT = "second third fourth fifth sixth seventh eighth ninth tenth eleventh twelfth"
_ORDINALS = {w: i for i, w in enumerate(_ORDINAL_TEXT.split(), 2)} | {"twentieth": 20}
_DENOM = {w: d for w, d in _ORDINALS.items() if 2 < d <= 12} | {"half": 2, "quarter": 4, "hundredth": 100}
_DENOM_PLURAL = {"halves": 2} | {f"{w}s": d for w, d in _DENOM.items() if w != "half"}
_DEN = "|".join(sorted([*_DENOM, *_DENOM_PLURAL], key=len, reverse=True))
# "a third" is also an ordinal ("a third step"): with "a" it is a fraction only before "of", a verb
# or the end of a clause ("a third of", "a third is red", "about a third.")
_FRACTION_END = r"\s+(?:of|is|are|was|were|left|remains?|each)\b|\s*(?:[.,;:!?)]|$)"
_WORD_FRAC = re.compile(
    rf"\b(?:(?P<w>{_N1})\s+and\s+)?(?P<n>\d+|an?|{_W1})[\s-]+(?P<d>{_DEN})\b(?P<end>(?={_FRACTION_END}))?",
    re.IGNORECASE,
)
_RATIO = re.compile(
    rf"(?<![\w.])(?P<a>{_N1})\s+(?P<op>over|divided\s+by|out\s+of)\s+(?P<b>{_N1})\b", re.IGNORECASE
)
_MIXED = re.compile(  # "1 1/2", "1\frac{1}{2}"
    r"(?<![\w./])(?P<w>\d+)\s+(?P<a>\d+)\s*/\s*(?P<b>\d+)(?![\d./])"
    r"|(?<![\w./])(?P<w2>\d+)\s*\\frac\s*\{\s*(?P<a2>\d+)\s*\}\s*\{\s*(?P<b2>\d+)\s*\}"
)
_ORD = "|".join(sorted(_ORDINALS, key=len, reverse=True))
_POWER = re.compile(
    r"(?<![\w.^])(?P<a>\d+)\s*\^\s*(?:\{\s*(?P<b>\d+)\s*\}|(?P<b2>\d+))"
    rf"|\b(?P<a3>{_N1})\s+to\s+the\s+(?:power\s+(?:of\s+)?)?(?P<b3>\d+|{_ORD}|{_W1})(?:st|nd|rd|th)?(?:\s+power)?\b"
    rf"|\b(?P<a4>{_N1})\s+(?P<sq>squared|cubed)\b",
    re.IGNORECASE,
)
_SCIENTIFIC = re.compile(
    r"(?<![\w.])(?P<a>\d+(?:\.\d+)?)(?:\s*\*\s*10\s*\^\s*\{?\s*(?P<e>-?\d+)\s*\}?|[eE](?P<e2>[+-]?\d+)\b)"
)
_REPEATING = re.compile(
    r"(?<![\w.])(?P<i>\d*)\.(?P<f>\d*)(?:\\overline\s*\{\s*(?P<r>\d+)\s*\}|\((?P<r2>\d+)\))"
)
_DIGIT_WORD = {w: i for i, w in enumerate(ONES[:10])} | {"oh": 0}
_DIG = "|".join(_DIGIT_WORD)
_POINT = re.compile(
    rf"(?P<i>{WORDS.pattern}|\b\d+)\s+point\s+(?P<f>(?:{_DIG})\b(?:[\s-]+(?:{_DIG})\b)*)", re.IGNORECASE
)
_BELOW_ZERO = re.compile(r"\s+(?:degrees?\s+)?below\s+zero\b", re.IGNORECASE)
# "minus 7" after these words is a value ("you get minus 7"); after anything else, a subtraction
_SIGN_WORDS = (
    "is are was were be been get gets got obtain obtains equals equal to gives give yields becomes "
    "become reach reaches makes comes exactly about just at of"
)
_MINUS_SIGN_WORDS = frozenset(_SIGN_WORDS.split())


def _word_frac(m: re.Match) -> tuple[Fraction, str] | None:
    n, d = number_value(m.group("n")), m.group("d").lower()
    singular = d in _DENOM
    if (n == 1) != singular or (
        m.group("n").lower() in ("a", "an") and d not in ("half", "quarter") and m.group("end") is None
    ):
        return None
    value = n / (_DENOM[d] if singular else _DENOM_PLURAL[d])
    if m.group("w"):
        if value >= 1:
            return None
        value += number_value(m.group("w"))
    return value, "word_frac"


def _ratio(m: re.Match) -> tuple[Fraction, str] | None:
    b = number_value(m.group("b"))
    kind = "over" if m.group("op").lower() == "over" else "divided"  # "divided by": an operation to do
    return (number_value(m.group("a")) / b, kind) if b else None


def _mixed(m: re.Match) -> tuple[Fraction, str] | None:
    s = "" if m.group("w") else "2"
    a, b = Fraction(m.group(f"a{s}")), Fraction(m.group(f"b{s}"))
    return (Fraction(m.group(f"w{s}")) + a / b, "mixed") if 0 < a < b else None


def _power(m: re.Match) -> tuple[Fraction, str] | None:
    a = number_value(m.group("a") or m.group("a3") or m.group("a4"))
    if m.group("sq"):
        b = 2 if m.group("sq").lower() == "squared" else 3
    else:
        tok = (m.group("b") or m.group("b2") or m.group("b3")).lower()
        b = _ORDINALS.get(tok) or int(number_value(tok))
    if b > 200 or (a > 1 and b * len(str(int(a))) > 60):  # no giant integers from "10^1000"
        return None
    return a**b, "power"


def _scientific(m: re.Match) -> tuple[Fraction, str] | None:
    e = int(m.group("e") or m.group("e2"))
    return (Fraction(m.group("a")) * Fraction(10) ** e, "scientific") if abs(e) <= 30 else None


def _repeating(m: re.Match) -> tuple[Fraction, str] | None:
    i, f, r = m.group("i") or "0", m.group("f"), m.group("r") or m.group("r2")
    shift = 10 ** len(f)
    value = Fraction(i) + Fraction(int(f or "0"), shift) + Fraction(int(r), (10 ** len(r) - 1) * shift)
    return value, "repeating"  # exact: never a rounded reading


def _point(m: re.Match) -> tuple[Fraction, str] | None:
    digits = "".join(str(_DIGIT_WORD[w.lower()]) for w in re.findall(r"[a-z]+", m.group("f"), re.IGNORECASE))
    return number_value(m.group("i")) + Fraction(int(digits), 10 ** len(digits)), "decimal"


Build = Callable[[re.Match], tuple[Fraction, str] | None]  # a match -> (its value, its kind), or None
_SPOKEN: tuple[tuple[re.Pattern, Build], ...] = (
    (_WORD_FRAC, _word_frac), (_RATIO, _ratio), (_MIXED, _mixed), (_POWER, _power),
    (_SCIENTIFIC, _scientific), (_REPEATING, _repeating), (_POINT, _point),
)  # fmt: skip


def _spoken(text: str, regex: re.Pattern, build: Build) -> list[Mention]:
    got = [(m, build(m)) for m in regex.finditer(text)]
    return [Mention(m.start(), m.end(), frozenset({b[0]}), b[1], m.group(0)) for m, b in got if b is not None]


def _minus_is_sign(before: str) -> bool:
    prev = re.search(r"[A-Za-z]+$", before)
    if prev:
        return prev.group(0).lower() in _MINUS_SIGN_WORDS
    return not before or (before[-1] not in ")]}" and not before[-1].isdigit())


def negations(text: str, found: list[Mention]) -> list[Mention]:
    """ "negative 7", "minus seven" (where a value, not a subtraction, is meant) and "7 below zero"."""
    longest: dict[int, Mention] = {}
    for m in found:
        if m.start not in longest or m.end > longest[m.start].end:
            longest[m.start] = m
    out = []
    for w in re.finditer(r"\b(negative|minus)\s+", text, re.IGNORECASE):
        m = longest.get(w.end())
        if m is not None and (w.group(1).lower() == "negative" or _minus_is_sign(text[: w.start()].rstrip())):
            out.append(_negated(m, text, w.start(), m.end, "negative"))
    for m in found:
        b = _BELOW_ZERO.match(text, m.end)
        if b and m.kind in ("numeral", "decimal", "word"):
            out.append(_negated(m, text, m.start, b.end(), "below_zero"))
    return out


def _negated(m: Mention, text: str, start: int, end: int, kind: str) -> Mention:
    return Mention(start, end, frozenset(-v for v in m.values), kind, text[start:end], m.places)


def spoken_mentions(text: str) -> list[Mention]:
    """Every spoken or composite form in `text` but the negations (which read the other mentions)."""
    return [m for regex, build in _SPOKEN for m in _spoken(text, regex, build)]
