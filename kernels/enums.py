"""The names every part of the project shares for the objective's variants: one StrEnum each.

The config schema (mentor_fast.config), the trainer's algorithms (mentor_fast.algo) and the kernels
all use these, so a value accepted in a YAML file is exactly a value the kernels implement. This
module imports nothing heavy (no torch), so the config loads without torch.
"""

from __future__ import annotations

from mentor_fast.compat import StrEnum


class LossType(StrEnum):
    """The policy term per token (kernels/objective.py); the aggregation is separate (Aggregation).
    TRL's loss_type names both at once: its grpo, bnpo, dr_grpo and dapo are all `clip` here, with
    the aggregations seq_mean_token_mean, token_mean_micro, constant and token_mean."""

    CLIP = "clip"  # PPO's clipped surrogate on the token ratio (GRPO, DAPO, Dr. GRPO)
    GSPO = "gspo"  # the clipped surrogate on the length-normalised sequence ratio
    CISPO = "cispo"  # REINFORCE with the ratio clipped from above and detached (MiniMax-M1)
    SAPO = "sapo"  # a sigmoid gate on the ratio in place of the hard clip (Qwen's SAPO)


class KLEstimator(StrEnum):
    """Per-token estimators of KL(pi || ref) from d = logp - ref (Schulman's k1, k2, k3)."""

    K1 = "k1"  # d
    K2 = "k2"  # d^2 / 2
    K3 = "k3"  # exp(-d) + d - 1


class AdvEstimator(StrEnum):
    """Group-relative advantage from a group's rewards r, mean mu, std sigma."""

    GRPO = "grpo"  # (r - mu) / (sigma + eps)
    DR_GRPO = "dr_grpo"  # r - mu
    BATCH = "batch"  # (r - mu) / (batch std + eps)
    RLOO = "rloo"  # G / (G - 1) (r - mu)


class Aggregation(StrEnum):
    """How token losses add up to the loss, as a weight per token: loss = sum_t w_t l_t."""

    TOKEN_MEAN = "token_mean"  # over every token of the optimizer step's batch [TRL dapo]
    TOKEN_MEAN_MICRO = "token_mean_micro"  # over the tokens of each micro-batch [TRL bnpo]
    SEQ_MEAN_TOKEN_MEAN = "seq_mean_token_mean"  # token mean per sequence, then mean [TRL grpo]
    SEQ_MEAN_TOKEN_SUM = "seq_mean_token_sum"  # token sum per sequence, then mean
    CONSTANT = "constant"  # token sum / (sequences x max length) [TRL dr_grpo]


class Backend(StrEnum):
    """Where the row work of a loss or log-prob call runs (the `backend=` of the kernels)."""

    TRITON = "triton"  # Triton row kernels (+ cuBLAS GEMMs); on a CPU only under TRITON_INTERPRET=1
    GEMM = "gemm"  # a Triton LM-head GEMM with the row statistics in its epilogue (kernels/gemm_head.py)
    TORCH = "torch"  # chunked torch: the CPU default
    REFERENCE = "reference"  # plain torch on materialised logits: the specification and the vanilla baseline


class LossImpl(StrEnum):
    """How a run computes its loss (`loss.impl`): a backend, or the fused ops' choice of one."""

    REFERENCE = "reference"
    FUSED = "fused"
    FUSED_GEMM = "fused_gemm"

    @property
    def backend(self) -> Backend | None:
        """The kernels' `backend=` for this impl (None: chosen by the device, `resolve_backend`)."""
        return IMPL_BACKENDS[self]


IMPL_BACKENDS: dict[LossImpl, Backend | None] = {
    LossImpl.REFERENCE: Backend.REFERENCE,
    LossImpl.FUSED: None,
    LossImpl.FUSED_GEMM: Backend.GEMM,
}


class ISMode(StrEnum):
    """How the sampler/trainer mismatch ratio pi_old / mu weighs the policy term (TRL's names)."""

    TOKEN_TRUNCATE = "token_truncate"  # each token's ratio, clipped into [floor, cap]
    TOKEN_MASK = "token_mask"  # each token's ratio, zeroed outside [floor, cap] (IcePop with a floor)
    SEQUENCE_TRUNCATE = "sequence_truncate"  # the sequence's ratio (product over its tokens), clipped
    SEQUENCE_MASK = "sequence_mask"  # the sequence's ratio, the whole sequence zeroed outside the bounds
