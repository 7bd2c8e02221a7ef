"""Advantages and the reference GRPO loss against hand-computed values."""

import math

import pytest
import torch

from mentor_fast.algo.advantages import compute_advantages
from mentor_fast.algo.batch import plan_micro_batches, split_mini_batches
from mentor_fast.algo.loss import kl_penalty, policy_loss, sequence_token_weights
from mentor_fast.config import AdvantageConfig, LossConfig


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


@pytest.mark.parametrize(
    "agg,expected",
    [
        ("token_mean", [1 / 10, 1 / 10]),  # lengths 4 and 6 -> 1/total
        ("seq_mean_token_mean", [1 / (2 * 4), 1 / (2 * 6)]),
        ("seq_mean_token_sum", [1 / 2, 1 / 2]),
        ("constant", [1 / (2 * 16), 1 / (2 * 16)]),
    ],
)
def test_aggregation_weights(agg, expected):
    w = sequence_token_weights(torch.tensor([4, 6]), agg, max_new_tokens=16)
    assert w.tolist() == pytest.approx(expected)


def _loss(logp, old, adv, w=None, **kw):
    cfg = LossConfig(**kw)
    w = torch.ones_like(logp) if w is None else w
    return policy_loss(logp, old, adv, w, cfg)


def test_clipped_ratio_hand_values():
    old = torch.zeros(4)
    # ratios 1.5, 0.5, 1.1, 0.9
    logp = torch.log(torch.tensor([1.5, 0.5, 1.1, 0.9])).requires_grad_()
    adv = torch.tensor([1.0, -1.0, 1.0, -1.0])
    out = _loss(logp, old, adv, eps_low=0.2, eps_high=0.28)
    # token losses: A>0, r=1.5 -> clipped at 1.28 -> -1.28 ; A<0, r=0.5 -> clipped at 0.8 -> max(0.5, 0.8) = 0.8
    # r=1.1, A>0 -> -1.1 ; r=0.9, A<0 -> max(0.9, 0.9) = 0.9
    assert out.loss.item() == pytest.approx(-1.28 + 0.8 - 1.1 + 0.9, abs=1e-6)
    out.loss.backward()
    # clipped tokens carry no gradient; unclipped: d(-A r)/dlogp = -A r
    assert logp.grad.tolist() == pytest.approx([0.0, 0.0, -1.1, 0.9], abs=1e-6)
    assert out.metrics["clip_frac"].item() == 2.0  # sums; the trainer divides by tokens


def test_dual_clip_bounds_negative_advantage_loss():
    old = torch.zeros(2)
    logp = torch.log(torch.tensor([5.0, 5.0]))
    adv = torch.tensor([-1.0, 1.0])
    plain = _loss(logp, old, adv)
    dual = _loss(logp, old, adv, dual_clip=3.0)
    # A<0, r=5: plain loss = max(5, 1.28) = 5 ; dual clip: min(5, 3) = 3. A>0 token: -1.28 both.
    assert plain.loss.item() == pytest.approx(5.0 - 1.28)
    assert dual.loss.item() == pytest.approx(3.0 - 1.28)


def test_kl_estimators():
    logp = torch.tensor([-1.0, -2.0])
    ref = torch.tensor([-1.5, -1.0])
    d = logp - ref
    assert kl_penalty(logp, ref, "k1").tolist() == pytest.approx(d.tolist())
    assert kl_penalty(logp, ref, "k2").tolist() == pytest.approx((0.5 * d**2).tolist())
    k3 = torch.exp(ref - logp) - (ref - logp) - 1
    assert kl_penalty(logp, ref, "k3").tolist() == pytest.approx(k3.tolist())
    assert (kl_penalty(logp, ref, "k3") >= 0).all()


def test_beta_adds_weighted_kl():
    logp = torch.tensor([-1.0, -2.0])
    old = logp.clone()
    ref = torch.tensor([-1.5, -1.0])
    adv = torch.zeros(2)
    cfg = LossConfig(beta=0.1, kl_estimator="k3")
    w = torch.tensor([0.5, 0.5])
    out = policy_loss(logp, old, adv, w, cfg, ref_logp=ref)
    k3 = kl_penalty(logp, ref, "k3")
    assert out.loss.item() == pytest.approx(0.1 * (0.5 * k3).sum().item())


