"""Who writes diagnoses and hints: a registry keyed by `BackendKind` (mentor.agents.backend).

- worked_solutions: deterministic, no LLM (`WorkedSolutions`); the CPU and CI default.
- self: the policy itself through the rollout engine (same weights the learner samples from).
- local: a second local HF model folder through transformers `generate`.
- openai: any OpenAI-compatible chat endpoint (`OpenAIBackend`).
The LLM kinds implement `MentorBackend.complete(batch, max_tokens, temperature) -> [str | None]`
and are wrapped in `LLMAgents`; `worked_solutions` implements the agents directly.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from mentor_fast.config import AgentsConfig
from mentor_fast.config.mentor import BackendKind
from mentor_fast.mentor.writers.base import Agents, MentorBackend
from mentor_fast.mentor.writers.llm import LLMAgents
from mentor_fast.mentor.writers.local import LocalBackend, SelfBackend
from mentor_fast.mentor.writers.openai import OpenAIBackend
from mentor_fast.mentor.writers.solutions import WorkedSolutions

if TYPE_CHECKING:  # the rollout package imports torch; the mentor stays light until a backend needs it
    from mentor_fast.rollout.base import RolloutEngine


def _worked_solutions(cfg: AgentsConfig, **_: Any) -> WorkedSolutions:
    return WorkedSolutions()


def _self(
    cfg: AgentsConfig, *, engine: RolloutEngine | None = None, tokenizer: Any = None, seed: int = 0, **_: Any
) -> SelfBackend:
    if engine is None or tokenizer is None:
        raise ValueError(
            "mentor.agents.backend=self needs the rollout engine and tokenizer (build_backend(engine=, tokenizer=))"
        )
    return SelfBackend(engine, tokenizer, seed=seed)


def _local(cfg: AgentsConfig, *, device: str = "cpu", seed: int = 0, **_: Any) -> LocalBackend:
    if not cfg.model_path:
        raise ValueError("mentor.agents.backend=local needs mentor.agents.model_path (a local HF model folder)")
    return LocalBackend(cfg.model_path, device=device, seed=seed)


def _openai(cfg: AgentsConfig, **_: Any) -> OpenAIBackend:
    if not cfg.model:
        raise ValueError("mentor.agents.backend=openai needs mentor.agents.model (the served model's name)")
    return OpenAIBackend(
        cfg.base_url,
        cfg.model,
        api_key_env=cfg.api_key_env,
        timeout_s=cfg.timeout_s,
        retries=cfg.retries,
        concurrency=cfg.concurrency,
    )


BACKENDS: dict[BackendKind, Callable[..., MentorBackend | WorkedSolutions]] = {
    BackendKind.WORKED_SOLUTIONS: _worked_solutions,
    BackendKind.SELF: _self,
    BackendKind.LOCAL: _local,
    BackendKind.OPENAI: _openai,
}


def build_backend(cfg: AgentsConfig, **kwargs: Any) -> MentorBackend | WorkedSolutions:
    """The backend named by `cfg.backend`. kwargs: engine, tokenizer (self), device (local), seed."""
    return BACKENDS[BackendKind(cfg.backend)](cfg, **kwargs)


def as_agents(
    backend: MentorBackend | WorkedSolutions | Agents,
    *,
    fused: bool = True,
    temperature: float = 0.7,
    **kwargs: Any,
) -> Agents:
    """Agents over a backend: text backends get the LLM Diagnoser/Instructor, others are agents."""
    if hasattr(backend, "diagnose"):
        return backend  # type: ignore[return-value]
    return LLMAgents(backend, fused=fused, temperature=temperature, **kwargs)  # type: ignore[arg-type]
