"""Group-relative advantages for a TrainBatch, through the kernels' K0.

The estimators themselves (grpo, dr_grpo, batch, rloo) are one registry in mentor_fast.kernels
(kernels/advantages.py): this is the trainer's entry point, configured by `advantage.*`. A group
whose rewards are all equal gets A = 0 exactly: it carries no signal, which is what MENTOR targets.
"""

from __future__ import annotations

import torch

from mentor_fast.config import AdvantageConfig
from mentor_fast.kernels.advantages import group_advantages


def compute_advantages(rewards: torch.Tensor, group_index: torch.Tensor, cfg: AdvantageConfig) -> torch.Tensor:
    """rewards[S], group_index[S] -> advantages[S] (fp32, computed in float64)."""
    return group_advantages(rewards, group_index, cfg.estimator, cfg.std_ddof, cfg.eps)
