"""The `mentor.*` part of the run's configuration schema (config/schema.py): when MENTOR steps in,
who writes the hints, how the policy re-tries, and how a rescued group enters the loss."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal


@dataclass
class TriggerConfig:
    """When MENTOR steps in, for how many groups, and at which hint level (mentor/scheduler.py)."""

    max_groups_frac: float = 0.5
    """Share of a step's groups the mentor may take (all-fail groups only)."""
    surge_groups_frac: float = 1.0
    """Share allowed while a collapse surge is open."""
    surge_steps: int = 10
    """How long a surge stays open after a collapse event."""
    collapse_delta: float = 0.2
    """A collapse event: the all-fail fraction exceeds its EMA by more than this ..."""
    collapse_abs: float = 0.6
    """... or the all-fail fraction exceeds this ..."""
    collapse_patience: int = 1
    """... for this many consecutive steps."""
    ema: float = 0.8
    """EMA decay of the all-fail fraction."""
    exempt_steps: int = 0
    """No interventions before this step unless a collapse surge is open."""
    start_level: int = 1
    """First hint level (1 conceptual pointer, 2 plan, 3 concrete first step); a problem a hint has
    rescued starts one level lower next time."""


@dataclass
class AgentsConfig:
    """Who diagnoses a failed group and writes its hint (mentor/backends.py), and their limits."""

    backend: Literal["reference", "self", "local", "openai"] = "reference"
    """reference: deterministic, from the data's worked solutions (no LLM); self: the policy through
    the rollout engine; local: a second local model (`model_path`); openai: an OpenAI-compatible
    endpoint (`base_url`, `model`)."""
    timeout_s: float = 60.0
    """Time limit of a step's hint writing; a group past it gets no hint, counted."""
    fused_call: bool = True
    """LLM backends: diagnose and instruct in one call."""
    temperature: float = 0.7
    """LLM backends: sampling temperature of the mentor (0 = greedy)."""
    max_tokens: int = 512
    """LLM backends: token limit of a diagnosis."""
    hint_max_tokens: int = 256
    """LLM backends: token limit of one hint."""
    attempts: int = 3
    """Failed attempts shown to the diagnoser (chosen to cover distinct final answers)."""
    attempt_chars: int = 1200
    """Each attempt is cut to this many characters (head + tail)."""
    model_path: str = ""
    """backend=local: a local HF model folder (or a built-in model name)."""
    base_url: str = "http://127.0.0.1:8000/v1"
    """backend=openai: the endpoint."""
    model: str = ""
    """backend=openai: the served model's name."""
    api_key_env: str = "OPENAI_API_KEY"
    """backend=openai: environment variable holding the key (may be unset for local servers)."""
    retries: int = 1
    """backend=openai: retries per call (transient errors only)."""
    concurrency: int = 4
    """backend=openai: concurrent requests."""


@dataclass
class RerollConfig:
    """How the policy re-tries a hinted group (mentor/pipeline.py, mentor/method.py)."""

    count: int = 4
    """M: re-rolls per hinted group per round (loss.mode=group uses G)."""
    max_rounds: int = 2
    """Rounds; a group with no success after a round is re-hinted one level higher."""
    max_staleness: int = 1
    """Async: drop hints whose failed rollouts are more than this many policy versions old."""
    horizon: float = 0.0
    """Async (HF engine): the first re-roll round rides in the next step's generate call; a re-roll
    still running when the call's initial rollouts have all ended may decode up to this many times
    the longest of them, then is cut and dropped (mentor/rerolls_cut). 0: off; else >= 1. Cuts bias
    the re-rolls that count toward short ones. Not with loss.mode=group, which needs a full group."""
    when: Literal["next_step", "during_update"] = "next_step"
    """Async: when the first re-roll round of step t's hints is generated. next_step: in step t+1's
    initial generate call, by the updated policy (on-policy; the only choice with a colocated,
    sleeping engine, where nothing generates during the update). during_update: in the background
    while step t's update runs, by the policy before it (one version off-policy, within
    max_staleness, corrected by loss.is_cap): the overlap an engine on GPUs of its own allows
    (rollout.engine=vllm, vllm_sleep_level=0). Later rounds run at t+1 either way."""
    budget: Literal["extra", "shared"] = "extra"
    """Async: where the riding round's rows come from. extra: on top of the step's prompts_per_step
    x num_generations rows. shared: out of them; the step draws its prompts as usual and skips the
    last ceil(rows / num_generations) (mentor/prompts_skipped; at least one prompt stays), so the
    call decodes about as many rows as vanilla GRPO's. MENTOR then costs fresh prompts instead of
    decode time. Later rounds (max_rounds > 1) are always extra."""


@dataclass
class MentorLossConfig:
    """How a rescued group enters the loss (algo/assemble.py; the update reads it as data)."""

    mode: Literal["replace", "group", "transfer", "shaping"] = "replace"
    """replace: successful re-rolls replace failures of the group, trained under q + hint; group: the
    group is re-rolled under q + hint; transfer: as replace, trained under q with truncated IS
    (transfer_is_cap); shaping: as transfer, with LUFFY's shaping weight instead (shaping_gamma)."""
    max_replace: int = 1
    """Successful re-rolls inserted per rescued group (replace, transfer, shaping)."""
    transfer_is_cap: float = 1.0
    """mode=transfer: cap on each token's weight pi_old(y|q) / mu(y|q + hint)."""
    shaping_gamma: float = 0.1
    """mode=shaping: gamma of f(p) = p / (p + gamma); a token's weight is gamma p / (p + gamma)^2."""
    distill_coef: float = 0.0
    """lambda of self-distillation: each inserted re-roll also pulls the bare prompt's next-token
    distribution toward the hinted one along its tokens (forward KL; 0: off). Any mode but group."""


@dataclass
class MentorConfig:
    enable: bool = False
    """Run MENTOR on groups whose initial rollouts all fail."""
    async_: bool = True
    """Write step t's hints in the background during its update; their first re-roll round rides in
    step t+1's generate call, from the next policy version (key: mentor.async). false: diagnose,
    hint and re-roll within the step."""
    task: Literal["auto", "math", "code"] = "auto"
    """Failure taxonomy and leak-guard gates to use; auto: reward.kind's."""
    dump: bool = True
    """Write one JSONL row per intervention to mentor.jsonl."""
    trigger: TriggerConfig = field(default_factory=TriggerConfig)
    agents: AgentsConfig = field(default_factory=AgentsConfig)
    reroll: RerollConfig = field(default_factory=RerollConfig)
    loss: MentorLossConfig = field(default_factory=MentorLossConfig)
