"""Recovering all-fail groups, for any method that helps them (MENTOR, Scaf-GRPO, LUFFY): which groups
and at which hint level (scheduler.py: budget, collapse detector, per-problem memory), the re-roll
rounds under prompt + hint (rerolls.py), one taken group's record (intervention.py), and how rescued
groups enter the batch (rescue.py). Nothing here writes a hint: MENTOR's come from mentor/, a static
method's from the data."""

from mentor_fast.recovery.intervention import Intervention
from mentor_fast.recovery.levels import MAX_LEVEL, MIN_LEVEL
from mentor_fast.recovery.rerolls import Escalate, GenerateFn, RerollRequest, Rerolls, Scorer
from mentor_fast.recovery.rescue import assemble_rescues, treat
from mentor_fast.recovery.scheduler import CollapseDetector, Scheduler, StepPlan, every_rank

__all__ = [
    "MAX_LEVEL",
    "MIN_LEVEL",
    "CollapseDetector",
    "Escalate",
    "GenerateFn",
    "Intervention",
    "RerollRequest",
    "Rerolls",
    "Scheduler",
    "Scorer",
    "StepPlan",
    "assemble_rescues",
    "every_rank",
    "treat",
]
