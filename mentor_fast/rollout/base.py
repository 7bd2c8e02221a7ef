"""The rollout engine protocol. Trainer and mentor cannot tell engines apart except by speed."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch

from mentor_fast.types import Sample


@dataclass(frozen=True)
class SamplingParams:
    """Per-call sampling settings (the same for initial rollouts and mentor re-rolls)."""

    n: int = 8  # samples per context
    max_new_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int = 0  # engines derive per-(context, sample) seeds from this
    greedy: bool = False  # temperature 0; n must be 1
    keys: tuple[int, ...] | None = None
    """Each prompt's stream key, in place of its position in the call: the trainer passes global
    prompt indices (and the mentor group ids), so a prompt samples the same on any number of ranks."""
    horizon: float = 0.0
    """A request after the first of a `generate_many` call (a rider): once every row of the first
    request has ended, a row of this one still decoding is cut at `horizon` times the longest of
    them (finish_reason "cut", the tokens so far), so a few long riders cannot keep the call
    running. 0: never cut; else >= 1. Cutting rows mid-decode needs the decode loop itself, so it
    is the engine's to do: the HF engine does it, the vLLM engines (whose scheduler finishes what it
    admitted) refuse a request with a horizon."""

    def key(self, i: int) -> int:
        return self.keys[i] if self.keys is not None else i


@runtime_checkable
class RolloutEngine(Protocol):
    """Generates n samples per context, with the sampler's per-token log-probs.

    Every engine implements every method; a request an engine cannot serve (a horizon on vLLM) it
    refuses with a ValueError, so callers never probe for methods."""

    @property
    def policy_version(self) -> int:
        """Version of the weights the engine currently samples from (0 = initial weights)."""
        ...

    @property
    def max_context_tokens(self) -> int:
        """Longest prompt + completion the engine accepts."""
        ...

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[list[Sample]]:
        """prompts: B token-id lists -> B lists of `params.n` Samples, in order."""
        ...

    def generate_many(self, requests: list[Request], *, tag: str = "initial") -> list[list[list[Sample]]]:
        """Several requests (differing only in n, seed, keys and horizon) in one decode loop, each
        served as its own `generate` call would serve it, unless cut at its horizon: rows added to a
        running batch cost less than a second pass over the weights. tag: the phase ("initial",
        "reroll", ...) for engines that count prefix-cache hits per phase."""
        ...

    def update_weights(self, model: torch.nn.Module, version: int) -> None:
        """Load the trainer's current weights; afterwards `policy_version == version`."""
        ...

    def sleep(self) -> None:
        """Free the device for the update (vLLM's sleep mode when configured, else nothing); the
        next update_weights (or generate) wakes the engine."""
        ...

    def pop_metrics(self) -> dict[str, float]:
        """The engine's own metrics since the last call (e.g. prefix-cache hit rates); may be empty."""
        ...

    def close(self) -> None:
        ...


Request = tuple[list[list[int]], SamplingParams]  # (prompts, params) as `generate` takes them


class EngineError(RuntimeError):
    """A rollout engine failed in a way the run cannot continue from (weight sync, start-up)."""


def check_request(prompts: list[list[int]], params: SamplingParams, max_context_tokens: int) -> None:
    """Shared request validation: engines never truncate a prompt or silently change n."""
    if params.n < 1:
        raise ValueError(f"SamplingParams.n must be >= 1, got {params.n}")
    if params.keys is not None and len(params.keys) != len(prompts):
        raise ValueError(f"SamplingParams.keys has {len(params.keys)} entries for {len(prompts)} prompts")
    if params.greedy and params.n != 1:
        raise ValueError(f"greedy decoding gives one sample per prompt; got n={params.n}")
    if not params.greedy and not (params.temperature > 0 and 0 < params.top_p <= 1):
        raise ValueError(f"need temperature > 0 and top_p in (0, 1]; got {params}")
    limit = max_context_tokens - params.max_new_tokens
    for i, p in enumerate(prompts):
        if not p:
            raise ValueError(f"prompt {i} is empty")
        if len(p) > limit:
            raise ValueError(
                f"prompt {i} has {len(p)} tokens; with max_new_tokens={params.max_new_tokens} the "
                f"limit is {limit} (max_context_tokens={max_context_tokens}). Drop or shorten it; "
                "the engine does not truncate."
            )


def check_mergeable(requests: list[Request]) -> None:
    """Requests served by one decode loop may differ in n, seed, keys and horizon only; the first
    leads (a horizon is measured against its rows), so it has none."""
    shared = {(p.max_new_tokens, p.temperature, p.top_p, p.greedy) for _, p in requests}
    if len(shared) > 1:
        raise ValueError(
            "requests merged into one generate call must share max_new_tokens, temperature, top_p and "
            f"greedy (they may differ in n, seed and keys, and a rider in its horizon); got {sorted(shared)}"
        )
    for i, (_, p) in enumerate(requests):
        if p.horizon and (i == 0 or p.horizon < 1):
            raise ValueError(f"request {i} has horizon {p.horizon}: a horizon is 0 (off) or >= 1, and the "
                             "first request of a call, which the others are measured against, has none")


def refuse_horizon(requests: list[Request], engine: str) -> None:
    """For engines that cannot cut rows mid-decode (their scheduler finishes what it admitted)."""
    if any(p.horizon for _, p in requests):
        raise ValueError(f"the {engine} engine cannot cut rows mid-call (a request with a horizon); "
                         "use rollout.engine=hf")
