"""K0: group-relative advantages, and the aggregation weights that encode the loss type.

The op is O(S) and takes microseconds in torch, so the standalone K0 is torch on every device;
the Triton K2 row kernel recomputes it in-kernel from `rewards[S]`, `group_ids[S]` and `seq_ids[N]`
(see grpo_rows.py) so that advantages, log-probs, loss and dz come from one pass over the logits.

Estimators, for a group of G rewards with mean mu and std sigma (ddof 1 by default):
  grpo  A = (r - mu) / (sigma + eps)        dr_grpo  A = r - mu
  batch A = (r - mu) / (batch std + eps)    rloo     A = G / (G - 1) * (r - mu)   (0 if G == 1)
A group whose rewards are all equal gets A = 0 exactly (no 1e-17 leftovers from the mean).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from .options import AdvEstimator, LossType


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
    """Per-sequence group mean, std, size and an all-equal flag, all [S]."""
    _, inv = torch.unique(gid, return_inverse=True)
    k = int(inv.max()) + 1 if inv.numel() else 0
    zeros = r.new_zeros(k)
    cnt = zeros.index_add(0, inv, torch.ones_like(r))
    mu = zeros.index_add(0, inv, r) / cnt
    dev = r - mu[inv]
    var = zeros.index_add(0, inv, dev * dev) / (cnt - ddof).clamp_min(1)
    var = torch.where(cnt > ddof, var, 0.0)
    gmax = zeros.scatter_reduce(0, inv, r, "amax", include_self=False)
    gmin = zeros.scatter_reduce(0, inv, r, "amin", include_self=False)
    return dev, var.sqrt()[inv], cnt[inv], (gmax == gmin)[inv]


def _batch_std(r: torch.Tensor, ddof: int) -> torch.Tensor:
    return r.std(correction=ddof) if r.numel() > ddof else r.new_zeros(())


ADV_ESTIMATORS: dict[AdvEstimator, Callable] = {
    AdvEstimator.GRPO: lambda dev, std, cnt, r, ddof, eps: dev / (std + eps),
    AdvEstimator.DR_GRPO: lambda dev, std, cnt, r, ddof, eps: dev,
    AdvEstimator.BATCH: lambda dev, std, cnt, r, ddof, eps: dev / (_batch_std(r, ddof) + eps),
    AdvEstimator.RLOO: lambda dev, std, cnt, r, ddof, eps: torch.where(
        cnt > 1, dev * cnt / (cnt - 1).clamp_min(1), 0.0),
}


def group_advantages(rewards: torch.Tensor, group_ids: torch.Tensor | None = None, estimator="grpo",
                     ddof: int = 1, eps: float = 1e-6, *, group_size: int | None = None) -> torch.Tensor:
    """K0. rewards [S] -> advantages [S] fp32. Groups by `group_ids` [S] (any integer labels) or,
    if omitted, by consecutive blocks of `group_size` sequences."""
    r = rewards.to(torch.float32)
    if group_ids is None:
        if group_size is None:
            raise ValueError("pass group_ids [S] or group_size")
        group_ids = torch.arange(r.numel(), device=r.device) // group_size
    dev, std, cnt, same = _group_stats(r, group_ids.to(r.device), ddof)
    adv = ADV_ESTIMATORS[AdvEstimator(estimator)](dev, std, cnt, r, ddof, eps)
    return torch.where(same, 0.0, adv)


def token_advantages(rewards, seq_ids, group_ids=None, estimator="grpo", ddof: int = 1,
                     eps: float = 1e-6, *, group_size: int | None = None) -> torch.Tensor:
    """K0 broadcast to packed tokens: [S] rewards + seq_ids [N] -> A [N] fp32."""
    return group_advantages(rewards, group_ids, estimator, ddof, eps, group_size=group_size)[seq_ids]


def _seq_lengths(seq_ids, mask, n_seqs):
    return torch.zeros(n_seqs, device=mask.device).index_add(0, seq_ids, mask)


def aggregation_weights(loss_type, seq_ids: torch.Tensor, mask: torch.Tensor | None = None, *,
                        n_seqs: int | None = None, total_tokens: float | None = None,
                        max_len: int | None = None) -> torch.Tensor:
    """Per-token weights w_t with loss = sum_t w_t l_t (mask [N]: 1 = in the loss).

    dapo: token mean over the *global* batch (`total_tokens`, so micro-batches add up exactly);
    bnpo: token mean over this micro-batch; grpo / gspo: mean over sequences of the token mean;
    dr_grpo: token sum / (n_seqs * max_len). `n_seqs` defaults to max(seq_ids) + 1.
    """
    lt = LossType(loss_type)
    m = torch.ones_like(seq_ids, dtype=torch.float32) if mask is None else mask.to(torch.float32)
    s = n_seqs if n_seqs is not None else (int(seq_ids.max()) + 1 if seq_ids.numel() else 0)
    if lt in (LossType.DAPO, LossType.BNPO):
        denom = total_tokens if (lt is LossType.DAPO and total_tokens is not None) else m.sum()
        return m / max(float(denom), 1.0)
    if lt is LossType.DR_GRPO:
        if max_len is None:
            raise ValueError("dr_grpo weights need max_len (the maximum completion length)")
        return m / float(max(s, 1) * max_len)
    length = _seq_lengths(seq_ids, m, s).clamp_min(1.0)
    return m / (length[seq_ids] * max(s, 1))
