"""The `mentor.*` part of the run's configuration schema (config/schema.py): who writes MENTOR's
hints and how a rescued group enters the loss. When a method steps in and how the policy re-tries
are every method's budget, `recovery.*` (config/recovery.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Literal

from mentor_fast.compat import StrEnum
from mentor_fast.kernels.settings import Range


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
    dump: bool = True
    """Write one JSONL row per intervention to mentor.jsonl."""
    agents: AgentsConfig = field(default_factory=AgentsConfig)
    loss: MentorLossConfig = field(default_factory=MentorLossConfig)