def test_sequence_level_ratio_is_length_normalised():
    old = torch.zeros(5)
    logp = torch.tensor([0.1, 0.3, -0.2, 0.0, 0.4], requires_grad=True)
    seq = torch.tensor([0, 0, 1, 1, 1])
    adv = torch.tensor([1.0, 1.0, 1.0, 1.0, 1.0])
    cfg = LossConfig(ratio_level="sequence", eps_low=10, eps_high=10)
    out = policy_loss(logp, old, adv, torch.ones(5), cfg, seq_index=seq, num_seqs=2)
    s0, s1 = math.exp(0.2), math.exp(0.2 / 3)
    assert out.loss.item() == pytest.approx(-(2 * s0 + 3 * s1), rel=1e-6)
    out.loss.backward()
    # every token of a sequence gets d/dlogp = -A * s_i * (tokens_i) / |o_i| = -s_i
    assert logp.grad.tolist() == pytest.approx([-s0, -s0, -s1, -s1, -s1], rel=1e-6)


def test_token_mean_is_invariant_to_micro_batching():
    torch.manual_seed(0)
    lens = torch.tensor([3, 5, 2, 6])
    n = int(lens.sum())
    logp = torch.randn(n, requires_grad=True)
    old = logp.detach() + 0.05 * torch.randn(n)
    adv = torch.repeat_interleave(torch.tensor([1.0, -0.5, 0.3, -1.2]), lens)
    w = torch.repeat_interleave(sequence_token_weights(lens, "token_mean", 8).float(), lens)
    cfg = LossConfig()
    whole = policy_loss(logp, old, adv, w, cfg).loss
    (g_whole,) = torch.autograd.grad(whole, logp)
    cut = 8  # first two sequences, then the rest
    parts = policy_loss(logp[:cut], old[:cut], adv[:cut], w[:cut], cfg).loss + policy_loss(
        logp[cut:], old[cut:], adv[cut:], w[cut:], cfg).loss
    (g_parts,) = torch.autograd.grad(parts, logp)
    assert torch.allclose(g_whole, g_parts, atol=1e-7)


def test_micro_batch_plan_respects_budget():
    lengths = [10, 50, 20, 40, 30, 5]
    plans = plan_micro_batches(lengths, list(range(6)), token_budget=100)
    assert sorted(i for p in plans for i in p) == list(range(6))
    for p in plans:
        assert len(p) * max(lengths[i] for i in p) <= 100 or len(p) == 1
    mini = split_mini_batches(10, 3, torch.Generator().manual_seed(0))
    assert sorted(i for m in mini for i in m) == list(range(10)) and len(mini) == 3


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_shaping_weight_gives_luffys_gradient_at_ratio_one(sign):
    """mentor.loss_mode=shaping weighs the clipped term by gamma p / (p + gamma)^2 (p = pi_old). At the
    first gradient step (pi = pi_old, ratio 1) the gradient must be that of LUFFY's shaped objective
    sum_t w_t * -A f(pi_t), f(p) = p / (p + gamma): tiny and large p alike, either sign of A."""
    gamma = 0.1
    logp0 = torch.log(torch.tensor([1e-4, 0.01, 0.1, 0.5, 0.99], dtype=torch.float64))
    adv = sign * torch.tensor([2.5, 2.5, 2.5, 0.7, 0.7], dtype=torch.float64)
    w = torch.full((5,), 0.2, dtype=torch.float64)
    p = logp0.exp()
    is_w = gamma * p / (p + gamma) ** 2
    ours = logp0.clone().requires_grad_(True)
    policy_loss(ours, logp0, adv, w, LossConfig(), is_weights=is_w).loss.backward()
    luffy = logp0.clone().requires_grad_(True)
    (w * -adv * (luffy.exp() / (luffy.exp() + gamma))).sum().backward()
    assert torch.allclose(ours.grad, luffy.grad, rtol=1e-9, atol=0)
    assert ours.grad.abs().min() > 0  # no token of the re-roll is dropped (transfer's IS would drop 1e-4)
