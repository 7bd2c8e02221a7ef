"""Fused GRPO kernels (installed as `mentor_fast.kernels`).

K0 `group_advantages` / `token_advantages`, K1 `token_logprobs` / `token_logprob_stats`,
K2 `grpo_loss` (from hidden states, never materialising [N, V] logits) and
`grpo_loss_from_logits` (for callers that hold logits), each with a plain-torch `*_ref` spec.
Dispatch: CUDA -> Triton row kernels; CPU -> chunked torch; `backend=` forces "triton"
(interpreter on CPU), "torch" or "ref". Importing this package never imports triton.
"""

from .advantages import aggregation_weights, group_advantages, group_advantages_ref, token_advantages
from .grpo_logits import grpo_loss_from_logits, grpo_loss_from_logits_ref
from .grpo_loss import grpo_loss, grpo_loss_ref
from .logprobs import LogprobStats, token_logprob_stats, token_logprobs, token_logprobs_ref
from .options import AdvEstimator, Backend, GRPOLossOutput, GRPOOptions, KLEstimator, LossType
from .token_math import KL_ESTIMATORS, POLICY_LOSSES

__all__ = [
    "KL_ESTIMATORS",
    "POLICY_LOSSES",
    "AdvEstimator",
    "Backend",
    "GRPOLossOutput",
    "GRPOOptions",
    "KLEstimator",
    "LogprobStats",
    "LossType",
    "aggregation_weights",
    "group_advantages",
    "group_advantages_ref",
    "grpo_loss",
    "grpo_loss_from_logits",
    "grpo_loss_from_logits_ref",
    "grpo_loss_ref",
    "token_advantages",
    "token_logprob_stats",
    "token_logprobs",
    "token_logprobs_ref",
]
