"""The GRPO objective in plain torch (DESIGN.md section 4): the reference the fused kernels must match.

Everything works on packed completion tokens: N tokens of S sequences, `seq_index[N]` says which
sequence a token belongs to. Aggregation is expressed as per-token weights w (loss = sum_t w_t l_t),
computed once for the optimizer step's whole batch, so splitting it into micro-batches never
changes the gradient.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum

import torch

from mentor_fast.config import LossConfig


class Aggregation(StrEnum):
    TOKEN_MEAN = "token_mean"
    TOKEN_MEAN_MICRO = "token_mean_micro"
    SEQ_MEAN_TOKEN_MEAN = "seq_mean_token_mean"
    SEQ_MEAN_TOKEN_SUM = "seq_mean_token_sum"
    CONSTANT = "constant"


# Per-sequence token weight from the completion lengths of the optimizer step's batch.
_SEQ_WEIGHTS: dict[Aggregation, Callable[[torch.Tensor, int], torch.Tensor]] = {
    Aggregation.TOKEN_MEAN: lambda lens, L: torch.full_like(lens, 1.0 / max(float(lens.sum()), 1.0)),
    # Per micro-batch normalisation is applied by the trainer; here it starts like token_mean.
    Aggregation.TOKEN_MEAN_MICRO: lambda lens, L: torch.full_like(lens, 1.0 / max(float(lens.sum()), 1.0)),
    Aggregation.SEQ_MEAN_TOKEN_MEAN: lambda lens, L: 1.0 / (lens.clamp_min(1.0) * lens.numel()),
    Aggregation.SEQ_MEAN_TOKEN_SUM: lambda lens, L: torch.full_like(lens, 1.0 / lens.numel()),
    Aggregation.CONSTANT: lambda lens, L: torch.full_like(lens, 1.0 / (lens.numel() * L)),
}


def sequence_token_weights(lengths: torch.Tensor, aggregation: str, max_new_tokens: int) -> torch.Tensor:
    """lengths[S] (completion tokens) -> the weight each token of sequence i gets, [S] (fp64)."""
    if lengths.numel() == 0:
        return lengths.double()
    return _SEQ_WEIGHTS[Aggregation(aggregation)](lengths.double(), max_new_tokens)


def kl_penalty(logp: torch.Tensor, ref_logp: torch.Tensor, estimator: str) -> torch.Tensor:
    """Per-token KL(pi || ref) estimators (Schulman's k1/k2/k3), with verl's clamps on k3."""
    log_ratio = logp - ref_logp
    if estimator == "k1":
        return log_ratio
    if estimator == "k2":
        return 0.5 * log_ratio.square()
    d = (-log_ratio).clamp(-20.0, 20.0)  # ref - logp
    return (d.exp() - d - 1.0).clamp(-10.0, 10.0)


def segment_mean(values: torch.Tensor, seq_index: torch.Tensor, num_seqs: int) -> torch.Tensor:
    """Mean of `values[N]` within each sequence, broadcast back to [N]."""
    sums = torch.zeros(num_seqs, dtype=values.dtype, device=values.device).index_add(0, seq_index, values)
    counts = torch.zeros(num_seqs, dtype=values.dtype, device=values.device).index_add(
        0, seq_index, torch.ones_like(values)
    )
    return (sums / counts.clamp_min(1.0))[seq_index]


@dataclass
class LossOutput:
    loss: torch.Tensor  # scalar, differentiable
    metrics: dict[str, torch.Tensor]  # token-count-weighted *sums* (detached) + "tokens"


def policy_loss(
    logp: torch.Tensor,  # [N] fp32, differentiable
    old_logp: torch.Tensor,  # [N]
    advantages: torch.Tensor,  # [N] (per-sequence A broadcast to its tokens)
    weights: torch.Tensor,  # [N] aggregation weights (0 on masked tokens)
    cfg: LossConfig,
    *,
    ref_logp: torch.Tensor | None = None,  # [N], needed when cfg.beta > 0
    is_weights: torch.Tensor | None = None,  # [N] truncated IS weights (detached)
    seq_index: torch.Tensor | None = None,  # [N], needed for ratio_level="sequence"
    num_seqs: int = 0,
    entropy: torch.Tensor | None = None,  # [N], differentiable when cfg.entropy_coef > 0
) -> LossOutput:
    """sum_t w_t * ( -min(rho A, clip(rho, 1-eps_low, 1+eps_high) A) [dual clip] * is_w + beta*KL - c_H*H )."""
    log_ratio = (logp - old_logp).clamp(-20.0, 20.0)
    if cfg.ratio_level == "sequence":  # GSPO: length-normalised sequence ratio, gradient to every token
        log_ratio = segment_mean(log_ratio, seq_index, num_seqs)
    ratio = log_ratio.exp()
    adv = advantages
    pg_unclipped = -adv * ratio
    pg_clipped = -adv * ratio.clamp(1.0 - cfg.eps_low, 1.0 + cfg.eps_high)
    pg = torch.maximum(pg_unclipped, pg_clipped)
    if cfg.dual_clip > 0:  # bound the loss of negative-advantage tokens whose ratio exploded
        pg = torch.where(adv < 0, torch.minimum(pg, -adv * cfg.dual_clip), pg)
    if is_weights is not None:
        pg = pg * is_weights
    per_token = pg
    kl = None
    if cfg.beta > 0:
        kl = kl_penalty(logp, ref_logp, cfg.kl_estimator)
        per_token = per_token + cfg.beta * kl
    if cfg.entropy_coef > 0:
        per_token = per_token - cfg.entropy_coef * entropy
    loss = (weights * per_token).sum()

    with torch.no_grad():
        active = (weights != 0).to(logp.dtype)
        low = ((ratio < 1.0 - cfg.eps_low) & (adv < 0)).to(logp.dtype) * active
        high = ((ratio > 1.0 + cfg.eps_high) & (adv > 0)).to(logp.dtype) * active
        metrics = {
            "tokens": active.sum(),
            "clip_frac_low": low.sum(),
            "clip_frac_high": high.sum(),
            "clip_frac": (low + high).sum(),
            "ratio_mean": (ratio * active).sum(),
            "ratio_max": (ratio * active).max() if ratio.numel() else ratio.new_zeros(()),
        }
        if kl is not None:
            metrics["kl"] = (kl * active).sum()
        if entropy is not None:
            metrics["entropy"] = (entropy.detach() * active).sum()
    return LossOutput(loss=loss, metrics=metrics)


def logp_and_entropy_ref(
    hidden: torch.Tensor,  # [N, H]
    weight: torch.Tensor,  # [V, H] LM head
    targets: torch.Tensor,  # [N]
    temperature: float,
    with_entropy: bool,
    entropy_grad: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The vanilla path: materialise fp32 logits [N, V], log_softmax, gather (4 N V bytes, plus as
    much again for the saved softmax in backward)."""
    logits = (hidden @ weight.t()).float() / temperature  # [N, V]
    logprobs = torch.log_softmax(logits, dim=-1)
    logp = logprobs.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    entropy = None
    if with_entropy:
        with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
            entropy = -(logprobs.exp() * logprobs).sum(-1)
    return logp, entropy
