"""Numbers in free text: numerals (with thousands separators), decimals, fractions, LaTeX
fractions, percentages and English number words, each with its exact value; their spoken and
composite forms ("three quarters", "one and a half", "3 over 4", "1 1/2", "minus seven", "7 below
zero", "2 to the 10th", "2.5e3", "0.\\overline{3}", "one point five"); and irrational terms
c * sqrt(r) * pi^k ("2\\sqrt{3}", "two root three", "pi/2", "\\frac{\\pi}{2}") in one canonical form.

The leak guard compares these values with the gold answer; the reference mentor reads step
results and failed attempts with them. Values are `Fraction`s so 0.5 == 1/2 exactly. A composite
mention ("three quarters") is reported beside its parts ("three"): callers that want one reading
per span keep the `outermost` ones.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
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
    before_number = rf"\b(?:the\s+)?(?:square\s+)?root\s+(?:of\s+)?(?=\d|(?:{_WORD})\b)"
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
_ONES = _ONES_TEXT.split()
_TENS = ["twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety"]
_SCALES = {"hundred": 100, "thousand": 1_000, "million": 1_000_000, "billion": 1_000_000_000}
_WORD_VALUES = {w: i for i, w in enumerate(_ONES)} | {w: 20 + 10 * i for i, w in enumerate(_TENS)}
_WORD = "|".join(sorted([*_WORD_VALUES, *_SCALES], key=len, reverse=True))
_WORDS = re.compile(rf"\b(?:{_WORD})\b(?:(?:\s+|-)(?:and\s+)?(?:{_WORD})\b)*", re.IGNORECASE)


def _sign_position(before: str) -> bool:
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
    return tok.isalpha() and len(tok) >= 2 and tok not in _WORD_VALUES and tok not in _SCALES


def _signed(m: re.Match, value: Fraction) -> Fraction:
    if not m.group("sign"):
        return value
    return -value if _sign_position(m.string[: m.start()]) else value


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


def _value(tok: str) -> Fraction:
    """A numeral, a decimal, "a"/"an" (one) or number words."""
    tok = tok.strip().lower()
    if tok in ("a", "an"):
        return Fraction(1)
    if tok[0].isdigit() or tok[0] == ".":
        return Fraction(tok.replace(",", ""))
    return Fraction(_words_value(tok))


def _plain(text: str) -> list[Mention]:
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
    return out


# ---------------------------------------------------------------- spoken and composite forms
_W1 = rf"(?:{_WORD})"  # one number word
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
_DIGIT_WORD = {w: i for i, w in enumerate(_ONES[:10])} | {"oh": 0}
_DIG = "|".join(_DIGIT_WORD)
_POINT = re.compile(
    rf"(?P<i>{_WORDS.pattern}|\b\d+)\s+point\s+(?P<f>(?:{_DIG})\b(?:[\s-]+(?:{_DIG})\b)*)", re.IGNORECASE
)
_BELOW_ZERO = re.compile(r"\s+(?:degrees?\s+)?below\s+zero\b", re.IGNORECASE)
# "minus 7" after these words is a value ("you get minus 7"); after anything else, a subtraction
_SIGN_WORDS = (
    "is are was were be been get gets got obtain obtains equals equal to gives give yields becomes "
    "become reach reaches makes comes exactly about just at of"
)
_MINUS_SIGN_WORDS = frozenset(_SIGN_WORDS.split())


def _word_frac(m: re.Match) -> tuple[Fraction, str] | None:
    n, d = _value(m.group("n")), m.group("d").lower()
    singular = d in _DENOM
    if (n == 1) != singular or (
        m.group("n").lower() in ("a", "an") and d not in ("half", "quarter") and m.group("end") is None
    ):
        return None
    value = n / (_DENOM[d] if singular else _DENOM_PLURAL[d])
    if m.group("w"):
        if value >= 1:
            return None
        value += _value(m.group("w"))
    return value, "word_frac"


def _ratio(m: re.Match) -> tuple[Fraction, str] | None:
    b = _value(m.group("b"))
    kind = "over" if m.group("op").lower() == "over" else "divided"  # "divided by": an operation to do
    return (_value(m.group("a")) / b, kind) if b else None


def _mixed(m: re.Match) -> tuple[Fraction, str] | None:
    s = "" if m.group("w") else "2"
    a, b = Fraction(m.group(f"a{s}")), Fraction(m.group(f"b{s}"))
    return (Fraction(m.group(f"w{s}")) + a / b, "mixed") if 0 < a < b else None


def _power(m: re.Match) -> tuple[Fraction, str] | None:
    a = _value(m.group("a") or m.group("a3") or m.group("a4"))
    if m.group("sq"):
        b = 2 if m.group("sq").lower() == "squared" else 3
    else:
        tok = (m.group("b") or m.group("b2") or m.group("b3")).lower()
        b = _ORDINALS.get(tok) or int(_value(tok))
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
    return _value(m.group("i")) + Fraction(int(digits), 10 ** len(digits)), "decimal"


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


def _negations(text: str, found: list[Mention]) -> list[Mention]:
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


# ---------------------------------------------------------------- irrational terms
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
        rad = _value(r) if r else Fraction(1)
        den = _value(d) if d else Fraction(1)
        if not (r or pi) or den == 0 or rad.denominator != 1 or not 0 < rad <= 10**6:
            continue
        root, free = _square_free(int(rad))
        if free == 1 and not pi:
            continue  # rational ("\\sqrt{16}")
        sign = -1 if m.group("sign") and _sign_position(text[: m.start()]) else 1
        coef = sign * (_value(c) if c else Fraction(1)) * root / den
        kind, term = "term_unsimplified" if root != 1 else "term", (coef, free, int(bool(pi)))
        out.append(Mention(m.start(), m.end(), frozenset(), kind, m.group(0).strip(), term=term))
    return out


def term_value(term: Term) -> float:
    coef, rad, pi = term
    return float(coef) * math.sqrt(rad) * math.pi**pi


def find_numbers(text: str) -> list[Mention]:
    """Every number in `text` (already normalised with `normalize_math_text`), in order.

    A fraction "3/4" is reported as a fraction and its parts as numerals, a composite ("minus
    seven") beside its parts: callers decide which reading matters (an integer gold treats "48/2"
    as an expression, not a stated answer; `outermost` keeps one reading per span).
    """
    out = _plain(text)
    out += [m for regex, build in _SPOKEN for m in _spoken(text, regex, build)]
    out += _negations(text, out)
    return sorted(out, key=lambda x: (x.start, -x.end))


def outermost(mentions: list[Mention]) -> list[Mention]:
    """The mentions not strictly inside a longer one ("three" in "three quarters", "7" in "minus 7")."""

    def inside(m: Mention, o: Mention) -> bool:
        return o.start <= m.start and m.end <= o.end and o.end - o.start > m.end - m.start

    return [m for m in mentions if not any(inside(m, o) for o in mentions)]


def parse_mention(text: str) -> Mention | None:
    """The mention that is all of `text` (the longest reading), when `text` is exactly one number
    or one irrational term."""
    t = normalize_math_text(text).strip().rstrip(".").strip()
    for m in [*find_numbers(t), *find_terms(t)]:
        if m.start == 0 and m.end == len(t):
            return m
    return None


def parse_number(text: str) -> frozenset[Fraction] | None:
    """The values of `text` when it is exactly one number (e.g. "1,000", "\\frac{1}{2}", "50%")."""
    m = parse_mention(text)
    return m.values if m is not None and m.term is None else None


def result_after_equals(step: str) -> frozenset[Fraction] | None:
    """The number right after the last "=" of a worked step ("48/2 = $24 clips" -> {24})."""
    t = normalize_math_text(step)
    if "=" not in t:
        return None
    rhs = t.rsplit("=", 1)[1]
    nums = [m for m in find_numbers(rhs) if m.kind != "word"]
    return nums[0].values if nums else None
