"""The `mentor.*` part of the run's configuration schema (config/schema.py): when MENTOR steps in,
who writes the hints, how the policy re-tries, and how a rescued group enters the loss."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Literal

from mentor_fast.compat import StrEnum
from mentor_fast.kernels.settings import Range


@dataclass
class TriggerConfig:
    """When MENTOR steps in, for how many groups, and at which hint level (recovery/scheduler.py)."""

    max_groups_frac: Annotated[float, Range(ge=0, le=1)] = 0.5
    """Share of a step's groups the mentor may take (all-fail groups only)."""
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


class BackendKind(StrEnum):
    """mentor.agents.backend: who writes the hints (mentor/backends.py)."""

    WORKED_SOLUTIONS = "worked_solutions"
    SELF = "self"
    LOCAL = "local"
    OPENAI = "openai"


@dataclass
class AgentsConfig:
    """Who diagnoses a failed group and writes its hint (mentor/backends.py), and their limits."""

    backend: BackendKind = BackendKind.WORKED_SOLUTIONS
    """worked_solutions: deterministic, from the data's worked solutions (no LLM); self: the policy through
    the rollout engine; local: a second local model (`model_path`); openai: an OpenAI-compatible
    endpoint (`base_url`, `model`)."""
    timeout_s: Annotated[float, Range(gt=0)] = 60.0
    """Time limit of a step's hint writing; a group past it gets no hint, counted."""
    fused_call: bool = True
    """LLM backends: diagnose and instruct in one call."""
    temperature: Annotated[float, Range(ge=0)] = 0.7
    """LLM backends: sampling temperature of the mentor (0 = greedy)."""
    max_tokens: Annotated[int, Range(ge=1)] = 512
    """LLM backends: token limit of a diagnosis."""
    hint_max_tokens: Annotated[int, Range(ge=1)] = 256
    """LLM backends: token limit of one hint."""
    blind: bool = False
    """The writer never sees the failed attempts: it diagnoses and hints from the problem and its
    worked solution alone, as it would before any attempt (an ablation: what the diagnosis of the
    failures adds; mentor/writers/blind.py)."""
    attempts: Annotated[int, Range(ge=1)] = 3
    """Failed attempts shown to the diagnoser (chosen to cover distinct final answers)."""
    attempt_chars: Annotated[int, Range(ge=2)] = 1200
    """Each attempt is cut to this many characters (head + tail)."""
    model_path: str = ""
    """backend=local: a local HF model folder (or a built-in model name)."""
    base_url: str = "http://127.0.0.1:8000/v1"
    """backend=openai: the endpoint."""
    model: str = ""
    """backend=openai: the served model's name."""
    api_key_env: str = "OPENAI_API_KEY"
    """backend=openai: environment variable holding the key (may be unset for local servers)."""
    retries: Annotated[int, Range(ge=0)] = 1
    """backend=openai: retries per call (transient errors only)."""
    concurrency: Annotated[int, Range(ge=1)] = 4
    """backend=openai: concurrent requests."""


class RerollSchedule(StrEnum):
    """mentor.reroll.schedule: when a step's re-rolls are generated, and in whose rows."""

    IN_STEP = "in_step"
    NEXT_STEP_EXTRA_ROWS = "next_step_extra_rows"
    NEXT_STEP_SHARED_ROWS = "next_step_shared_rows"
    DURING_UPDATE = "during_update"


@dataclass
class RerollConfig:
    """How and when the policy re-tries a hinted group (recovery/rerolls.py, mentor/method.py)."""

    count: Annotated[int, Range(ge=1)] = 4
    """M: re-rolls per hinted group per round (loss.mode=group uses G)."""
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
    ones. Not with loss.mode=group, which needs a full group."""


@dataclass
class MentorLossConfig:
    """How a rescued group enters the loss (algo/assemble.py; the update reads it as data)."""

    mode: Literal["replace", "group", "transfer", "shaping"] = "replace"
    """replace: successful re-rolls replace failures of the group, trained under q + hint; group: the
    group is re-rolled under q + hint; transfer: as replace, trained under q with truncated IS
    (transfer_is_cap); shaping: as transfer, with LUFFY's shaping weight instead (shaping_gamma)."""
    max_replace: Annotated[int, Range(ge=1)] = 1
    """Successful re-rolls inserted per rescued group (replace, transfer, shaping)."""
    transfer_is_cap: Annotated[float, Range(gt=0)] = 1.0
    """mode=transfer: cap on each token's weight pi_old(y|q) / mu(y|q + hint)."""
    shaping_gamma: Annotated[float, Range(gt=0)] = 0.1
    """mode=shaping: gamma of f(p) = p / (p + gamma); a token's weight is gamma p / (p + gamma)^2."""
    distill_coef: Annotated[float, Range(ge=0)] = 0.0
    """lambda of self-distillation: each inserted re-roll also pulls the bare prompt's next-token
    distribution toward the hinted one along its tokens (forward KL; 0: off). Any mode but group."""


@dataclass
class MentorConfig:
    enable: bool = False
    """Run MENTOR on groups whose initial rollouts all fail."""
    task: Literal["auto", "math", "code"] = "auto"
    """Failure taxonomy and leak-guard gates to use; auto: reward.kind's."""
    dump: bool = True
    """Write one JSONL row per intervention to mentor.jsonl."""
    trigger: TriggerConfig = field(default_factory=TriggerConfig)
    agents: AgentsConfig = field(default_factory=AgentsConfig)
    reroll: RerollConfig = field(default_factory=RerollConfig)
    loss: MentorLossConfig = field(default_factory=MentorLossConfig)
