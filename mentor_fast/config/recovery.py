"""The `recovery.*` part of the run's configuration schema (config/schema.py): the budget every
method that helps all-fail groups spends (mentor, scaf, luffy; mentor_fast/recovery/), so the methods
can be compared at equal generation: which groups a step it takes (`trigger`) and how the policy
re-tries them (`reroll`). Earlier configs spell them mentor.trigger and mentor.reroll; the loader
reads those as these (config/loader.py ALIASES)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated

from mentor_fast.compat import StrEnum
from mentor_fast.kernels.settings import Range


@dataclass
class TriggerConfig:
    """When a method steps in, for how many groups, and at which hint level (recovery/scheduler.py)."""

    max_groups_frac: Annotated[float, Range(ge=0, le=1)] = 0.5
    """Share of a step's groups the method may take (all-fail groups only)."""
    surge_groups_frac: Annotated[float, Range(ge=0, le=1)] = 1.0
    """Share allowed while a collapse surge is open."""
    surge_steps: Annotated[int, Range(ge=0)] = 10
    """How long a surge stays open after a collapse event."""
    collapse_delta: Annotated[float, Range(ge=0)] = 0.2
    """A collapse event: the all-fail fraction exceeds its EMA by more than this ..."""
    collapse_abs: Annotated[float, Range(ge=0, le=1)] = 0.6
    """... or the all-fail fraction exceeds this ..."""
    collapse_patience: Annotated[int, Range(ge=1)] = 1
    """... for this many consecutive steps."""
    ema: Annotated[float, Range(ge=0, lt=1)] = 0.8
    """EMA decay of the all-fail fraction."""
    exempt_steps: Annotated[int, Range(ge=0)] = 0
    """No interventions before this step unless a collapse surge is open."""
    start_level: Annotated[int, Range(ge=1, le=3)] = 1
    """First hint level (1 conceptual pointer, 2 plan, 3 concrete first step); a problem a hint has
    rescued starts one level lower next time."""


class RerollSchedule(StrEnum):
    """recovery.reroll.schedule: when a step's re-rolls are generated, and in whose rows."""

    IN_STEP = "in_step"
    NEXT_STEP_EXTRA_ROWS = "next_step_extra_rows"
    NEXT_STEP_SHARED_ROWS = "next_step_shared_rows"
    DURING_UPDATE = "during_update"


@dataclass
class RerollConfig:
    """How and when the policy re-tries a hinted group (recovery/rerolls.py, mentor/method.py)."""

    count: Annotated[int, Range(ge=1)] = 4
    """M: re-rolls per hinted group per round (mentor.loss.mode=group uses G)."""
    max_rounds: Annotated[int, Range(ge=1)] = 2
    """Rounds; a group with no success after a round is re-hinted one level higher."""
    max_staleness: Annotated[int, Range(ge=0)] = 1
    """Hints written beside an update are dropped when their failed rollouts are more than this many
    policy versions old (mentor/stale_dropped)."""
    schedule: RerollSchedule = RerollSchedule.NEXT_STEP_EXTRA_ROWS
    """When step t's hints and their first re-roll round are made, and in whose rows.
    in_step: within step t, by the policy that failed (on-policy; the update waits for them).
    next_step_extra_rows: the hints are written in a background thread while t's update runs; the
    first round rides in step t+1's initial generate call, by the updated policy, on top of its
    prompts_per_step x num_generations rows.
    next_step_shared_rows: as next_step_extra_rows, but the round takes the rows of t+1's last
    ceil(rows / num_generations) prompts (mentor/prompts_skipped; one prompt always stays), so the
    call decodes about as many rows as vanilla GRPO's: MENTOR costs fresh prompts, not decode time.
    during_update: the hints and their first round are made in the background while t's update
    runs, by the policy before it (one version off-policy, within max_staleness, corrected as
    loss.is_mode says), for an engine on GPUs of its own (rollout.engine=vllm, vllm_sleep_level=0).
    Later rounds (max_rounds > 1) run in calls of their own: within t for in_step, at t+1 else."""
    horizon: Annotated[float, Range(ge=1, also=(0,))] = 0.0
    """schedule=next_step_*, HF engine: a riding re-roll still running when the call's initial
    rollouts have all ended may decode up to this many times the longest of them, then is cut and
    dropped (mentor/rerolls_cut). 0: off; else >= 1. Cuts bias the re-rolls that count toward short
    ones. Not with mentor.loss.mode=group, which needs a full group."""


@dataclass
class RecoveryConfig:
    """The budget of the method that helps all-fail groups (method=mentor, scaf or luffy)."""

    trigger: TriggerConfig = field(default_factory=TriggerConfig)
    """Which all-fail groups a step the method takes, and at which hint level."""
    reroll: RerollConfig = field(default_factory=RerollConfig)
    """How many times and when the policy re-tries a hinted group (luffy inserts, never re-rolls)."""
