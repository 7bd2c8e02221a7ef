"""The host half of a micro-batch's loss: its per-token vectors, built on the CPU and queued to the
device in one copy per dtype (forward.to_device), so the micro-batch loop never waits for it.

pi_old, the behaviour policy's log-prob of each token, is the sampler's own log-prob unless the
update recomputed it (several optimizer steps per batch) or the sequence was trained in another
context than it was sampled in (`behaviour_prompt_ids`); a stale async re-roll keeps its sampler's
unless it moved. The mismatch correction (loss.is_mode) weighs pi_old against the sampler's
log-probs, except on a sequence whose method weighs it itself (`Rollout.weighting`): that weighting
replaces the correction.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mentor_fast.algo.batch import TrainBatch
from mentor_fast.forward import to_device
from mentor_fast.kernels import AGGREGATIONS, GRPOOptions, sequence_weights
from mentor_fast.types import Rollout


@dataclass
class TokenVectors:
    """[N] fp32 vectors over a micro-batch's completion tokens, sequence by sequence."""

    weights: torch.Tensor  # w: the aggregation's weight of each token
    advantages: torch.Tensor
    sampler: torch.Tensor  # mu: the sampler's log-probs
    old: torch.Tensor  # pi_old
    mismatch_sampler: torch.Tensor  # the kernels' sampler_logp: what the correction weighs pi_old against
    policy_weights: torch.Tensor | None = None  # a method's weights on the policy term

    def to(self, device: torch.device) -> TokenVectors:
        vectors = [self.weights, self.advantages, self.sampler, self.old, self.mismatch_sampler]
        if self.policy_weights is not None:
            vectors.append(self.policy_weights)
        return TokenVectors(*to_device(vectors, device))


def moved(rollout: Rollout) -> bool:
    """Trained in another context than the one it was sampled in (e.g. a transfer re-roll)."""
    return rollout.behaviour_prompt_ids is not None


def mismatch_corrected(rollout: Rollout) -> bool:
    """Whether loss.is_mode's correction weighs the sequence: not where its method weighs it."""
    return rollout.weighting is None


def token_weights(batch: TrainBatch, plan: list[int], options: GRPOOptions, weight_of: dict[int, float],
                  in_loss: torch.Tensor, num_micro: int) -> torch.Tensor:
    """[N] float64 w: each sequence's weight in the mini-batch's aggregation, per token."""
    lens = batch.completion_lens[plan]
    if AGGREGATIONS[options.aggregation].per_micro_batch:  # e.g. TRL's bnpo: this micro-batch's own normaliser
        kept = in_loss[plan]
        seq_w = sequence_weights(lens * kept, options.aggregation, options.max_completion_len) * kept / num_micro
    else:
        seq_w = torch.tensor([weight_of[i] for i in plan], dtype=torch.float64)
    return torch.repeat_interleave(seq_w, lens)


def old_logprobs(batch: TrainBatch, plan: list[int], recomputed: dict[int, torch.Tensor] | None,
                 stale: torch.Tensor) -> torch.Tensor:
    """[N] pi_old: the recomputed log-probs where there are some (for a stale re-roll only if it
    moved), else the sampler's."""
    return torch.cat([
        recomputed[i] if recomputed is not None and i in recomputed and (not stale[i] or moved(batch.rollouts[i]))
        else batch.sampler_logprobs(i)
        for i in plan
    ])


def mismatch_sampler_logprobs(batch: TrainBatch, plan: list[int], old: torch.Tensor,
                              sampler: torch.Tensor) -> torch.Tensor:
    """[N] the kernels' sampler_logp. A sequence without the correction gets its pi_old here: the
    ratio pi_old / pi_old is exactly 1 under every is_mode and bound (kernels/mismatch.py), so its
    tokens keep their weight, while its tokens still count in the correction's metrics as the
    kernels report them."""
    lens = batch.completion_lens[plan].tolist()
    return torch.cat([s_i if mismatch_corrected(batch.rollouts[i]) else old_i
                      for i, old_i, s_i in zip(plan, old.split(lens), sampler.split(lens))])
