"""Per-token weights on a sequence's policy term, from pi_old and the sampler's log-prob mu.

A method says how a rollout's tokens are weighed with `Rollout.weighting` (MENTOR's transfer and
shaping re-rolls, by their loss mode); the update computes the weights here, for any method,
without knowing which, and they replace the run's mismatch correction (`loss.is_mode`,
kernels/mismatch.py) for that rollout.
- truncated_is (param: cap c): min(pi_old / mu, c) per token; c = 0 means weight 1.
- shaping (param: gamma): gamma p / (p + gamma)^2 with p = pi_old, whatever mu was. At ratio 1 the
  clipped term's gradient times this weight is the gradient of LUFFY's shaped objective
  -A f(pi), f(p) = p / (p + gamma) (LUFFY, arXiv 2504.14945; tests/test_objective.py).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from mentor_fast.compat import StrEnum
from mentor_fast.kernels.enums import ISMode
from mentor_fast.kernels.mismatch import mismatch_weights


class Weighting(StrEnum):
    TRUNCATED_IS = "truncated_is"
    SHAPING = "shaping"


def _truncated_is(param: float, old: torch.Tensor, sampler: torch.Tensor) -> torch.Tensor:
    if param <= 0:
        return torch.ones_like(old)
    return mismatch_weights(old, sampler, ISMode.TOKEN_TRUNCATE, cap=param)  # the loss's own token rule


def _shaping(param: float, old: torch.Tensor, sampler: torch.Tensor) -> torch.Tensor:
    p = old.exp()
    return param * p / (p + param) ** 2


WEIGHTINGS: dict[Weighting, Callable[[float, torch.Tensor, torch.Tensor], torch.Tensor]] = {
    Weighting.TRUNCATED_IS: _truncated_is,
    Weighting.SHAPING: _shaping,
}


def token_policy_weights(kind: str, param: float, old_logp: torch.Tensor, sampler_logp: torch.Tensor) -> torch.Tensor:
    """old_logp [T], sampler_logp [T] of one sequence's tokens -> its weights [T] (detached)."""
    return WEIGHTINGS[Weighting(kind)](param, old_logp, sampler_logp)
