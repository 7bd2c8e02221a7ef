"""Leak guard: does a hint give the final answer away? (research/algorithm.md 2.10)

Deterministic gates run first, cheapest first; an optional LLM judge runs last:
- `boxed`: any `\\boxed` (the learner's answer format) is a reject.
- `gold`: the gold answer in any normalised form (fraction <-> decimal <-> percent, thousands
  separators, LaTeX \\frac/\\dfrac/\\tfrac, $...$, \\text{}, number words, rounded decimals of a
  non-terminating fraction, or the literal text for non-numeric golds).
- `gold_context`: short golds (<= 2 characters, "5", "42") occur everywhere ("step 1", "n = 1",
  "5 apples"), so they are rejected only where the hint *states a result*: "the answer is 5",
  "answer: 5", "is 5", "equals 5", "get 5", "6*7 = 42" (a computation whose right-hand side is the
  gold), or "x = 5" concluding a sentence ("so x = 5") or ending the hint. "for n = 1", "the case
  n = 1", "step 1", "there are 42 ways" pass. Decision: spelled-out numbers >= 10 ("forty-two") are
  rejected anywhere even for short golds: spelling a two-digit number out is deliberate text (and
  an LLM mentor told not to write the digits tends to write the words), not an index.
- `final_step`: the same tests for the result of the reference solution's last step when it
  differs in form from the gold (e.g. "= $72.00" vs gold "72").
- `overlap`: an 8-token n-gram shared with the last 25% of the reference solution.
- `code_block` / `code_def` (task="code"): a fenced block of more than 3 lines, or a `def`.
- `too_long`: more words than the level's cap (only when a level is given).
- `judge`: an optional callable `judge(hint, gold) -> bool` (True = leaks).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from fractions import Fraction

from mentor_fast.mentor.counts import Counts
from mentor_fast.mentor.numbers import (
    Mention,
    find_numbers,
    normalize_math_text,
    parse_number,
    result_after_equals,
    unwrap_boxed,
)

LEAK_GATES = ("boxed", "gold", "gold_context", "final_step", "overlap", "code_block", "code_def", "judge")
MAX_WORDS = {1: 80, 2: 140, 3: 200}  # per level; the instructor is asked for ~60/100/160 tokens
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
_CONTINUES = re.compile(r"\s*(?:[+\-*/×÷^·=<>]|\\(?:cdot|times|div|frac))|[A-Za-z\d(\[{]")


@dataclass(frozen=True)
class GuardVerdict:
    ok: bool
    gate: str | None = None  # the gate that rejected, None when ok
    detail: str = ""  # why (shown to an LLM instructor on regeneration)


@dataclass(frozen=True)
class Gold:
    """A normalised target: the literal text and, when numeric, its exact values."""

    text: str  # compact normalised form (no spaces), lower-case
    values: frozenset[Fraction]
    short: bool  # <= 2 characters: only answer-like contexts count

    @property
    def integer(self) -> bool:
        return bool(self.values) and all(v.denominator == 1 for v in self.values)


def normalize_gold(gold: str) -> Gold:
    g = normalize_math_text(unwrap_boxed(gold.strip())).strip().rstrip(".").strip()
    values = parse_number(g)
    if values is None:  # "18 cm", "90 degrees", "$5 dollars": a number followed by unit words
        m = re.fullmatch(r"(.*?\d%?)\s*[A-Za-z][A-Za-z .]*", g)
        values = parse_number(m.group(1)) if m else None
    if values:
        v = min(values, key=abs)  # the literal value ("50%" -> 1/2 is the smaller reading's partner)
        canonical = str(v.numerator) if v.denominator == 1 and len(values) == 1 else re.sub(r"\s+", "", g)
        return Gold(canonical.lower(), values, len(canonical) <= 2)
    compact = re.sub(r"\s+", "", g).lower()
    return Gold(compact, frozenset(), len(compact) <= 2)


def _matches(m: Mention, gold: Gold) -> bool:
    if m.kind in ("fraction", "latex_frac") and gold.integer:
        return False  # "48/2" is an expression to work out, not a stated answer
    if m.values & gold.values:
        return True
    # a rounded decimal of a non-terminating gold (14/3 -> "4.67") states the answer too
    if m.kind == "decimal" and m.places >= 2:
        tol = Fraction(1, 2 * 10**m.places)
        return any(abs(mv - gv) <= tol for mv in m.values for gv in gold.values if gv.denominator != 1)
    return False


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
    if gold.values:
        for m in find_numbers(text):
            if not _matches(m, gold):
                continue
            spelled = m.kind == "word" and max(abs(v) for v in m.values) >= 10
            if not gold.short or spelled:
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


def _code_gate(hint: str) -> GuardVerdict | None:
    for block in re.findall(r"```[^\n]*\n(.*?)(?:```|$)", hint, re.DOTALL):
        lines = [ln for ln in block.splitlines() if ln.strip()]
        if len(lines) > 3:
            return GuardVerdict(False, "code_block", f"a code block of {len(lines)} lines")
    if re.search(r"(?m)\bdef\s+\w+\s*\(", hint):
        return GuardVerdict(False, "code_def", "a function definition")
    return None


class LeakGuard:
    """Runs the gates in order and counts rejects per gate (`counts[gate]`)."""

    def __init__(
        self,
        judge: Callable[[str, str], bool] | None = None,
        max_words: dict[int, int] | None = None,
        counts: Counts | None = None,
    ) -> None:
        self.judge = judge
        self.max_words = MAX_WORDS if max_words is None else max_words
        self.counts = counts if counts is not None else Counts()

    def check(
        self,
        hint: str,
        gold: str,
        reference_steps: Sequence[str] = (),
        task: str = "math",
        level: int | None = None,
    ) -> GuardVerdict:
        verdict = self._check(hint, gold, tuple(reference_steps), task, level)
        self.counts.add("checked")
        if not verdict.ok:
            self.counts.add(verdict.gate or "unknown")
        return verdict

    def _check(
        self, hint: str, gold: str, steps: tuple[str, ...], task: str, level: int | None
    ) -> GuardVerdict:
        if not hint.strip():
            return GuardVerdict(False, "empty", "the hint is empty")
        if "\\boxed" in hint:
            return GuardVerdict(False, "boxed", "the hint contains \\boxed")
        text = normalize_math_text(hint)
        gold_n = normalize_gold(gold)
        where = _gold_hits(text, gold_n)
        if where:
            return GuardVerdict(
                False,
                "gold_context" if gold_n.short and "in " in where else "gold",
                f"the hint states the final answer ({where})",
            )
        final = result_after_equals(steps[-1]) if steps else None
        if final and not (final & gold_n.values):
            v = min(final, key=abs)
            canonical = str(v.numerator) if v.denominator == 1 else f"{v.numerator}/{v.denominator}"
            where = _gold_hits(text, Gold(canonical, final, len(canonical) <= 2))
            if where:
                return GuardVerdict(False, "final_step", f"the hint states the last step's result ({where})")
        gram = shared_ngram(hint, steps)
        if gram:
            return GuardVerdict(False, "overlap", f"the hint copies the end of the solution ('{gram}')")
        if task == "code":
            bad = _code_gate(hint)
            if bad:
                return bad
        if level is not None and len(hint.split()) > self.max_words.get(level, 10**9):
            return GuardVerdict(
                False, "too_long", f"{len(hint.split())} words > {self.max_words[level]} for level {level}"
            )
        if self.judge is not None and self.judge(hint, gold):
            return GuardVerdict(
                False, "judge", "the judge says a student could state the answer from the hint"
            )
        return GuardVerdict(True)


def check_hint(
    hint: str,
    gold: str,
    reference_steps: Sequence[str] = (),
    task: str = "math",
    level: int | None = None,
    judge: Callable[[str, str], bool] | None = None,
) -> GuardVerdict:
    """One-off check with the default gates (see `LeakGuard` to keep counts)."""
    return LeakGuard(judge=judge).check(hint, gold, reference_steps, task, level)


def leaks_answer(hint: str, gold: str, reference_steps: Sequence[str] = (), task: str = "math") -> bool:
    """True when the hint gives the answer away (any leak gate rejects it)."""
    verdict = check_hint(hint, gold, reference_steps, task)
    return not verdict.ok and verdict.gate in LEAK_GATES
