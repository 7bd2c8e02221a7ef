"""Groups -> TrainBatch: flat per-sequence records, advantages, and micro-batch plans."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mentor_fast.algo.advantages import compute_advantages
from mentor_fast.config import AdvantageConfig
from mentor_fast.types import Group, Rollout


@dataclass
class TrainBatch:
    """S sequences. Only completion tokens are ever in the loss: prompt and hint tokens are context."""

    rollouts: list[Rollout]  # [S], in group order
    input_ids: list[list[int]]  # [S] prompt (q or q + hint) + completion
    prompt_lens: torch.Tensor  # [S] long
    completion_lens: torch.Tensor  # [S] long
    rewards: torch.Tensor  # [S] fp32
    correct: torch.Tensor  # [S] bool
    group_index: torch.Tensor  # [S] long, dense 0..num_groups-1
    advantages: torch.Tensor  # [S] fp32
    policy_versions: torch.Tensor  # [S] long
    prompt_index: list[int]  # [S] dense id of the sequence's prompt token ids (equal ids, equal prompt)

    @property
    def num_seqs(self) -> int:
        return len(self.input_ids)

    def sampler_logprobs(self, i: int) -> torch.Tensor:
        return torch.tensor(self.rollouts[i].sampler_logprobs, dtype=torch.float32)


def build_train_batch(groups: list[Group], cfg: AdvantageConfig) -> TrainBatch:
    rollouts, group_index = [], []
    for g_idx, g in enumerate(groups):
        for r in g.rollouts:
            rollouts.append(r)
            group_index.append(g_idx)
    rewards = torch.tensor([r.reward for r in rollouts], dtype=torch.float32)
    gi = torch.tensor(group_index, dtype=torch.long)
    distinct: dict[tuple[int, ...], int] = {}
    prompt_index = [distinct.setdefault(tuple(r.prompt_ids), len(distinct)) for r in rollouts]
    return TrainBatch(
        rollouts=rollouts,
        input_ids=[list(r.prompt_ids) + list(r.completion_ids) for r in rollouts],
        prompt_lens=torch.tensor([len(r.prompt_ids) for r in rollouts], dtype=torch.long),
        completion_lens=torch.tensor([len(r.completion_ids) for r in rollouts], dtype=torch.long),
        rewards=rewards,
        correct=torch.tensor([r.correct for r in rollouts], dtype=torch.bool),
        group_index=gi,
        advantages=compute_advantages(rewards, gi, cfg),
        policy_versions=torch.tensor([r.policy_version for r in rollouts], dtype=torch.long),
        prompt_index=prompt_index,
    )


def plan_micro_batches(lengths: list[int], indices: list[int], token_budget: int) -> list[list[int]]:
    """Group sequence indices so that rows * padded length <= token_budget; sorting by length keeps
    padding small. A sequence longer than the budget gets a micro-batch of its own."""
    order = sorted(indices, key=lambda i: -lengths[i])
    plans: list[list[int]] = []
    current: list[int] = []
    for i in order:
        width = lengths[current[0]] if current else lengths[i]  # longest first, so the first sets it
        if current and (len(current) + 1) * width > token_budget:
            plans.append(current)
            current = []
        current.append(i)
    if current:
        plans.append(current)
    return plans


def plan_packed_micro_batches(lengths: list[int], indices: list[int], token_budget: int) -> list[list[int]]:
    """Micro-batches of packed rows (no padding): each holds sequences whose lengths sum to at most
    token_budget, longest first, each put in the first micro-batch it fits (first-fit decreasing).
    A sequence longer than the budget gets a micro-batch of its own."""
    plans: list[list[int]] = []
    room: list[int] = []
    for i in sorted(indices, key=lambda i: -lengths[i]):
        k = next((k for k, r in enumerate(room) if lengths[i] <= r), None)
        if k is None:
            plans.append([i])
            room.append(token_budget - lengths[i])
        else:
            plans[k].append(i)
            room[k] -= lengths[i]
    return plans


def plan_shared_micro_batches(
    prompt_index: list[int], prompt_lens: list[int], completion_lens: list[int], indices: list[int],
    token_budget: int,
) -> list[list[int]]:
    """Micro-batches for the shared-prompt forward, where each distinct prompt of a micro-batch runs
    once: its cost is (distinct prompts) * (longest prompt) + rows * (longest completion) tokens.
    Longest completions first, so rows of similar length (from any prompt) share a micro-batch."""
    order = sorted(indices, key=lambda i: (-completion_lens[i], prompt_index[i]))
    plans: list[list[int]] = []
    current: list[int] = []
    prompts: set[int] = set()
    longest_prompt = 0
    for i in order:
        width = completion_lens[current[0]] if current else completion_lens[i]
        u = len(prompts | {prompt_index[i]})
        cost = u * max(longest_prompt, prompt_lens[i]) + (len(current) + 1) * width
        if current and cost > token_budget:
            plans.append(current)
            current, prompts, longest_prompt = [], set(), 0
        current.append(i)
        prompts.add(prompt_index[i])
        longest_prompt = max(longest_prompt, prompt_lens[i])
    if current:
        plans.append(current)
    return plans


def split_mini_batches(num_seqs: int, mini_batches: int, generator: torch.Generator) -> list[list[int]]:
    """A seeded permutation cut into `mini_batches` nearly equal parts (one optimizer step each)."""
    if mini_batches <= 1:
        return [list(range(num_seqs))]
    perm = torch.randperm(num_seqs, generator=generator).tolist()
    return [sorted(chunk) for chunk in (perm[i::mini_batches] for i in range(mini_batches)) if chunk]
