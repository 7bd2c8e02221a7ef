"""Plain numbers in free text, each with its exact value: numerals (with thousands separators),
decimals, fractions, LaTeX fractions, percentages and English number words; and the normalisation
every reader applies first (`normalize_math_text`: LaTeX, typography and symbol variants -> one
plain form). Values are `Fraction`s so 0.5 == 1/2 exactly.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from fractions import Fraction

Term = tuple[Fraction, int, int]  # c * sqrt(r) * pi^k: coefficient, square-free radicand, power of pi


@dataclass(frozen=True)
class Mention:
    """One number in a text; `values` holds every value it may stand for (50% -> {50, 1/2})."""

    start: int
    end: int
    values: frozenset[Fraction]
    kind: str  # "numeral", "decimal", "fraction", "latex_frac", "percent", "word", and the composite
    # forms: "word_frac", "over", "divided", "mixed", "power", "scientific", "repeating", "negative",
    # "below_zero";
    # "term" / "term_unsimplified" (irrational: `values` empty, `term` set)
    text: str
    places: int = 0  # digits after the decimal point (for rounded-decimal matches)
    term: Term | None = None


_TEXT_MACROS = re.compile(r"\\(?:text|textbf|textit|mathrm|mathbf|mbox|operatorname)\s*\{([^{}]*)\}")
_MINUS = "\u2212\u2013\u2012\ufe63\uff0d"
_VULGAR = {
    "½": "1/2",
    "⅓": "1/3",
    "⅔": "2/3",
    "¼": "1/4",
    "¾": "3/4",
    "⅕": "1/5",
    "⅖": "2/5",
    "⅗": "3/5",
    "⅘": "4/5",
    "⅙": "1/6",
    "⅚": "5/6",
    "⅛": "1/8",
    "⅜": "3/8",
    "⅝": "5/8",
    "⅞": "7/8",
}


def normalize_math_text(text: str) -> str:
    """LaTeX, typography and symbol variants -> one plain form (numbers stay where they were):
    unicode minus signs, vulgar fractions ("1½" -> "1 1/2"), `**` -> `^`, and radicals and pi in
    every spelling ("√3", "sqrt(3)", "square root of 3", "root 3", "π", "pi") -> `\\sqrt`, `\\pi`."""
    t = re.sub(f"[{_MINUS}]", "-", text)
    t = re.sub(f"[{''.join(_VULGAR)}]", lambda m: " " + _VULGAR[m.group(0)], t)
    t = re.sub(r"\\[dt]frac", r"\\frac", t)
    t = t.replace("\\left", "").replace("\\right", "")
    t = _TEXT_MACROS.sub(r" \1 ", t)
    t = t.replace("{,}", ",")
    t = re.sub(r"(?<=\d)(?:\\[,;: ]|[\u2009\u202f])(?=\d{3}(?!\d))", "", t)  # 1\,000 -> 1000
    t = t.replace("\\%", "%").replace("\\$", " ").replace("\\!", "")
    t = re.sub(r"\^\s*\{?\s*\\circ\s*\}?", "", t)
    t = re.sub(r"\\(?:cdot|times|ast)", " * ", t).replace("\\div", " / ").replace("**", "^")
    t = re.sub(r"\\[()\[\]]", " ", t)
    return _symbols(t).replace("$", " ")


def _symbols(t: str) -> str:
    t = t.replace("√", "\\sqrt ").replace("π", "\\pi ")
    t = re.sub(r"(?<!\\)\bsqrt\s*\(\s*([^()]+?)\s*\)", r"\\sqrt{\1}", t, flags=re.IGNORECASE)
    t = re.sub(r"(?<!\\)\bsqrt\b", r"\\sqrt", t, flags=re.IGNORECASE)
    # "root" only before a number: "the roots of the equation" stays words
    before_number = rf"\b(?:the\s+)?(?:square\s+)?root\s+(?:of\s+)?(?=\d|(?:{WORD})\b)"
    t = re.sub(before_number, r"\\sqrt ", t, flags=re.IGNORECASE)
    return re.sub(r"(?<!\\)\bpi\b", r"\\pi", t, flags=re.IGNORECASE)


# A sign is a "-" right before the digits that does not follow an operand: "x = -5", "(-5" and
# "is -5" are signs, "10-5", "10 -5" and "x -5" are subtractions (checked in `_signed`).
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

_ONES_TEXT = (
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen "
    "seventeen eighteen nineteen"
)
ONES = _ONES_TEXT.split()
_TENS = ["twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety"]
SCALES = {"hundred": 100, "thousand": 1_000, "million": 1_000_000, "billion": 1_000_000_000}
WORD_VALUES = {w: i for i, w in enumerate(ONES)} | {w: 20 + 10 * i for i, w in enumerate(_TENS)}
WORD = "|".join(sorted([*WORD_VALUES, *SCALES], key=len, reverse=True))
WORDS = re.compile(rf"\b(?:{WORD})\b(?:(?:\s+|-)(?:and\s+)?(?:{WORD})\b)*", re.IGNORECASE)


def sign_position(before: str) -> bool:
    """Whether a "-" after `before` is a sign: after nothing, a symbol that is no operand ("=", "(",
    ","), or a word of two letters or more ("is -7"); a number, a closing bracket, a one-letter
    variable or a LaTeX symbol ("\\pi -1") before it is an operand, so the "-" subtracts."""
    before = before.rstrip()
    if not before:
        return True
    last = re.search(r"[\\\w]+$", before)
    if last is None:
        return before[-1] not in ")]}"
    tok = last.group(0).lower()
    return tok.isalpha() and len(tok) >= 2 and tok not in WORD_VALUES and tok not in SCALES


def _signed(m: re.Match, value: Fraction) -> Fraction:
    if not m.group("sign"):
        return value
    return -value if sign_position(m.string[: m.start()]) else value


def _words_value(text: str) -> int:
    total, current = 0, 0
    for w in re.findall(r"[a-z]+", text.lower()):
        if w == "and":
            continue
        if w in WORD_VALUES:
            current += WORD_VALUES[w]
        elif w == "hundred":
            current = max(current, 1) * 100
        else:
            total += max(current, 1) * SCALES[w]
            current = 0
    return total + current


def number_value(tok: str) -> Fraction:
    """A numeral, a decimal, "a"/"an" (one) or number words."""
    tok = tok.strip().lower()
    if tok in ("a", "an"):
        return Fraction(1)
    if tok[0].isdigit() or tok[0] == ".":
        return Fraction(tok.replace(",", ""))
    return Fraction(_words_value(tok))


def plain_mentions(text: str) -> list[Mention]:
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
    for m in WORDS.finditer(text):
        value = Fraction(_words_value(m.group(0)))
        out.append(Mention(m.start(), m.end(), frozenset({value}), "word", m.group(0)))
    return out
