"""What the mentor looks at (a `FailureCase`) and what the diagnoser returns (a `Diagnosis`)."""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from typing import Any

from mentor_fast.mentor.numbers import last_boxed, normalize_math_text
from mentor_fast.types import Group, Problem, Rollout

# Closed taxonomies (research/algorithm.md 2.7). "other" catches labels outside the set.
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
CODE_FAILURES = ("syntax", "runtime_error", "wrong_algorithm", "edge_case", "io_format", "time_limit")
FAILURE_TYPES = {"math": MATH_FAILURES, "code": CODE_FAILURES}

_ALIASES = {
    "format_extraction": "format",
    "extraction": "format",
    "formatting": "format",
    "truncation_overlong": "truncation",
    "overlong": "truncation",
    "truncated": "truncation",
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
    "syntax_compile": "syntax",
    "compile_error": "syntax",
    "syntax_error": "syntax",
    "runtime_exception": "runtime_error",
    "exception": "runtime_error",
    "edge_cases": "edge_case",
    "i_o_format": "io_format",
    "io": "io_format",
    "time_memory_limit": "time_limit",
    "timeout": "time_limit",
    "memory_limit": "time_limit",
}


def normalize_label(label: Any, task: str = "math") -> str:
    key = re.sub(r"[^a-z0-9]+", "_", str(label).lower()).strip("_")
    key = _ALIASES.get(key, key)
    return key if key in FAILURE_TYPES.get(task, MATH_FAILURES) else "other"


@dataclass
class Diagnosis:
    failure_type: str  # a label of the task's taxonomy, or "other"
    root_cause: str = ""
    first_error: str = ""
    missing_knowledge: str | None = None
    confidence: float = 0.5

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, obj: Any, task: str = "math") -> Diagnosis | None:
        """A diagnosis from a parsed JSON object, or None when it has no failure_type."""
        if not isinstance(obj, dict) or not obj.get("failure_type"):
            return None
        try:
            confidence = min(1.0, max(0.0, float(obj.get("confidence", 0.5))))
        except (TypeError, ValueError):
            confidence = 0.5
        missing = obj.get("missing_knowledge")
        return cls(
            failure_type=normalize_label(obj["failure_type"], task),
            root_cause=str(obj.get("root_cause") or ""),
            first_error=str(obj.get("first_error") or ""),
            missing_knowledge=None if missing in (None, "", "null", "none") else str(missing),
            confidence=confidence,
        )


def final_answer_key(rollout: Rollout) -> str:
    """How an attempt ended: its boxed answer (normalised), or why it has none."""
    boxed = last_boxed(rollout.text)
    if boxed is not None:
        return re.sub(r"\s+", "", normalize_math_text(boxed))
    return "<truncated>" if rollout.truncated else "<no answer>"


def choose_attempts(rollouts: list[Rollout], k: int = 3) -> list[Rollout]:
    """Up to k failed attempts covering distinct final answers (at least 2 when there are 2)."""
    failed = [r for r in rollouts if not r.correct]
    chosen, seen = [], set()
    for r in failed:
        key = final_answer_key(r)
        if key not in seen and len(chosen) < k:
            chosen.append(r)
            seen.add(key)
    for r in failed:  # answer-concentrated groups: still show two attempts
        if len(chosen) >= min(2, k):
            break
        if all(r is not c for c in chosen):
            chosen.append(r)
    return chosen


def truncate_middle(text: str, head: int = 600, tail: int = 600) -> str:
    """Keep the start (the approach) and the end (the answer) of a long attempt."""
    if len(text) <= head + tail + 40:
        return text
    return f"{text[:head]}\n[... {len(text) - head - tail} characters omitted ...]\n{text[-tail:]}"


@dataclass
class FailureCase:
    """One all-fail group as the mentor sees it."""

    problem: Problem
    attempts: list[Rollout]  # the chosen failed attempts
    group_size: int
    answers: dict[str, int]  # final answer key -> how many of the group's attempts ended there
    task: str = "math"
    previous_hints: list[str] = field(default_factory=list)  # earlier hints for this problem
    hint_cache: dict[int, str] = field(default_factory=dict)  # fused call: level -> hint

    @classmethod
    def from_group(
        cls, group: Group, k: int = 3, previous_hints: list[str] | None = None, task: str = "math"
    ) -> FailureCase:
        answers: dict[str, int] = {}
        for r in group.rollouts:
            key = final_answer_key(r)
            answers[key] = answers.get(key, 0) + 1
        return cls(
            group.problem,
            choose_attempts(group.rollouts, k),
            len(group.rollouts),
            answers,
            task,
            list(previous_hints or []),
        )

    @property
    def all_truncated(self) -> bool:
        return bool(self.attempts) and all(r.truncated for r in self.attempts)

    @property
    def no_answer_share(self) -> float:
        n = sum(v for key, v in self.answers.items() if key in ("<no answer>", "<truncated>"))
        return n / max(1, self.group_size)

    def render_attempts(self, head: int = 600, tail: int = 600) -> str:
        parts = []
        for i, r in enumerate(self.attempts, 1):
            note = r.verifier_note or ("stopped at the length limit" if r.truncated else "wrong final answer")
            parts.append(f"Attempt {i}:\n{truncate_middle(r.text, head, tail)}\nVerifier: {note}")
        return "\n\n".join(parts) if parts else "(none)"

    def render_answers(self) -> str:
        return ", ".join(f"{key} x{n}" for key, n in sorted(self.answers.items(), key=lambda kv: -kv[1]))
