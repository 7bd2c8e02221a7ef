"""Numbers in free text: numerals (with thousands separators), decimals, fractions, LaTeX
fractions, percentages and English number words, each with its exact value.

The leak guard compares these values with the gold answer; the reference mentor reads step
results and failed attempts with them. Values are `Fraction`s so 0.5 == 1/2 exactly.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from fractions import Fraction


@dataclass(frozen=True)
class Mention:
    """One number in a text; `values` holds every value it may stand for (50% -> {50, 1/2})."""

    start: int
    end: int
    values: frozenset[Fraction]
    kind: str  # "numeral", "decimal", "fraction", "latex_frac", "percent", "word"
    text: str
    places: int = 0  # digits after the decimal point (for rounded-decimal matches)


_TEXT_MACROS = re.compile(r"\\(?:text|textbf|textit|mathrm|mathbf|mbox|operatorname)\s*\{([^{}]*)\}")


def normalize_math_text(text: str) -> str:
    """LaTeX and typography variants -> one plain form (numbers stay where they were)."""
    t = text.replace("\u2212", "-").replace("\u2013", "-")
    t = re.sub(r"\\[dt]frac", r"\\frac", t)
    t = t.replace("\\left", "").replace("\\right", "")
    t = _TEXT_MACROS.sub(r" \1 ", t)
    t = t.replace("{,}", ",")
    t = re.sub(r"(?<=\d)(?:\\[,;: ]|[\u2009\u202f])(?=\d{3}(?!\d))", "", t)  # 1\,000 -> 1000
    t = t.replace("\\%", "%").replace("\\$", " ").replace("\\!", "")
    t = re.sub(r"\^\s*\{?\s*\\circ\s*\}?", "", t)
    t = re.sub(r"\\(?:cdot|times|ast)", " * ", t).replace("\\div", " / ")
    t = re.sub(r"\\[()\[\]]", " ", t)
    return t.replace("$", " ")


# A sign is a "-" right before the digits that does not follow an operand: "x = -5" and "(-5" are
# signs, "10-5" and "10 -5" are subtractions (the second is checked in `_signed`).
_SIGN = r"(?P<sign>(?<![\w)\]}.])-)?"
_NUMERAL = re.compile(
    _SIGN + r"(?<![A-Za-z_\d.])(?P<num>\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+\.\d+|\d+|\.\d+)(?!\d)"
    r"(?P<pct>\s*(?:%|per\s?cent\b))?"
)
_FRACTION = re.compile(_SIGN + r"(?<![\w.])(?P<a>\d+)\s*/\s*(?P<b>\d+)(?![\d.])")
_LATEX_FRAC = re.compile(
    _SIGN + r"\\frac\s*(?:\{\s*(?P<a>\d+(?:\.\d+)?)\s*\}\s*\{\s*(?P<b>\d+(?:\.\d+)?)\s*\}"
    r"|(?P<a1>\d)\s*(?P<b1>\d))"
)

_ONES = [
    "zero",
    "one",
    "two",
    "three",
    "four",
    "five",
    "six",
    "seven",
    "eight",
    "nine",
    "ten",
    "eleven",
    "twelve",
    "thirteen",
    "fourteen",
    "fifteen",
    "sixteen",
    "seventeen",
    "eighteen",
    "nineteen",
]
_TENS = ["twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety"]
_SCALES = {"hundred": 100, "thousand": 1_000, "million": 1_000_000, "billion": 1_000_000_000}
_WORD_VALUES = {w: i for i, w in enumerate(_ONES)} | {w: 20 + 10 * i for i, w in enumerate(_TENS)}
_WORD = "|".join(sorted([*_WORD_VALUES, *_SCALES], key=len, reverse=True))
_WORDS = re.compile(rf"\b(?:{_WORD})\b(?:(?:\s+|-)(?:and\s+)?(?:{_WORD})\b)*", re.IGNORECASE)


def _signed(m: re.Match, value: Fraction) -> Fraction:
    if not m.group("sign"):
        return value
    before = m.string[: m.start()].rstrip()
    return value if before and (before[-1].isalnum() or before[-1] in ")]}") else -value


def _words_value(text: str) -> int:
    total, current = 0, 0
    for w in re.findall(r"[a-z]+", text.lower()):
        if w == "and":
            continue
        if w in _WORD_VALUES:
            current += _WORD_VALUES[w]
        elif w == "hundred":
            current = max(current, 1) * 100
        else:
            total += max(current, 1) * _SCALES[w]
            current = 0
    return total + current


def find_numbers(text: str) -> list[Mention]:
    """Every number in `text` (already normalised with `normalize_math_text`), in order.

    A fraction "3/4" is reported as a fraction and its parts as numerals: callers decide which
    reading matters (an integer gold treats "48/2" as an expression, not a stated answer).
    """
    out: list[Mention] = []
    for m in _NUMERAL.finditer(text):
        num = m.group("num").replace(",", "")
        value = _signed(m, Fraction(num))
        places = len(num.split(".")[1]) if "." in num else 0
        if m.group("pct"):
            out.append(
                Mention(m.start(), m.end(), frozenset({value, value / 100}), "percent", m.group(0), places)
            )
        else:
            kind = "decimal" if places else "numeral"
            out.append(Mention(m.start(), m.end(), frozenset({value}), kind, m.group(0), places))
    for regex, kind in ((_FRACTION, "fraction"), (_LATEX_FRAC, "latex_frac")):
        for m in regex.finditer(text):
            a = m.group("a") or m.groupdict().get("a1")
            b = m.group("b") or m.groupdict().get("b1")
            if Fraction(b) != 0:
                value = _signed(m, Fraction(a) / Fraction(b))
                out.append(Mention(m.start(), m.end(), frozenset({value}), kind, m.group(0)))
    for m in _WORDS.finditer(text):
        value = Fraction(_words_value(m.group(0)))
        out.append(Mention(m.start(), m.end(), frozenset({value}), "word", m.group(0)))
    return sorted(out, key=lambda x: (x.start, -x.end))


def parse_number(text: str) -> frozenset[Fraction] | None:
    """The values of `text` when it is exactly one number (e.g. "1,000", "\\frac{1}{2}", "50%")."""
    t = normalize_math_text(text).strip().rstrip(".").strip()
    for m in find_numbers(t):
        if m.start == 0 and m.end == len(t):
            return m.values
    return None


def result_after_equals(step: str) -> frozenset[Fraction] | None:
    """The number right after the last "=" of a worked step ("48/2 = $24 clips" -> {24})."""
    t = normalize_math_text(step)
    if "=" not in t:
        return None
    rhs = t.rsplit("=", 1)[1]
    nums = [m for m in find_numbers(rhs) if m.kind != "word"]
    return nums[0].values if nums else None


def unwrap_boxed(text: str) -> str:
    """`\\boxed{x}` -> `x` (outermost, brace-balanced); other text is returned unchanged."""
    i = text.find("\\boxed")
    if i < 0:
        return text
    j = text.find("{", i)
    if j < 0:
        return text
    depth = 0
    for k in range(j, len(text)):
        depth += {"{": 1, "}": -1}.get(text[k], 0)
        if depth == 0:
            return text[j + 1 : k]
    return text[j + 1 :]


def last_boxed(text: str) -> str | None:
    """Content of the last `\\boxed{...}` in a completion, or None."""
    i = text.rfind("\\boxed")
    return unwrap_boxed(text[i:]).strip() if i >= 0 else None
