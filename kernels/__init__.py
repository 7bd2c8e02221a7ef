"""Fused GRPO kernels (installed as `mentor_fast.kernels`).

K0 `group_advantages` / `token_advantages`, K1 `token_logprobs` / `token_logprob_stats`,
K2 `grpo_loss` (from hidden states, never materialising [N, V] logits) and
`grpo_loss_from_logits` (for callers that hold logits), each with a plain-torch `*_ref` spec; the
per-token objective they all compute is `objective.token_objective`. Dispatch: CUDA -> Triton row
kernels; CPU -> chunked torch; `backend=` forces "triton" (interpreter on CPU), "torch" or "reference".

Names resolve on first use, so `from mentor_fast.kernels.enums import LossType` (what the config
schema does) imports neither torch nor triton, and nothing here ever imports triton up front.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "advantages": ["AGGREGATIONS", "aggregation_weights", "group_advantages", "group_advantages_ref", "sequence_weights",
                   "token_advantages"],
    "enums": ["AdvEstimator", "Aggregation", "Backend", "KLEstimator", "LossImpl", "LossType"],
    "grpo_logits": ["grpo_loss_from_logits", "grpo_loss_from_logits_ref"],
    "grpo_loss": ["grpo_loss", "grpo_loss_ref"],
    "logprobs": ["LogprobStats", "token_logprob_stats", "token_logprobs", "token_logprobs_ref"],
    "objective": ["KL_ESTIMATORS", "POLICY_LOSSES", "TokenInputs", "token_objective"],
    "options": ["GRPOLossOutput", "GRPOOptions"],
    "settings": ["AdvantageConfig", "LossConfig", "Range"],
}
_WHERE = {name: module for module, names in _EXPORTS.items() for name in names}
__all__ = [  # every name of _EXPORTS
    "AGGREGATIONS",
    "KL_ESTIMATORS",
    "POLICY_LOSSES",
    "AdvEstimator",
    "AdvantageConfig",
    "Aggregation",
    "Backend",
    "GRPOLossOutput",
    "GRPOOptions",
    "KLEstimator",
    "LogprobStats",
    "LossConfig",
    "LossImpl",
    "LossType",
    "Range",
    "TokenInputs",
    "aggregation_weights",
    "group_advantages",
    "group_advantages_ref",
    "grpo_loss",
    "grpo_loss_from_logits",
    "grpo_loss_from_logits_ref",
    "grpo_loss_ref",
    "sequence_weights",
    "token_advantages",
    "token_logprob_stats",
    "token_logprobs",
    "token_logprobs_ref",
    "token_objective",
]


def __getattr__(name: str):
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{_WHERE[name]}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
