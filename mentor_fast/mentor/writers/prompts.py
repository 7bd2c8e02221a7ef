"""The LLM agents' chat messages, from templates: the shared ones in mentor/prompts/ (the system
text, the retry and rejection notes) and each task's own in its folder's prompts/ (diagnose, fused,
instruct, levels: code's hold the signature, the sandbox results of the attempts and the first
failing test beside the values every template has).
"""

from __future__ import annotations

import json
from functools import cache
from importlib import resources
from string import Template
from typing import TYPE_CHECKING, Any

from mentor_fast.mentor.diagnosis import Diagnosis
from mentor_fast.mentor.levels import MAX_WORDS
from mentor_fast.mentor.writers.base import Messages

if TYPE_CHECKING:
    from mentor_fast.mentor.cases import FailureCase
    from mentor_fast.mentor.task import MentorTask


@cache
def prompt(name: str, package: str = "mentor_fast.mentor") -> str:
    """A template from the package's prompts/<name>.txt (a task's: MentorTask.templates)."""
    return resources.files(package).joinpath("prompts", f"{name}.txt").read_text(encoding="utf-8")


def level_definitions(task: MentorTask) -> dict[int, str]:
    """The task's hint levels, as its templates define them."""
    return _levels(task.templates)


@cache
def _levels(package: str) -> dict[int, str]:
    lines = [ln.split(":", 1) for ln in prompt("levels", package).splitlines() if ln.strip()]
    return {int(k): v.strip() for k, v in lines}


def _template(case: FailureCase, name: str) -> Template:
    return Template(prompt(name, case.task.templates))


def _values(case: FailureCase, head: int, tail: int) -> dict[str, Any]:
    """What every template holds, and the task's own values over them."""
    p = case.problem
    return {
        "question": p.question,
        "gold": p.gold,
        "reference": "\n".join(p.solution_steps) or "(not available)",
        "num_failed": sum(case.answers.values()),
        "group_size": case.group_size,
        "answers": case.render_answers(),
        "attempts": case.render_attempts(head, tail),
        "previous": "\n".join(f"- {h}" for h in case.previous_hints) or "(none)",
        "labels": ", ".join(case.task.failures),
    } | case.task.prompt_values(case)


def _chat(user: str) -> Messages:
    # The shared system text and the problem first: all calls about a problem share a prefix.
    return [{"role": "system", "content": prompt("system").strip()}, {"role": "user", "content": user}]


def diagnose_messages(case: FailureCase, head: int = 600, tail: int = 600) -> Messages:
    return _chat(_template(case, "diagnose").substitute(_values(case, head, tail)))


def fused_messages(case: FailureCase, head: int = 600, tail: int = 600) -> Messages:
    defs = "\n".join(level_definitions(case.task)[lvl] for lvl in (1, 2, 3))
    words = ", ".join(str(MAX_WORDS[lvl] // 2) for lvl in (1, 2, 3))
    values = _values(case, head, tail) | {
        "level_definitions": defs,
        "max_words": f"{words} words for levels 1, 2, 3",
    }
    return _chat(_template(case, "fused").substitute(values))


def instruct_messages(
    case: FailureCase, diagnosis: Diagnosis, level: int, feedback: str | None = None
) -> Messages:
    values = _values(case, 0, 0) | {
        "diagnosis": json.dumps(diagnosis.to_dict(), ensure_ascii=False),
        "level_definition": level_definitions(case.task)[level],
        "max_words": f"{MAX_WORDS[level] // 2} words",  # half the guard's cap: models overshoot
        "feedback": Template(prompt("rejected")).substitute(reason=feedback).strip() if feedback else "",
    }
    return _chat(_template(case, "instruct").substitute(values))
