"""The math leak gates: does a hint state the final answer? Run by the leak guard (mentor/guard.py)
for math tasks, after its shared gates (an empty hint, `\\boxed`).

- `gold`: the gold answer in any normalised form (tasks/numbers/: fraction <-> decimal <-> percent,
  thousands separators, LaTeX \\frac/\\dfrac/\\tfrac, $...$, \\text{}, number words and spoken
  fractions ("three quarters", "3 over 4", "one and a half", "1 1/2", "½"), negatives ("minus
  seven", "negative 7", "−7", "7 below zero"), "one point five", 2.5e3, repeating decimals, rounded
  decimals and percents of a non-terminating fraction; irrational terms c*sqrt(r)*pi^k in any
  spelling ("2\\sqrt{3}", "2 sqrt(3)", "two root three", "pi/2", "\\frac{\\pi}{2}") and their rounded
  decimals; or the literal text for other golds). One reading per span: "three quarters" is 3/4,
  not 3. Forms that are an operation to carry out count only where the hint states a result (as
  for short golds below): "a divided by b", "a out of b", powers ("2^{10}", "2 to the 10th") unless
  the gold is itself written as one, an unsimplified radical ("\\sqrt{12}" for 2\\sqrt{3}), and
  fractions for an integer gold ("48/2" for 24). "compute 2^{10}" passes, "the answer is 2^{10}"
  does not.
- `gold_context`: short golds (<= 2 characters, "5", "42") occur everywhere ("step 1", "n = 1",
  "5 apples"), so they are rejected only where the hint *states a result*: "the answer is 5",
  "answer: 5", "is 5", "equals 5", "get 5", "6*7 = 42" (a computation whose right-hand side is the
  gold), or "x = 5" concluding a sentence ("so x = 5") or ending the hint. "for n = 1", "the case
  n = 1", "step 1", "there are 42 ways" pass. Decision: spelled-out numbers >= 10 ("forty-two") are
  rejected anywhere even for short golds: spelling a two-digit number out is deliberate text (and
  an LLM mentor told not to write the digits tends to write the words), not an index; so is
  "7 below zero". An operation form of any gold (above) that states a result is counted here too.
- `final_step`: the same tests for the result of the worked solution's last step when it
  differs in form from the gold (e.g. "= $72.00" vs gold "72").
- `overlap`: an 8-token n-gram shared with the last 25% of the worked solution.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction

from mentor_fast.answers import unwrap_boxed
from mentor_fast.tasks.numbers import (
    Mention,
    Term,
    find_numbers,
    find_terms,
    normalize_math_text,
    outermost,
    parse_mention,
    result_after_equals,
    term_value,
)
from mentor_fast.types import CodeTask

MATH_GATES = ("gold", "gold_context", "final_step", "overlap")
NGRAM = 8
TAIL_FRAC = 0.25

_CONCLUDE = (
    r"so|thus|therefore|hence|then|finally|which gives|this gives|giving|we get|you get|to get|"
    r"gives|yields|answer|result|total"
)
_SETTING = (
    r"for|when|whenever|if|case|cases|with|let|set|setting|at|assume|assuming|suppose|try|"
    r"trying|plug|plugging|substitute|substituting|where|say|like|unless|e\\.g"
)
_STATES = re.compile(
    r"(?:\b(?:is|are|equals|equal to|gives|yields|get|gets|got|obtain|obtains|becomes|makes|comes to|"
    r"totals?|be))\s*$"
)
_ANSWER_WORD = re.compile(
    r"\b(?:answer|result|solution)\b(?:\s+(?:is|was|will|would|should|must|be|equals|therefore|then|thus|"
    r"here|now|really|actually|exactly))*\s*[:=]?\s*$"
)
_OPERATOR = re.compile(
    r"[\w)\]}]\s*(?:[+\-*/×÷^·])\s*[\w(\\{]|\b(?:times|plus|minus|divided|multiplied|squared|cubed|sum|"
    r"product|difference|quotient)\b"
)
_CONTINUES = re.compile(r"\s*(?:[+\-*/×÷^·=<>]|\\(?:cdot|times|div|frac|sqrt|pi))|[A-Za-z\d(\[{]")
_OPERATIONS = frozenset({"divided", "power", "term_unsimplified"})  # forms to work out (module docstring)
_FRACTIONS = frozenset({"fraction", "latex_frac", "over", "word_frac", "mixed"})


@dataclass(frozen=True)
class Gold:
    """A normalised target: the literal text and, when numeric, its exact values."""

    text: str  # compact normalised form (no spaces), lower-case
    values: frozenset[Fraction]
    short: bool  # <= 2 characters: only answer-like contexts count
    form: str = ""  # the kind of mention the gold is written as ("power" for "2^{10}")
    term: Term | None = None  # an irrational gold ("2\\sqrt{3}", "\\pi/2")

    @property
    def integer(self) -> bool:
        return bool(self.values) and all(v.denominator == 1 for v in self.values)


def normalize_gold(gold: str) -> Gold:
    g = normalize_math_text(unwrap_boxed(gold.strip())).strip().rstrip(".").strip()
    mention = parse_mention(g)
    if mention is None:  # "18 cm", "90 degrees", "$5 dollars": a number followed by unit words
        m = re.fullmatch(r"(.*?\d%?)\s*[A-Za-z][A-Za-z .]*", g)
        mention = parse_mention(m.group(1)) if m else None
    compact = re.sub(r"\s+", "", g).lower()
    if mention is not None and mention.term is not None:
        return Gold(compact, frozenset(), False, mention.kind, mention.term)
    if mention is not None and mention.values:
        values = mention.values
        v = min(values, key=abs)  # the literal value ("50%" -> 1/2 is the smaller reading's partner)
        canonical = str(v.numerator) if v.denominator == 1 and len(values) == 1 else re.sub(r"\s+", "", g)
        return Gold(canonical.lower(), values, len(canonical) <= 2, mention.kind)
    return Gold(compact, frozenset(), len(compact) <= 2)


def _matches(m: Mention, gold: Gold) -> bool:
    if m.values & gold.values:
        return True
    # a rounded decimal (or percent) of a non-terminating gold (14/3 -> "4.67", 1/3 -> "33.3%")
    # states the answer too
    places = m.places + 2 * (m.kind == "percent")
    if m.kind in ("decimal", "percent") and places >= 2:
        tol = Fraction(1, 2 * 10**places)
        value = min(m.values, key=abs)
        return any(abs(value - gv) <= tol for gv in gold.values if gv.denominator != 1)
    return False


def _operation(m: Mention, gold: Gold) -> bool:
    """A form to work out rather than a stated value (module docstring): counts only in context."""
    if m.kind == gold.form:
        return False
    return m.kind in _OPERATIONS or (gold.integer and m.kind in _FRACTIONS)


def _at_end(after: str) -> bool:
    return re.fullmatch(r"[\s.,;:!?)\]}*_'\"]*", after) is not None


def _answer_like(text: str, start: int, end: int) -> str | None:
    """Why the mention text[start:end] states a result, or None (see the module docstring)."""
    after = text[end:]
    if _CONTINUES.match(after):  # "= 5 + x", "5x", "5^2", "5 = y": 5 is not the final right-hand side
        return None
    if not text[:start].strip() and _at_end(after):
        return "a hint that is only the answer"
    sentence = re.split(r"[.!?;\n]\s|\n", text[:start])[-1]
    low = sentence.lower().rstrip()
    if re.search(r"\bthere\s+(?:is|are)\s*$", low):
        return None
    if _ANSWER_WORD.search(low):
        return "an answer statement"
    if low.endswith("="):
        head = low[:-1]
        lhs = re.split(r"=|,|:|\b(?:and|so|thus|hence|then|if|when|with|for|let|at)\b", head)[-1]
        if _OPERATOR.search(lhs):
            return f"a computation whose result is the gold ({lhs.strip()} = ...)"
        # "the case n = 1", "for n = 1": the words just before the variable set a parameter
        if any(re.fullmatch(_SETTING, w) for w in re.findall(r"[a-z]+", head)[-4:-1]):
            return None
        if re.search(rf"\b(?:{_CONCLUDE})\b", head):
            return "a concluding relation"
        return "a relation ending the hint" if _at_end(after) else None
    if re.search(rf"\b(?:{_SETTING})\b\s+\S+\s+(?:is|be)\s*$", low):
        return None  # "if n is 1, ..."
    if _STATES.search(low):
        return "a stated result"
    if re.search(rf"\b(?:{_CONCLUDE})\s*$", low) and _at_end(after):
        return "a concluding statement"
    return None


def _gold_hits(text: str, gold: Gold) -> str | None:
    """Where `text` (normalised) states `gold`, or None."""
    if gold.term is not None:
        where = _term_hits(text, gold)
        if where:
            return where
    if gold.values or gold.term is not None:
        for m in outermost(find_numbers(text)):
            if not (_matches(m, gold) if gold.values else _approximates(m, gold.term)):
                continue
            # spelling a number >= 10 out, or "7 below zero", is deliberate text, not an index
            spelled = m.kind == "below_zero" or (
                not re.search(r"\d", m.text) and max(abs(v) for v in m.values) >= 10
            )
            if (not gold.short or spelled) and not _operation(m, gold):
                return f"'{m.text.strip()}'"
            why = _answer_like(text, m.start, m.end)
            if why:
                return f"'{m.text.strip()}' in {why}"
        return None
    if not gold.text:
        return None
    compact = re.sub(r"\s+", "", text).lower()
    if not gold.short:
        if re.fullmatch(r"[a-z]+", gold.text):
            return f"'{gold.text}'" if re.search(rf"\b{gold.text}\b", text.lower()) else None
        return f"'{gold.text}'" if gold.text in compact else None
    for m in re.finditer(rf"(?<![\w\\]){re.escape(gold.text)}(?!\w)", text, re.IGNORECASE):
        why = _answer_like(text, m.start(), m.end())
        if why:
            return f"'{m.group(0)}' in {why}"
    choice = rf"\((?:{re.escape(gold.text)})\)|\b(?:option|choice)\s+{re.escape(gold.text)}\b"
    if len(gold.text) == 1 and gold.text.isalpha() and re.search(choice, text, re.IGNORECASE):
        return f"choice '{gold.text.upper()}'"  # multiple choice: "(B)", "option B"
    return None


def _approximates(m: Mention, term: Term | None) -> bool:
    """A decimal with 2+ places that rounds an irrational gold (pi/2 -> "1.57")."""
    if term is None or m.kind != "decimal" or m.places < 2:
        return False
    return any(abs(float(v) - term_value(term)) <= 0.5 * 10**-m.places for v in m.values)


def _term_hits(text: str, gold: Gold) -> str | None:
    for m in find_terms(text):
        if m.term != gold.term:
            continue
        if not _operation(m, gold):
            return f"'{m.text}'"
        why = _answer_like(text, m.start, m.end)
        if why:
            return f"'{m.text}' in {why}"
    return None


def _tokens(text: str) -> list[str]:
    return re.findall(r"[a-z0-9]+|[^\sa-z0-9]", normalize_math_text(text).lower())


def shared_ngram(
    hint: str, reference_steps: Sequence[str], n: int = NGRAM, tail: float = TAIL_FRAC
) -> str | None:
    """An n-token n-gram of the hint that also occurs in the last `tail` share of the reference."""
    if not reference_steps:
        return None
    k = max(1, math.ceil(len(reference_steps) * tail))
    ref = _tokens(" ".join(reference_steps[-k:]))
    grams = {tuple(ref[i : i + n]) for i in range(len(ref) - n + 1)}
    toks = _tokens(hint)
    for i in range(len(toks) - n + 1):
        if tuple(toks[i : i + n]) in grams:
            return " ".join(toks[i : i + n])
    return None


def math_leak(
    hint: str, gold: str, steps: tuple[str, ...], code: CodeTask | None = None, question: str = ""
) -> tuple[str, str] | None:
    """(gate, why) for the first math gate that rejects `hint`, or None. `code` and `question`
    are the code gates' (a math problem has no program; the question may show any number)."""
    text = normalize_math_text(hint)
    gold_n = normalize_gold(gold)
    where = _gold_hits(text, gold_n)
    if where:
        return ("gold_context" if " in " in where else "gold"), f"the hint states the final answer ({where})"
    final = result_after_equals(steps[-1]) if steps else None
    if final and not (final & gold_n.values):
        v = min(final, key=abs)
        canonical = str(v.numerator) if v.denominator == 1 else f"{v.numerator}/{v.denominator}"
        where = _gold_hits(text, Gold(canonical, final, len(canonical) <= 2))
        if where:
            return "final_step", f"the hint states the last step's result ({where})"
    gram = shared_ngram(hint, steps)
    if gram:
        return "overlap", f"the hint copies the end of the solution ('{gram}')"
    return None
