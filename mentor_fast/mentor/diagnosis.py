"""What the mentor looks at (a `FailureCase`) and what the diagnoser returns (a `Diagnosis`).

Code attempts are read through their sandbox result (`Rollout.verifier_detail`, a
`rewards.code.CodeResult`, read by its fields so that the mentor does not import the rewards):
`code_failure` puts each on the closed code taxonomy, and attempts are told apart by how they failed
(status, exception, failing test line) the way math attempts are by their final answer.
"""

from __future__ import annotations

import re
import sys
from dataclasses import asdict, dataclass, field
from typing import Any

from mentor_fast.answers import last_boxed
from mentor_fast.mentor.numbers import normalize_math_text
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
CODE_FAILURES = (
    "syntax",  # the program does not compile
    "signature",  # the tests cannot call it: NameError on the entry point, TypeError on the call's arity
    "exception",  # another exception raised by the program (the diagnosis names its type)
    "wrong_output",  # an assertion of the tests failed
    "timeout",
    "missing_import",  # NameError on a stdlib module or name an import provides, ModuleNotFoundError
    "format",  # no code in the completion
    "truncation",  # every attempt hit the length limit
)
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
    "indentation_error": "syntax",
    "wrong_signature": "signature",
    "signature_error": "signature",
    "wrong_function_name": "signature",
    "wrong_name": "signature",
    "name_error": "signature",
    "arity": "signature",
    "runtime_error": "exception",
    "runtime_exception": "exception",
    "crash": "exception",
    "crashed": "exception",
    "wrong_algorithm": "wrong_output",
    "edge_case": "wrong_output",
    "edge_cases": "wrong_output",
    "wrong_answer": "wrong_output",
    "logic_error": "wrong_output",
    "assertion_error": "wrong_output",
    "failed_test": "wrong_output",
    "io_format": "wrong_output",  # printed in the wrong shape: the comparison of the tests fails
    "i_o_format": "wrong_output",
    "io": "wrong_output",
    "time_limit": "timeout",
    "time_memory_limit": "timeout",
    "memory_limit": "timeout",
    "time_limit_exceeded": "timeout",
    "tle": "timeout",
    "missing_imports": "missing_import",
    "import_error": "missing_import",
    "module_not_found": "missing_import",
    "no_code": "format",
}
# names an import provides (the module to import), for NameErrors that are a missing import
IMPORTABLE = {
    **dict.fromkeys(
        ("List", "Dict", "Tuple", "Set", "Optional", "Any", "Union", "Callable", "Iterable"), "typing"
    ),
    **dict.fromkeys(("Counter", "defaultdict", "deque", "OrderedDict", "namedtuple"), "collections"),
    **dict.fromkeys(("reduce", "lru_cache", "cache", "partial", "cmp_to_key"), "functools"),
    **dict.fromkeys(("heappush", "heappop", "heapify", "nlargest", "nsmallest"), "heapq"),
    **dict.fromkeys(
        ("permutations", "combinations", "product", "accumulate", "chain", "groupby"), "itertools"
    ),
    **dict.fromkeys(("bisect_left", "bisect_right", "insort"), "bisect"),
    **dict.fromkeys(("sqrt", "gcd", "floor", "ceil", "factorial", "comb", "isqrt", "log", "inf"), "math"),
    "Fraction": "fractions",
    "Decimal": "decimal",
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


def code_result(rollout: Rollout) -> Any:
    """The attempt's sandbox result (a CodeResult), or None."""
    d = rollout.verifier_detail
    return d if all(hasattr(d, a) for a in ("status", "exception", "test_line")) else None


def looks_like_code(text: str) -> bool:
    return (
        "```" in text
        or re.search(r"(?m)^(?:\s*(?:def|class|import|from|return|for|while|if|print)\b| {4}\S|\t\S)", text)
        is not None
    )


def missing_name(message: str) -> str:
    """The name of "name 'x' is not defined" / "No module named 'x'" ("" when there is none)."""
    m = re.search(r"(?:name|named) '([\w.]+)'", message)
    return m.group(1) if m else ""


def code_failure(rollout: Rollout) -> str:
    """The code taxonomy's label of one failed attempt, from its sandbox result."""
    res, ep = code_result(rollout), (rollout.problem.code.entry_point if rollout.problem.code else "")
    if res is None:  # not run: no code, or nothing to read (an empty attempt says nothing)
        if rollout.truncated:
            return "truncation"
        return "format" if rollout.text.strip() and not looks_like_code(rollout.text) else "other"
    exc, msg = res.exception, res.message
    if res.status in ("timeout", "failed", "crashed"):  # crashed: killed (memory, output cap) or exited early
        return {"timeout": "timeout", "failed": "wrong_output", "crashed": "exception"}[res.status]
    if res.status != "error":  # sandbox_error (not the attempt's fault), or a pass marked wrong
        return "other"
    if exc in ("SyntaxError", "IndentationError", "TabError"):
        return "syntax" if looks_like_code(rollout.text) else "format"
    if exc in ("ModuleNotFoundError", "ImportError"):
        return "missing_import"
    name = missing_name(msg)
    if exc == "NameError" and ep and name == ep:
        return "signature"
    if exc == "NameError" and (name in IMPORTABLE or name in sys.stdlib_module_names):
        return "missing_import"
    if exc == "TypeError" and ep and re.match(rf"{re.escape(ep)}\(\) (?:missing|takes|got)", msg):
        return "signature"
    return "exception"


def _code_key(rollout: Rollout) -> str:
    res, label = code_result(rollout), code_failure(rollout)
    if res is None:
        return {"format": "<no code>", "truncation": "<truncated>"}.get(label, "<not run>")
    why = res.exception or res.status
    return f"{label}: {why}" + (f" at {res.test_line.strip()}" if res.test_line.strip() else "")


def _is_code(rollout: Rollout) -> bool:
    return rollout.problem.code is not None or code_result(rollout) is not None


def final_answer_key(rollout: Rollout) -> str:
    """How an attempt ended: its boxed answer (normalised), or why it has none; for code, how it
    failed (failure label, exception or status, failing test line)."""
    if _is_code(rollout):
        return _code_key(rollout)
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
    kinds: dict[str, int] = field(default_factory=dict)  # code: failure label -> failed attempts of the group

    @classmethod
    def from_group(
        cls, group: Group, k: int = 3, previous_hints: list[str] | None = None, task: str = "math"
    ) -> FailureCase:
        answers: dict[str, int] = {}
        kinds: dict[str, int] = {}
        for r in group.rollouts:
            key = final_answer_key(r)
            answers[key] = answers.get(key, 0) + 1
            if not r.correct and (task == "code" or _is_code(r)):
                kinds[code_failure(r)] = kinds.get(code_failure(r), 0) + 1
        return cls(
            group.problem,
            choose_attempts(group.rollouts, k),
            len(group.rollouts),
            answers,
            task,
            list(previous_hints or []),
            kinds=kinds,
        )

    @property
    def is_code(self) -> bool:
        """A code problem: the code taxonomy, the code reference mentor, the code prompts."""
        return self.task == "code" or self.problem.code is not None

    @property
    def all_truncated(self) -> bool:
        return bool(self.attempts) and all(r.truncated for r in self.attempts)

    @property
    def no_answer_share(self) -> float:
        n = sum(v for key, v in self.answers.items() if key in ("<no answer>", "<truncated>", "<no code>"))
        return n / max(1, self.group_size)

    def render_attempts(self, head: int = 600, tail: int = 600) -> str:
        parts = []
        for i, r in enumerate(self.attempts, 1):
            note = r.verifier_note or ("stopped at the length limit" if r.truncated else "wrong final answer")
            sandbox = f"\n{render_sandbox(r)}" if self.is_code else ""
            parts.append(f"Attempt {i}:\n{truncate_middle(r.text, head, tail)}{sandbox}\nVerifier: {note}")
        return "\n\n".join(parts) if parts else "(none)"

    def render_answers(self) -> str:
        return ", ".join(f"{key} x{n}" for key, n in sorted(self.answers.items(), key=lambda kv: -kv[1]))


def render_sandbox(rollout: Rollout) -> str:
    """What the sandbox said about a code attempt: what the LLM diagnoser reads."""
    res = code_result(rollout)
    if res is None:
        return f"Sandbox: not run ({code_failure(rollout)})"
    lines = [
        f"Sandbox: {res.status}"
        + (f", {res.exception}" if res.exception else "")
        + (f": {res.message.strip()[:300]}" if res.message.strip() else "")
    ]
    if res.test_line.strip():
        lines.append(f"Failing test: {res.test_line.strip()}")
    lines.append(f"Failure kind: {code_failure(rollout)}")
    return "\n".join(lines)
