"""Code problems: a program checked by hidden tests in the sandbox (`Problem.code`, a CodeTask).

The mentor's part is mentor.py (taxonomy, how an attempt ended), attempts.py (an attempt through its
sandbox result), analysis.py (the group's analysis: signature, first failing test), gates.py and
outputs.py (the leak gates) and steps.py (the deterministic writer); its LLM templates are in prompts/.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from mentor_fast.tasks.base import Task, TaskKind
from mentor_fast.types import Problem

if TYPE_CHECKING:
    from mentor_fast.config.schema import DataConfig, RewardConfig
    from mentor_fast.rewards.verdict import Verifier

SYSTEM_PROMPT = (
    "You are a careful Python programmer. Think briefly about the task, then write the complete "
    "function in one ```python code block."
)


def reads(data: DataConfig) -> bool:
    return data.source in ("code_ladder", "humaneval") or data.format == "code"


def verifier(cfg: RewardConfig) -> Verifier:
    from mentor_fast.rewards.code import CodeVerifier

    return CodeVerifier(cfg.code)


def worked_solution(problem: Problem) -> str | None:
    """The reference program in one fenced block (the form rewards/program.py extracts)."""
    if problem.code is None or not problem.code.solution:
        return None
    return f"```python\n{problem.code.solution.strip()}\n```"


CODE = Task(
    kind=TaskKind.CODE,
    system_prompt=SYSTEM_PROMPT,
    reads=reads,
    ladder="code_ladder",
    data_help="data.source=code_ladder or humaneval, or data.format=code",
    owns=lambda problem: problem.code is not None,
    verifier=verifier,
    worked_solution=worked_solution,
)
