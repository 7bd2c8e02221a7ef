"""Advantages (through the trainer's AdvantageConfig) and micro-batch plans against hand-computed values.
The loss itself is tested in test_objective.py."""

import pytest
import torch

from mentor_fast.algo.advantages import compute_advantages
from mentor_fast.algo.batch import plan_micro_batches, split_mini_batches
from mentor_fast.config import AdvantageConfig


def test_one_success_in_eight_matches_worked_example():
    rewards = torch.tensor([1.0] + [0.0] * 7)
    gi = torch.zeros(8, dtype=torch.long)
    a = compute_advantages(rewards, gi, AdvantageConfig(estimator="grpo", std_ddof=1))
    assert a[0].item() == pytest.approx(2.4749, abs=1e-3)
    assert a[1:].tolist() == pytest.approx([-0.35355] * 7, abs=1e-4)
    pop = compute_advantages(rewards, gi, AdvantageConfig(estimator="grpo", std_ddof=0))
    assert pop[0].item() == pytest.approx(2.6458, abs=1e-3)
    dr = compute_advantages(rewards, gi, AdvantageConfig(estimator="dr_grpo"))
    assert dr.tolist() == pytest.approx([0.875] + [-0.125] * 7)
    rl = compute_advantages(rewards, gi, AdvantageConfig(estimator="rloo"))
    # r_i - mean of the other seven
    assert rl.tolist() == pytest.approx([1.0] + [-1 / 7] * 7, abs=1e-6)


def test_groups_are_independent_and_uniform_groups_get_zero():
    rewards = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0, 0.0, 1.0, 0.0, 1.0])
    gi = torch.tensor([0, 0, 0, 1, 1, 1, 2, 2, 2])
    a = compute_advantages(rewards, gi, AdvantageConfig())
    # group 1 is permutation of group 0's pattern with different means
    g0 = compute_advantages(rewards[:3], gi[:3], AdvantageConfig())
    assert a[:3].tolist() == pytest.approx(g0.tolist())
    same = compute_advantages(torch.zeros(4), torch.zeros(4, dtype=torch.long), AdvantageConfig())
    assert same.abs().max().item() == 0.0
    ones = compute_advantages(torch.ones(4), torch.zeros(4, dtype=torch.long), AdvantageConfig())
    assert ones.abs().max().item() == 0.0


def test_batch_estimator_uses_batch_std():
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 1.0])
    gi = torch.tensor([0, 0, 0, 1, 1, 1])
    a = compute_advantages(rewards, gi, AdvantageConfig(estimator="batch"))
    batch_std = rewards.std(correction=1).item()
    assert a[0].item() == pytest.approx((1 - 1 / 3) / (batch_std + 1e-6), rel=1e-5)
    assert a[3].item() == pytest.approx((0 - 2 / 3) / (batch_std + 1e-6), rel=1e-5)


def test_micro_batch_plan_respects_budget():
    lengths = [10, 50, 20, 40, 30, 5]
    plans = plan_micro_batches(lengths, list(range(6)), token_budget=100)
    assert sorted(i for p in plans for i in p) == list(range(6))
    for p in plans:
        assert len(p) * max(lengths[i] for i in p) <= 100 or len(p) == 1
    mini = split_mini_batches(10, 3, torch.Generator().manual_seed(0))
    assert sorted(i for m in mini for i in m) == list(range(10)) and len(mini) == 3
