"""Math problems: a final answer in \\boxed{}, checked against the gold answer by math-verify.

The mentor's part is mentor.py (taxonomy, how an attempt ended), gates.py (the leak gates) and
steps.py (the deterministic writer, from the worked solution); its LLM templates are in prompts/.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from mentor_fast.tasks.base import Task, TaskKind
from mentor_fast.types import Problem

if TYPE_CHECKING:
    from mentor_fast.config.schema import DataConfig, RewardConfig
    from mentor_fast.rewards.verdict import Verifier

SYSTEM_PROMPT = (
    "You are a careful math tutor. Solve the problem step by step, then give the final answer in \\boxed{}."
)


def reads(data: DataConfig) -> bool:
    return data.source in ("ladder", "jsonl", "file", "dataset") and data.format != "code"


def verifier(cfg: RewardConfig) -> Verifier:
    from mentor_fast.rewards.pool import MathVerifierPool

    return MathVerifierPool(workers=cfg.workers, timeout_s=cfg.timeout_s)


def worked_solution(problem: Problem) -> str | None:
    """The steps, then the boxed answer; None for a bare answer (no steps: no solution to learn)."""
    if not problem.solution_steps:
        return None
    return "\n".join(problem.solution_steps) + f"\nThe answer is \\boxed{{{problem.gold}}}."


MATH = Task(
    kind=TaskKind.MATH,
    system_prompt=SYSTEM_PROMPT,
    reads=reads,
    ladder="ladder",
    data_help="data.source=ladder, or a JSONL/table file of math rows (data.format auto, gsm8k, math or plain)",
    owns=lambda problem: problem.code is None,
    verifier=verifier,
    worked_solution=worked_solution,
)
