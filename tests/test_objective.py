"""The per-token objective (mentor_fast.kernels.objective.token_objective, the specification) against
values worked out by hand, for every registered policy term and KL estimator."""

import math

import pytest
import torch
from mentor_fast.kernels import POLICY_LOSSES, GRPOOptions, LossType, TokenInputs, token_objective
from mentor_fast.kernels.advantages import sequence_weights
from mentor_fast.kernels.objective import token_grads


def _terms(logp, old, adv, w=None, *, entropy=None, **opts):
    w = torch.ones_like(logp) if w is None else w
    keys = ("ref_logp", "is_weights", "seq_ids")
    extra = {k: opts.pop(k) for k in keys if k in opts}
    t = TokenInputs(old_logp=old, advantages=adv, weights=w, **extra)
    return token_objective(logp, t, GRPOOptions(**opts), entropy)


def test_every_loss_type_is_registered():
    assert set(POLICY_LOSSES) == set(LossType)


def test_clipped_ratio_hand_values():
    old = torch.zeros(4)
    # ratios 1.5, 0.5, 1.1, 0.9
    logp = torch.log(torch.tensor([1.5, 0.5, 1.1, 0.9])).requires_grad_()
    adv = torch.tensor([1.0, -1.0, 1.0, -1.0])
    out = _terms(logp, old, adv, eps_low=0.2, eps_high=0.28)
    # A>0, r=1.5 -> clipped at 1.28 -> -1.28 ; A<0, r=0.5 -> clipped at 0.8 -> max(0.5, 0.8) = 0.8
    # r=1.1, A>0 -> -1.1 ; r=0.9, A<0 -> max(0.9, 0.9) = 0.9
    assert out.loss.item() == pytest.approx(-1.28 + 0.8 - 1.1 + 0.9, abs=1e-6)
    out.loss.backward()
    # clipped tokens carry no gradient; unclipped: d(-A r)/dlogp = -A r
    assert logp.grad.tolist() == pytest.approx([0.0, 0.0, -1.1, 0.9], abs=1e-6)
    assert out.clipped_high.tolist() == [True, False, False, False]
    assert out.clipped_low.tolist() == [False, True, False, False]


def test_dual_clip_bounds_negative_advantage_loss():
    old = torch.zeros(2)
    logp = torch.log(torch.tensor([5.0, 5.0]))
    adv = torch.tensor([-1.0, 1.0])
    plain = _terms(logp, old, adv)
    dual = _terms(logp, old, adv, dual_clip=3.0)
    # A<0, r=5: plain loss = max(5, 1.28) = 5 ; dual clip: min(5, 3) = 3. A>0 token: -1.28 both.
    assert plain.loss.item() == pytest.approx(5.0 - 1.28)
    assert dual.loss.item() == pytest.approx(3.0 - 1.28)
    assert dual.dual.tolist() == [True, False]
    with pytest.raises(ValueError, match="dual_clip"):
        GRPOOptions(type="sapo", dual_clip=3.0)


def test_cispo_hand_values():
    """-sg(min(r, cap)) A logp: the capped token keeps a gradient (the cap scales it, it does not
    drop it, unlike the clip), and no ratio below 1 is raised."""
    old = torch.zeros(3)
    logp = torch.log(torch.tensor([1.5, 0.5, 3.0], dtype=torch.float64)).requires_grad_()
    adv = torch.tensor([1.0, -1.0, 2.0], dtype=torch.float64)
    out = _terms(logp, old.double(), adv, type="cispo", cispo_cap=2.0)
    want = -1.5 * 1 * math.log(1.5) - 0.5 * -1 * math.log(0.5) - 2.0 * 2 * math.log(3.0)
    assert out.loss.item() == pytest.approx(want, rel=1e-12)
    out.loss.backward()
    assert logp.grad.tolist() == pytest.approx([-1.5, 0.5, -4.0], rel=1e-12)
    assert out.clipped_high.tolist() == [False, False, True]


