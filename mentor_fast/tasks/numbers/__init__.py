"""Numbers in free text: numerals (with thousands separators), decimals, fractions, LaTeX
fractions, percentages and English number words, each with its exact value; their spoken and
composite forms ("three quarters", "one and a half", "3 over 4", "1 1/2", "minus seven", "7 below
zero", "2 to the 10th", "2.5e3", "0.\\overline{3}", "one point five"); and irrational terms
c * sqrt(r) * pi^k ("2\\sqrt{3}", "two root three", "pi/2", "\\frac{\\pi}{2}") in one canonical form.

The leak guard compares these values with the gold answer; the worked-solutions writer reads step
results and failed attempts with them. Values are `Fraction`s so 0.5 == 1/2 exactly. A composite
mention ("three quarters") is reported beside its parts ("three"): callers that want one reading
per span keep the `outermost` ones.
"""

from __future__ import annotations

from fractions import Fraction

from mentor_fast.tasks.numbers.numerals import Mention, Term, normalize_math_text, plain_mentions
from mentor_fast.tasks.numbers.spoken import negations, spoken_mentions
from mentor_fast.tasks.numbers.terms import find_terms, term_value

__all__ = [
    "Mention",
    "Term",
    "find_numbers",
    "find_terms",
    "normalize_math_text",
    "outermost",
    "parse_mention",
    "parse_number",
    "result_after_equals",
    "term_value",
]


def find_numbers(text: str) -> list[Mention]:
    """Every number in `text` (already normalised with `normalize_math_text`), in order.

    A fraction "3/4" is reported as a fraction and its parts as numerals, a composite ("minus
    seven") beside its parts: callers decide which reading matters (an integer gold treats "48/2"
    as an expression, not a stated answer; `outermost` keeps one reading per span).
    """
    out = plain_mentions(text)
    out += spoken_mentions(text)
    out += negations(text, out)
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
