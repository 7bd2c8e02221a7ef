"""The `method`, `scaf.*` and `luffy.*` parts of the run's configuration schema (config/schema.py):
which method helps the groups that fail, and the settings of the two baselines MENTOR is compared
with. Every method spends the budget of `recovery.*` (recovery.trigger: how many groups a step;
recovery.reroll: re-rolls per group and when they run), so the methods can be compared at equal
generation."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from mentor_fast.compat import StrEnum
from mentor_fast.kernels.settings import Range


class MethodKind(StrEnum):
    """`method`: what the trainer does with a group whose rollouts all fail (mentor_fast/method.py)."""

    AUTO = "auto"  # mentor when mentor.enable, else grpo
    GRPO = "grpo"
    MENTOR = "mentor"
    SCAF = "scaf"
    LUFFY = "luffy"


@dataclass
class ScafConfig:
    """method=scaf: Scaf-GRPO's static tiered hints (arXiv 2510.19807; mentor_fast/baselines/scaf.py).
    A failed group is re-rolled under the problem's knowledge, then planning, then solution-prefix
    hint, one tier a round, until a re-roll succeeds; it replaces one failed rollout and is trained
    in the hinted context. Re-rolls per round, groups per step and the schedule are recovery.reroll.count,
    recovery.trigger.* and recovery.reroll.schedule."""

    exempt_frac: Annotated[float, Range(ge=0, lt=1)] = 0.15
    """No hints in the first exempt_frac x trainer.max_steps steps (the paper's exemption period)."""


@dataclass
class LuffyConfig:
    """method=luffy: LUFFY's off-policy guidance (arXiv 2504.14945; mentor_fast/baselines/luffy.py).
    The problem's worked solution, tokenized as the policy would write it, replaces one rollout of a
    failed group and is trained under the bare prompt with the shaping weight f(p) = p / (p + gamma),
    no importance ratio. Groups per step: recovery.trigger.*; one expert trace per group."""

    gamma: Annotated[float, Range(gt=0)] = 0.1
    """gamma of the policy-shaping function f(p) = p / (p + gamma)."""