def test_sapo_hand_values():
    """-(4 / tau) sigmoid(tau (r - 1)) A with tau 1.0 for A > 0 and 1.05 for A <= 0. At r = 1 the
    gradient is -A, the clipped surrogate's; away from 1 it fades smoothly."""
    ratios = [1.0, 1.0, 2.0, 0.5]
    adv = [1.0, -1.0, 1.0, -1.0]
    logp = torch.log(torch.tensor(ratios, dtype=torch.float64)).requires_grad_()
    out = _terms(logp, torch.zeros(4, dtype=torch.float64), torch.tensor(adv, dtype=torch.float64),
                 type="sapo")
    sig = lambda x: 1.0 / (1.0 + math.exp(-x))
    want_loss, want_grad = 0.0, []
    for r, a in zip(ratios, adv):
        tau = 1.0 if a > 0 else 1.05
        s = sig(tau * (r - 1.0))
        want_loss += -(4.0 / tau) * s * a
        want_grad.append(-4.0 * s * (1.0 - s) * r * a)  # d/dlogp = d/dr * r
    assert out.loss.item() == pytest.approx(want_loss, rel=1e-12)
    out.loss.backward()
    assert logp.grad.tolist() == pytest.approx(want_grad, rel=1e-12)
    assert logp.grad[:2].tolist() == pytest.approx([-1.0, 1.0], rel=1e-12)


def test_kl_estimators():
    logp = torch.tensor([-1.0, -2.0])
    ref = torch.tensor([-1.5, -1.0])
    d = logp - ref
    zeros = torch.zeros(2)
    for est, want in (("k1", d), ("k2", 0.5 * d**2), ("k3", torch.exp(-d) + d - 1)):
        kl = _terms(logp, logp, zeros, ref_logp=ref, kl_estimator=est).kl
        assert kl.tolist() == pytest.approx(want.tolist()), est


def test_k3_is_not_clamped_at_ten():
    """k3 = exp(x) - x - 1, x = ref - logp, as TRL and Liger write it: verl's clamp to +-10 would give
    10 and no gradient on both of these tokens. Beyond |x| = 20 the value stays finite."""
    logp = torch.tensor([-1.0, -13.0, -40.0], dtype=torch.float64, requires_grad=True)
    ref = torch.tensor([-13.0, -1.0, -5.0], dtype=torch.float64)
    out = _terms(logp, logp.detach(), torch.zeros(3, dtype=torch.float64), ref_logp=ref, beta=1.0)
    x = [-12.0, 12.0, 20.0]  # the last is clamped from 35
    assert out.kl.tolist() == pytest.approx([math.exp(v) - v - 1 for v in x], rel=1e-12)
    out.loss.backward()
    assert logp.grad.tolist() == pytest.approx([1 - math.exp(-12.0), 1 - math.exp(12.0), 0.0], rel=1e-12)


def test_beta_adds_weighted_kl():
    logp = torch.tensor([-1.0, -2.0])
    ref = torch.tensor([-1.5, -1.0])
    w = torch.tensor([0.5, 0.5])
    out = _terms(logp, logp.clone(), torch.zeros(2), w, ref_logp=ref, beta=0.1, kl_estimator="k3")
    k3 = torch.exp(ref - logp) - (ref - logp) - 1
    assert out.loss.item() == pytest.approx(0.1 * (0.5 * k3).sum().item())
    with pytest.raises(ValueError, match="ref_logp"):
        _terms(logp, logp, torch.zeros(2), beta=0.1)


def test_is_weights_scale_the_policy_term_as_given():
    # the kernels take the weights as made (algo/weights.py truncates the mismatch ratio at
    # loss.is_cap); a run's is_cap must not cut a method's own weights again here
    logp = torch.zeros(2)
    out = _terms(logp, logp, torch.ones(2), is_weights=torch.tensor([0.5, 2.0]), is_cap=1.2)
    assert out.pg_loss.item() == pytest.approx(-(0.5 + 2.0))


def test_entropy_bonus_gradient_is_minus_coef_times_weight():
    logp = torch.tensor([-1.0, -2.0])
    ent = torch.tensor([2.0, 3.0])
    w = torch.tensor([0.25, 0.75])
    g, g_ent = token_grads(logp, TokenInputs(logp, torch.zeros(2), w), GRPOOptions(entropy_coef=0.1), ent)
    assert g.tolist() == [0.0, 0.0] and g_ent.tolist() == pytest.approx([-0.025, -0.075])


