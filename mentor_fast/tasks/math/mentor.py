"""The mentor's part of the math task: its failure taxonomy, and an attempt told by its boxed answer."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from mentor_fast.answers import last_boxed
from mentor_fast.mentor.diagnosis import SHARED_ALIASES
from mentor_fast.mentor.task import MentorTask
from mentor_fast.tasks.math import steps
from mentor_fast.tasks.math.gates import MATH_GATES, math_leak
from mentor_fast.tasks.numbers import normalize_math_text
from mentor_fast.types import Rollout

if TYPE_CHECKING:
    from mentor_fast.mentor.cases import FailureCase

MATH_FAILURES = (
    "format",
    "truncation",
    "misread_question",
    "wrong_strategy",
    "missing_concept",
    "arithmetic_slip",
    "logical_gap",
    "incomplete_cases",
    "premature_answer",
)
ALIASES = SHARED_ALIASES | {
    "misread": "misread_question",
    "misunderstood_question": "misread_question",
    "strategy": "wrong_strategy",
    "concept": "missing_concept",
    "algebra_arithmetic_slip": "arithmetic_slip",
    "arithmetic": "arithmetic_slip",
    "arithmetic_error": "arithmetic_slip",
    "calculation_error": "arithmetic_slip",
    "algebra_slip": "arithmetic_slip",
    "logical_gap_invalid_step": "logical_gap",
    "invalid_step": "logical_gap",
    "incomplete_case_analysis": "incomplete_cases",
    "case_analysis": "incomplete_cases",
    "no_verification_premature_answer": "premature_answer",
    "no_verification": "premature_answer",
}


def answer_key(rollout: Rollout) -> str:
    """The attempt's boxed answer as the verifier reads it (normalised), or why it has none."""
    boxed = last_boxed(rollout.text)
    if boxed is not None:
        return re.sub(r"\s+", "", normalize_math_text(boxed))
    return "<truncated>" if rollout.truncated else "<no answer>"


def _no_detail(rollout: Rollout) -> str:
    return ""  # the verifier's note says it all


def _no_values(case: FailureCase) -> dict[str, Any]:
    return {}


MENTOR = MentorTask(
    failures=MATH_FAILURES,
    aliases=ALIASES,
    attempt_key=answer_key,
    failure_of=None,
    attempt_detail=_no_detail,
    gates=MATH_GATES,
    leak=math_leak,
    diagnose=steps.diagnose,
    hint=steps.hint,
    templates="mentor_fast.tasks.math",
    prompt_values=_no_values,
)
