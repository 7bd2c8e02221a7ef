"""Group-relative advantage estimators (DESIGN.md section 4), one small function each in a registry.

All take rewards[S] (one per sequence) and group_index[S] (dense 0..num_groups-1) and return A[S].
A group whose rewards are all equal gets A = 0: it carries no signal, which is what MENTOR targets.
"""

from __future__ import annotations

from collections.abc import Callable
from enum import StrEnum

import torch

from mentor_fast.config import AdvantageConfig


class Estimator(StrEnum):
    GRPO = "grpo"
    DR_GRPO = "dr_grpo"
    BATCH = "batch"
    RLOO = "rloo"


def _group_stats(rewards: torch.Tensor, group_index: torch.Tensor, ddof: int):
    """Per-sequence group mean, std and size, gathered back to [S]."""
    num_groups = int(group_index.max()) + 1 if group_index.numel() else 0
    r = rewards.double()
    count = torch.zeros(num_groups, dtype=torch.float64).index_add_(0, group_index, torch.ones_like(r))
    mean = torch.zeros(num_groups, dtype=torch.float64).index_add_(0, group_index, r) / count
    dev2 = (r - mean[group_index]) ** 2
    ss = torch.zeros(num_groups, dtype=torch.float64).index_add_(0, group_index, dev2)
    denom = (count - ddof).clamp_min(1.0)
    std = (ss / denom).sqrt()
    return mean[group_index], std[group_index], count[group_index]


def grpo(rewards, group_index, cfg: AdvantageConfig):
    mean, std, _ = _group_stats(rewards, group_index, cfg.std_ddof)
    return (rewards.double() - mean) / (std + cfg.eps)


def dr_grpo(rewards, group_index, cfg: AdvantageConfig):
    mean, _, _ = _group_stats(rewards, group_index, cfg.std_ddof)
    return rewards.double() - mean


def batch(rewards, group_index, cfg: AdvantageConfig):
    # Group baseline, batch-wide scale (TRL scale_rewards="batch"): less weight on near-uniform groups.
    mean, _, _ = _group_stats(rewards, group_index, cfg.std_ddof)
    std = rewards.double().std(correction=cfg.std_ddof) if rewards.numel() > cfg.std_ddof else torch.tensor(0.0)
    return (rewards.double() - mean) / (std + cfg.eps)


def rloo(rewards, group_index, cfg: AdvantageConfig):
    # r_i - mean of the others = G/(G-1) (r_i - mu).
    mean, _, count = _group_stats(rewards, group_index, cfg.std_ddof)
    scale = count / (count - 1).clamp_min(1.0)
    return scale * (rewards.double() - mean)


ESTIMATORS: dict[Estimator, Callable[..., torch.Tensor]] = {
    Estimator.GRPO: grpo,
    Estimator.DR_GRPO: dr_grpo,
    Estimator.BATCH: batch,
    Estimator.RLOO: rloo,
}


def compute_advantages(rewards: torch.Tensor, group_index: torch.Tensor, cfg: AdvantageConfig) -> torch.Tensor:
    """rewards[S], group_index[S] -> advantages[S] (fp32)."""
    if rewards.numel() == 0:
        return rewards.float()
    return ESTIMATORS[Estimator(cfg.estimator)](rewards, group_index, cfg).float()