def test_sequence_level_ratio_is_length_normalised():
    old = torch.zeros(5)
    logp = torch.tensor([0.1, 0.3, -0.2, 0.0, 0.4], requires_grad=True)
    seq = torch.tensor([0, 0, 1, 1, 1])
    out = _terms(logp, old, torch.ones(5), type="gspo", eps_low=0.9, eps_high=10, seq_ids=seq)
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
    w = torch.repeat_interleave(sequence_weights(lens, "token_mean").float(), lens)
    (g_whole,) = torch.autograd.grad(_terms(logp, old, adv, w).loss, logp)
    cut = 8  # first two sequences, then the rest
    parts = _terms(logp[:cut], old[:cut], adv[:cut], w[:cut]).loss + _terms(
        logp[cut:], old[cut:], adv[cut:], w[cut:]).loss
    (g_parts,) = torch.autograd.grad(parts, logp)
    assert torch.allclose(g_whole, g_parts, atol=1e-7)


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_shaping_weight_gives_luffys_gradient_at_ratio_one(sign):
    """mentor.loss.mode=shaping weighs the clipped term by gamma p / (p + gamma)^2 (p = pi_old). At the
    first gradient step (pi = pi_old, ratio 1) the gradient must be that of LUFFY's shaped objective
    sum_t w_t * -A f(pi_t), f(p) = p / (p + gamma): tiny and large p alike, either sign of A."""
    from mentor_fast.algo.weights import token_policy_weights

    gamma = 0.1
    logp0 = torch.log(torch.tensor([1e-4, 0.01, 0.1, 0.5, 0.99], dtype=torch.float64))
    adv = sign * torch.tensor([2.5, 2.5, 2.5, 0.7, 0.7], dtype=torch.float64)
    w = torch.full((5,), 0.2, dtype=torch.float64)
    p = logp0.exp()
    is_w = token_policy_weights("shaping", gamma, logp0, logp0 + 3.0)
    assert torch.allclose(is_w, gamma * p / (p + gamma) ** 2, rtol=1e-12)  # whatever the sampler said
    ours = logp0.clone().requires_grad_(True)
    _terms(ours, logp0, adv, w, is_weights=is_w).loss.backward()
    luffy = logp0.clone().requires_grad_(True)
    (w * -adv * (luffy.exp() / (luffy.exp() + gamma))).sum().backward()
    assert torch.allclose(ours.grad, luffy.grad, rtol=1e-9, atol=0)
    assert ours.grad.abs().min() > 0  # no token of the re-roll is dropped (transfer's IS would drop 1e-4)


def test_aggregation_sequence_weights():
    lens = torch.tensor([4, 6])
    for agg, want in [("token_mean", [1 / 10, 1 / 10]), ("seq_mean_token_mean", [1 / 8, 1 / 12]),
                      ("seq_mean_token_sum", [1 / 2, 1 / 2]), ("constant", [1 / 32, 1 / 32])]:
        assert sequence_weights(lens, agg, max_len=16).tolist() == pytest.approx(want), agg


def test_mismatch_weights_by_hand_for_each_mode():
    from mentor_fast.kernels.mismatch import mismatch_weights

    old = torch.zeros(5)
    # token log-ratios log 0.5, log 2.5, log 1.5 | sequence 1: 0.5 + 0.5 (ratio e), sequence 2: 0.1 - 0.1 (ratio 1)
    sampler = -torch.tensor([math.log(0.5), math.log(2.5), math.log(1.5), 0.0, 0.0])
    tok = {"cap": 2.0, "floor": 0.8}
    assert mismatch_weights(old, sampler, "token_truncate", **tok).tolist() == pytest.approx([0.8, 2.0, 1.5, 1, 1])
    assert mismatch_weights(old, sampler, "token_mask", **tok).tolist() == pytest.approx([0.0, 0.0, 1.5, 1, 1])
    assert mismatch_weights(old, sampler, "token_truncate", cap=2.0).tolist() == pytest.approx([0.5, 2.0, 1.5, 1, 1])
    seq_old = torch.zeros(4)
    seq_sampler = -torch.tensor([0.5, 0.5, 0.1, -0.1])
    seq = torch.tensor([0, 0, 1, 1])
    assert mismatch_weights(seq_old, seq_sampler, "sequence_truncate", cap=2.0, seq_ids=seq).tolist() == pytest.approx(
        [2.0, 2.0, 1.0, 1.0])
    assert mismatch_weights(seq_old, seq_sampler, "sequence_mask", cap=2.0, seq_ids=seq).tolist() == pytest.approx(
        [0.0, 0.0, 1.0, 1.0])
    assert mismatch_weights(seq_old, seq_sampler, "sequence_mask", cap=3.0, seq_ids=seq).tolist() == pytest.approx(
        [math.e, math.e, 1.0, 1.0])
    with pytest.raises(ValueError, match="needs seq_ids"):
        mismatch_weights(seq_old, seq_sampler, "sequence_mask", cap=2.0)
