"""K0: group-relative advantages, and the aggregation weights that turn token losses into the loss.

The op is O(S) and takes microseconds in torch, so the standalone K0 is torch on every device (in
float64, returned as fp32); the Triton K2 row kernel recomputes it in-kernel from `rewards[S]`,
`group_ids[S]` and `seq_ids[N]` so that advantages, log-probs, loss and dz come from one pass over
the logits.

Estimators (enums.AdvEstimator), for a group of G rewards with mean mu and std sigma (ddof 1 by
default):
  grpo  A = (r - mu) / (sigma + eps)        dr_grpo  A = r - mu
  batch A = (r - mu) / (batch std + eps)    rloo     A = G / (G - 1) * (r - mu)   (0 if G == 1)
A group whose rewards are all equal gets A = 0 exactly: it carries no signal, which is what MENTOR
targets.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from .enums import AdvEstimator, Aggregation


def group_advantages_ref(rewards, group_ids, estimator="grpo", ddof: int = 1, eps: float = 1e-6):
    """Spec: a plain loop over groups in float64. rewards [S], group_ids [S] -> A [S] float64."""
    est = AdvEstimator(estimator)
    r = [float(x) for x in rewards]
    gid = [int(x) for x in group_ids]

    def std(xs):
        m = sum(xs) / len(xs)
        return (sum((x - m) ** 2 for x in xs) / (len(xs) - ddof)) ** 0.5 if len(xs) > ddof else 0.0

    batch_std = std(r)
    out = []
    for i, ri in enumerate(r):
        grp = [r[j] for j in range(len(r)) if gid[j] == gid[i]]
        mu, g = sum(grp) / len(grp), len(grp)
        if max(grp) == min(grp):
            out.append(0.0)
        elif est is AdvEstimator.GRPO:
            out.append((ri - mu) / (std(grp) + eps))
        elif est is AdvEstimator.DR_GRPO:
            out.append(ri - mu)
        elif est is AdvEstimator.BATCH:
            out.append((ri - mu) / (batch_std + eps))
        else:
            out.append(g / (g - 1) * (ri - mu) if g > 1 else 0.0)
    return torch.tensor(out, dtype=torch.float64)


def _group_stats(r: torch.Tensor, gid: torch.Tensor, ddof: int):
    """Per-sequence deviation from the group mean, group std, group size and an all-equal flag, [S]."""
    _, inv = torch.unique(gid, return_inverse=True)
    k = int(inv.max()) + 1 if inv.numel() else 0
    zeros = r.new_zeros(k)
    cnt = zeros.index_add(0, inv, torch.ones_like(r))
    mu = zeros.index_add(0, inv, r) / cnt
    dev = r - mu[inv]
    ss = zeros.index_add(0, inv, dev**2)
    std = (ss / (cnt - ddof).clamp_min(1.0)).sqrt()  # a group of <= ddof sequences: ss = 0, std 0
    gmax = zeros.scatter_reduce(0, inv, r, "amax", include_self=False)
    gmin = zeros.scatter_reduce(0, inv, r, "amin", include_self=False)
    return dev, std[inv], cnt[inv], (gmax == gmin)[inv]


def _batch_std(r: torch.Tensor, ddof: int) -> torch.Tensor:
    return r.std(correction=ddof) if r.numel() > ddof else r.new_zeros(())


ADV_ESTIMATORS: dict[AdvEstimator, Callable] = {
    AdvEstimator.GRPO: lambda dev, std, cnt, r, ddof, eps: dev / (std + eps),
    AdvEstimator.DR_GRPO: lambda dev, std, cnt, r, ddof, eps: dev,
    AdvEstimator.BATCH: lambda dev, std, cnt, r, ddof, eps: dev / (_batch_std(r, ddof) + eps),
    AdvEstimator.RLOO: lambda dev, std, cnt, r, ddof, eps: cnt / (cnt - 1).clamp_min(1.0) * dev,
}


def group_advantages(rewards: torch.Tensor, group_ids: torch.Tensor | None = None, estimator="grpo",
                     ddof: int = 1, eps: float = 1e-6, *, group_size: int | None = None) -> torch.Tensor:
    """K0. rewards [S] -> advantages [S] fp32 (computed in float64). Groups by `group_ids` [S] (any
    integer labels) or, if omitted, by consecutive blocks of `group_size` sequences."""
    r = rewards.to(torch.float64)
    if r.numel() == 0:
        return r.float()
    if group_ids is None:
        if group_size is None:
            raise ValueError("pass group_ids [S] or group_size")
        group_ids = torch.arange(r.numel(), device=r.device) // group_size
    dev, std, cnt, same = _group_stats(r, group_ids.to(r.device), ddof)
    adv = ADV_ESTIMATORS[AdvEstimator(estimator)](dev, std, cnt, r, ddof, eps)
    return torch.where(same, 0.0, adv).float()


def token_advantages(rewards, seq_ids, group_ids=None, estimator="grpo", ddof: int = 1,
                     eps: float = 1e-6, *, group_size: int | None = None) -> torch.Tensor:
    """K0 broadcast to packed tokens: [S] rewards + seq_ids [N] -> A [N] fp32."""
    return group_advantages(rewards, group_ids, estimator, ddof, eps, group_size=group_size)[seq_ids]


@dataclass(frozen=True)
class AggregationRule:
    """One aggregation: the weight each token of a sequence gets, from the completion lengths L [S]
    (float64) and the maximum length, so that loss = sum_t w_t l_t."""

    weights: Callable[[torch.Tensor, int], torch.Tensor]
    per_micro_batch: bool = False
    """Normalised inside each micro-batch (the caller passes that micro-batch's lengths and averages
    the micro-batches): the gradient then depends on how sequences are grouped into micro-batches,
    so none of them may be skipped or moved."""


def _token_mean(lens: torch.Tensor, L: int) -> torch.Tensor:
    return torch.full_like(lens, 1.0 / max(float(lens.sum()), 1.0))


AGGREGATIONS: dict[Aggregation, AggregationRule] = {
    Aggregation.TOKEN_MEAN: AggregationRule(_token_mean),
    Aggregation.TOKEN_MEAN_MICRO: AggregationRule(_token_mean, per_micro_batch=True),
    Aggregation.SEQ_MEAN_TOKEN_MEAN: AggregationRule(lambda lens, L: 1.0 / (lens.clamp_min(1.0) * lens.numel())),
    Aggregation.SEQ_MEAN_TOKEN_SUM: AggregationRule(lambda lens, L: torch.full_like(lens, 1.0 / lens.numel())),
    Aggregation.CONSTANT: AggregationRule(lambda lens, L: torch.full_like(lens, 1.0 / (lens.numel() * L))),
}


def sequence_weights(lengths: torch.Tensor, aggregation, max_len: int | None = None) -> torch.Tensor:
    """lengths [S] (tokens of each sequence in the loss) -> the weight each of sequence i's tokens
    gets, [S] float64, so that loss = sum_t w_t l_t is the aggregation. Compute it over the
    optimizer step's whole batch (a micro-batch's, for a per-micro-batch rule), so micro-batches add
    up to the same gradient."""
    agg = Aggregation(aggregation)
    if agg is Aggregation.CONSTANT and max_len is None:
        raise ValueError("aggregation 'constant' needs max_len (the maximum completion length)")
    if lengths.numel() == 0:
        return lengths.double()
    return AGGREGATIONS[agg].weights(lengths.double(), max_len or 0)


def aggregation_weights(aggregation, seq_ids: torch.Tensor, mask: torch.Tensor | None = None, *,
                        n_seqs: int | None = None, total_tokens: float | None = None,
                        max_len: int | None = None) -> torch.Tensor:
    """Per-token weights w_t [N] fp32 for packed tokens (mask [N]: 1 = in the loss), from
    `sequence_weights`. token_mean divides by `total_tokens` when given (the global batch's token
    count, so micro-batches add up exactly), else by this call's tokens. n_seqs defaults to
    max(seq_ids) + 1."""
    m = torch.ones_like(seq_ids, dtype=torch.float64) if mask is None else mask.to(torch.float64)
    s = n_seqs if n_seqs is not None else (int(seq_ids.max()) + 1 if seq_ids.numel() else 0)
    lengths = torch.zeros(s, dtype=torch.float64, device=m.device).index_add(0, seq_ids, m)
    per_seq = sequence_weights(lengths, aggregation, max_len)
    if Aggregation(aggregation) is Aggregation.TOKEN_MEAN and total_tokens is not None:
        per_seq = torch.full_like(per_seq, 1.0 / max(float(total_tokens), 1.0))
    return (per_seq[seq_ids] * m).float()
