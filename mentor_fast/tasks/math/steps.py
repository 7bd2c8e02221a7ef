"""The math problems' deterministic writer (no LLM): it reads the verifier's signals and the data's
worked solution (`Problem.solution_steps`).

Diagnosis: every attempt truncated -> truncation; most attempts without a boxed answer -> format;
otherwise the first solution step whose result (the number after "=") no failed attempt computed,
that is wrote as the result of an "=" (a small result that turns up elsewhere, as an operand or a
stray line, does not count): arithmetic slip when an attempt wrote that step's computation, wrong
strategy otherwise.
Hint (for that step, never the final answer): level 1 points at the computation, level 2 lists the
remaining operations in order with earlier results named, not stated, level 3 gives the step with
its result, except for the last step, whose result is the answer.
The hint still passes through the leak guard like any other.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from fractions import Fraction
from typing import TYPE_CHECKING

from mentor_fast.mentor.diagnosis import Diagnosis
from mentor_fast.tasks.numbers import find_numbers, normalize_math_text, result_after_equals

if TYPE_CHECKING:
    from mentor_fast.mentor.cases import FailureCase

_OPS = {"+": "an addition", "-": "a subtraction", "*": "a multiplication", "/": "a division"}
_WORD_OPS = {
    "plus": "+",
    "minus": "-",
    "times": "*",
    "x": "*",
    "×": "*",
    "÷": "/",
    "divided by": "/",
    "multiplied by": "*",
}
_TOKEN = re.compile(
    r"(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?%?|\.\d+%?|divided by|multiplied by|[A-Za-z]+|[-+*/×÷()^]|\S"
)
_STOP_WORDS = (  # words after a number that are not its unit ("9 because ...")
    "because so then and or is are was were of for to in on at that which this therefore thus hence "
    "means with by from a an the if when he she it they we you total"
)
_NOT_UNITS = frozenset(_STOP_WORDS.split())
_PREFIX = {
    "format": "End with one final answer in a box, exactly as the instructions ask.",
    "truncation": "Keep every step to one short line and do not repeat yourself, so you reach the end.",
}
_STOCK = {  # no worked solution: metacognitive hints by level
    1: "Re-read the question: what exactly is asked, and which quantities are given?",
    2: "Plan: list the given quantities, write the relation between them and the unknown, then compute "
    "step by step and check each result.",
    3: "Write down the first relation between the given quantities before computing anything, and check "
    "each arithmetic step before moving on.",
}
MAX_PLAN_STEPS = 6
PLAN_WORDS = 100  # the level-2 cap is 140 words, prefix included


@dataclass(frozen=True)
class Step:
    index: int  # 1-based
    lhs: str  # the bare computation ("47 + 385", "6 + 2 + 5" for "6 minutes + 2 minutes + 5 minutes")
    result: frozenset[Fraction] | None  # the number after the last "=" (None: no "=" in the step)
    result_text: str

    @property
    def is_expr(self) -> bool:
        return bool(self.lhs)


def _is_number(tok: str) -> bool:
    return tok[0].isdigit() or (tok[0] == "." and len(tok) > 1)


def computation(left: str) -> str:
    """The trailing computation of a step's left-hand side, unit words dropped, word operators as
    symbols: "he earned 0.2 x 50" -> "0.2 * 50", "20 drops/minute x 120 minutes" -> "20 * 120";
    "" when there is none (at least two numbers and an operator)."""
    toks = _TOKEN.findall(left)
    kept: list[str] = []
    i = len(toks) - 1
    while i >= 0:
        tok = toks[i].lower()
        prev = toks[i - 1] if i > 0 else ""
        unit_slash = tok == "/" and i + 1 < len(toks) and toks[i + 1].isalpha()  # "drops/minute"
        if unit_slash:
            pass
        elif _is_number(tok) or tok in "+-*/×÷()^" or tok in _WORD_OPS:
            kept.append(_WORD_OPS.get(tok, tok))
        elif tok.isalpha() and tok not in _NOT_UNITS and prev and (_is_number(prev) or prev == "/"):
            pass  # a unit after a number ("120 minutes", "20 drops/minute"): dropped
        else:
            break
        i -= 1
    expr = re.sub(r"\(\s*-\s+(?=[\d.])", "(-", " ".join(reversed(kept)).replace("( ", "(").replace(" )", ")"))
    expr = re.sub(r"^[-+*/^)\s]+(?=\S)", lambda m: "-" if m.group(0).strip() == "-" and i < 0 else "", expr)
    ops = sum(t in "+-*/^" for t in kept)
    return expr.strip() if ops and sum(_is_number(t) for t in kept) >= 2 else ""


def parse_step(index: int, text: str) -> Step:
    t = re.sub(r"\b(?:is equal to|equals)\b", "=", normalize_math_text(text)).strip()
    if "=" not in t:
        return Step(index, "", None, "")
    left, right = t.rsplit("=", 1)
    left = left.split("=")[-1]  # "x = 3 * 4 = 12": the last relation
    nums = [n for n in find_numbers(right) if n.kind != "word"]
    return Step(index, computation(left), result_after_equals(t), nums[0].text.strip() if nums else "")


def _operation(lhs: str) -> str:
    ops = {_OPS[o] for o in re.findall(r"(?<=[\d)%\s])\s*([-+*/])\s*(?=[\d(.])", lhs)}
    return ops.pop() if len(ops) == 1 else "several operations: mind their order"


_EQUALS = re.compile(r"=|\b(?:is equal to|equals)\b")
_OPERATOR_NEXT = re.compile(r"\s*(?:[-+*/×÷^]|times|plus|minus|divided by|multiplied by)\s*[\d(.]")


def computed_results(text: str) -> set[Fraction]:
    """The values an attempt wrote as the result of a relation: the number right after each "=",
    unless an operator follows it ("= 3 * 4 = 12" computes 12, not 3). "8 * 2 = 16" gives {16};
    a bare "2" on its own line, or the 2 in "2 + 39", gives nothing."""
    t = normalize_math_text(text)
    out: set[Fraction] = set()
    for eq in _EQUALS.finditer(t):
        rhs = re.split(r"=|\n", t[eq.end(): eq.end() + 80], maxsplit=1)[0]  # up to the next relation
        nums = [m for m in find_numbers(rhs) if m.kind != "word"]
        if nums and not rhs[: nums[0].start].strip(" $\t") and not _OPERATOR_NEXT.match(rhs, nums[0].end):
            out |= nums[0].values  # the number comes first after "=", and nothing is done to it
    return out


def _missing_step(case: FailureCase) -> tuple[list[Step], Step | None]:
    steps = [parse_step(i, s) for i, s in enumerate(case.problem.solution_steps, 1)]
    seen: set[Fraction] = set()
    for r in case.attempts:
        seen |= computed_results(r.text)
    for step in steps:
        if step.result and not (step.result & seen):
            return steps, step
    # every intermediate result was written: the slip is in the last step (or the answer's form)
    return steps, (steps[-1] if steps else None)


def _failure_type(case: FailureCase, step: Step | None) -> str:
    if case.all_truncated:
        return "truncation"
    if case.no_answer_share > 0.5:
        return "format"
    if step is None:
        return "wrong_strategy"
    compact = re.sub(r"[\s$]", "", step.lhs)
    wrote = any(
        compact and compact in re.sub(r"[\s$]", "", normalize_math_text(r.text)) for r in case.attempts
    )
    return "arithmetic_slip" if wrote else "wrong_strategy"


def diagnose(case: FailureCase) -> Diagnosis:
    _, step = _missing_step(case)
    kind = _failure_type(case, step)
    where = f"step {step.index}: {step.lhs}" if step else ""
    cause = {
        "truncation": "The attempts stop at the length limit before giving an answer.",
        "format": "Most attempts never give a final answer in the required form.",
        "arithmetic_slip": f"The attempts set up {where} but compute it wrongly.",
        "wrong_strategy": f"No attempt reaches the result of {where or 'the key step'}.",
    }[kind]
    confidence = {"truncation": 0.9, "format": 0.9, "arithmetic_slip": 0.7, "wrong_strategy": 0.5}[
        kind
    ]
    return Diagnosis(kind, cause, where, None, confidence)


def hint(case: FailureCase, diagnosis: Diagnosis, level: int) -> str:
    steps, step = _missing_step(case)
    prefix = _PREFIX.get(diagnosis.failure_type, "")
    if step is None:
        return f"{prefix} {_STOCK[level]}".strip()
    last = step.index == len(steps)
    if not step.is_expr:  # no bare computation to point at: never quote the reference's sentences
        return f"{prefix} {_STOCK[level]}".strip()
    if level == 2:
        body = (
            "Plan: " + "; ".join(_plan(steps, step)) + ". Do each computation yourself and check it."
        )
    elif level == 3 and not last:
        body = f"Start with this step: {step.lhs} = {step.result_text}. Then continue on your own."
    else:  # level 1, and level 3 on the last step (whose result is the answer)
        what = f"{step.lhs} ({_operation(step.lhs)})"
        body = (
            f"For the last step, work out {what} carefully, and check it digit by digit before answering."
            if last
            else f"Work out {what} first, carefully."
        )
    return f"{prefix} {body}".strip()


def _plan(steps: list[Step], first: Step) -> list[str]:
    """The operations from `first` on, in order; a result computed inside the plan is named
    ("the result of 1"), never stated. Results before `first` are already in the attempts.

    A worked solution uses each intermediate result once, so each is named once: in "2 + 3 = 5,
    5 * 5 = 25" the second step is "(the result of 1) * 5", not the result of 1 squared."""
    plan = steps[first.index - 1 :][:MAX_PLAN_STEPS]
    items: list[str] = []
    named: set[int] = set()  # plan items whose result a later item already names
    for k, step in enumerate(plan, 1):
        lhs, subs = step.lhs, []
        for m in [m for m in find_numbers(lhs) if m.kind in ("numeral", "decimal")]:
            earlier = [j for j, s in enumerate(plan[: k - 1], 1)
                       if j not in named and s.result and m.values & s.result]
            if earlier:
                named.add(earlier[-1])
                subs.append((m, earlier[-1]))
        for m, j in reversed(subs):  # right to left, so earlier offsets stay valid
            lhs = f"{lhs[: m.start]}(the result of {j}){lhs[m.end :]}"
        item = f"{k}) compute {lhs}" if lhs else f"{k}) work out the next quantity"
        if len(" ".join([*items, item]).split()) > PLAN_WORDS:
            break
        items.append(item)
    return items
