"""The update's two exact savings against the plain path on the tiny Llama: the shared-prompt forward
(each distinct prompt once, completions on its keys/values) and skipping zero-advantage sequences.

Tolerance: both paths run the same fp32 ops on the same values, only grouped differently (a [U, P]
prompt pass plus a [S, C] pass with cached keys/values, against [S, P + C] rows), so hidden states
and gradients agree to fp32 summation-order noise: 1e-5 absolute on O(1) hidden values, 1e-5
relative in norm for each parameter's gradient. A wrong position
offset, a mask that lets a completion see a pad, or a missing gradient path through the cache
changes them at the 1e-1 level.
"""

from __future__ import annotations

import random
import warnings

import pytest
import torch
from helpers import PAD, assert_grads_close, grads_of_update, make_groups, make_updater
from mentor_fast.kernels import GRPOOptions

from mentor_fast.algo.batch import build_train_batch, plan_shared_micro_batches
from mentor_fast.algo.terms import TermContext, apply_extra_terms
from mentor_fast.config import AdvantageConfig, OptimConfig, TrainerConfig
from mentor_fast.forward import Form, decoder_inputs, hidden_rows_ref, run_decoder
from mentor_fast.models import load_policy
from mentor_fast.types import ExtraTerm, TokenWeighting
from mentor_fast.update import PolicyUpdater
from mentor_fast.update_inputs import mismatch_sampler_logprobs


def test_shared_prompt_hidden_states_and_gradients_match_full_rows(tiny_model_path):
    batch = build_train_batch(make_groups([[1, 0, 0, 1], [0, 1, 1]]), AdvantageConfig())
    upd = make_updater(tiny_model_path)
    seqs = list(range(batch.num_seqs))
    assert len(set(batch.prompt_index)) == 3  # two prompts and one hinted variant
    probe = torch.randn(int(batch.completion_lens.sum()), upd.model.config.hidden_size)
    results = []
    for shared in (False, True):
        upd.model.zero_grad(set_to_none=True)
        mb = (run_decoder(upd.model, decoder_inputs(batch, seqs, PAD, Form.SHARED)) if shared
              else hidden_rows_ref(upd.model, batch, seqs, PAD))
        (mb.hidden * probe).sum().backward()
        grads = {n: p.grad.clone() for n, p in upd.model.named_parameters()}
        results.append((mb, grads))
    (rows, g_rows), (shared, g_shared) = results
    assert torch.equal(rows.targets, shared.targets) and torch.equal(rows.seq_index, shared.seq_index)
    torch.testing.assert_close(shared.hidden, rows.hidden, atol=1e-5, rtol=1e-5)
    assert_grads_close(g_shared, g_rows, rel=1e-5)


@pytest.mark.parametrize("impl", ["reference", "fused"])
def test_update_with_shared_prompts_equals_full_rows(tiny_model_path, impl):
    batch = build_train_batch(make_groups([[1, 0, 0, 1], [0, 1, 1], [1, 0]]), AdvantageConfig())
    # a small budget forces several micro-batches, some mixing prompts
    g_rows, m_rows = grads_of_update(make_updater(tiny_model_path, impl, shared_prompt_forward=False,
                                               micro_batch_tokens=40), batch)
    g_shared, m_shared = grads_of_update(make_updater(tiny_model_path, impl, micro_batch_tokens=40), batch)
    assert_grads_close(g_shared, g_rows, rel=1e-5)
    assert float(m_shared["loss"]) == pytest.approx(float(m_rows["loss"]), rel=1e-5, abs=1e-7)


def test_skipping_zero_advantage_sequences_leaves_the_update_unchanged(tiny_model_path):
    # group 0 all fail and group 2 all pass (A = 0): skipped; group 1 teaches
    batch = build_train_batch(make_groups([[0, 0, 0], [1, 0, 1, 0], [1, 1]], hinted=False), AdvantageConfig())
    g_all, m_all = grads_of_update(make_updater(tiny_model_path, skip_zero_advantage=False), batch)
    g_skip, m_skip = grads_of_update(make_updater(tiny_model_path), batch)
    assert any(float(g.abs().max()) > 0 for g in g_all.values())
    assert_grads_close(g_skip, g_all, rel=1e-6)
    lens = batch.completion_lens
    expected = float(lens[[0, 1, 2, 7, 8]].sum() / lens.sum())
    assert float(m_skip["update/skipped_token_frac"]) == pytest.approx(expected)
    assert float(m_all["update/skipped_token_frac"]) == 0.0


def test_a_batch_with_no_signal_still_steps_adam_like_zero_gradients(tiny_model_path):
    """Every group uniform: nothing is computed, yet AdamW's moments advance exactly as they would
    with the (all-zero) gradients of the full computation."""
    first = build_train_batch(make_groups([[1, 0, 1], [0, 1]], hinted=False), AdvantageConfig())
    flat = build_train_batch(make_groups([[0, 0, 0], [1, 1]], seed=1, hinted=False), AdvantageConfig())
    params = []
    for skip in (False, True):
        upd = make_updater(tiny_model_path, skip_zero_advantage=skip)
        upd.update(first, 0)
        metrics = upd.update(flat, 1)
        assert float(metrics["grad_norm"]) == 0.0
        params.append([p.detach().clone() for p in upd.model.parameters()])
    for a, b in zip(*params):
        torch.testing.assert_close(b, a, atol=1e-7, rtol=1e-6)


def test_step_without_signal_false_leaves_the_weights_alone_on_a_batch_with_no_signal(tiny_model_path):
    """After a step with a signal, AdamW's first moment moves the weights on an all-zero batch too
    (the default, as TRL and verl do); optim.step_without_signal=false skips that step exactly, and
    the next batch with a signal is stepped as usual."""
    first = build_train_batch(make_groups([[1, 0, 1], [0, 1]], hinted=False), AdvantageConfig())
    flat = build_train_batch(make_groups([[0, 0, 0], [1, 1]], seed=1, hinted=False), AdvantageConfig())
    moved = {}
    for step_anyway in (True, False):
        upd = make_updater(tiny_model_path)
        upd.optim_cfg = OptimConfig(lr=1e-3, step_without_signal=step_anyway)
        assert not upd.signal_free(first) and upd.signal_free(flat)
        upd.update(first, 0)
        before = [p.detach().clone() for p in upd.model.parameters()]
        lr_before = upd.scheduler.get_last_lr()[0]
        metrics = upd.update(flat, 1)
        moved[step_anyway] = max(float((p.detach() - b).abs().max()) for p, b in zip(upd.model.parameters(), before))
        assert float(metrics["update/optimizer_skipped"]) == float(not step_anyway)
        assert upd.scheduler.last_epoch == 2 and upd.scheduler.get_last_lr()[0] == lr_before  # constant lr
        again = upd.update(first, 2)
        assert float(again["update/optimizer_skipped"]) == 0.0 and float(again["grad_norm"]) > 0
    assert moved[True] > 1e-5  # momentum alone moved the weights
    assert moved[False] == 0.0


def test_a_skipped_first_step_does_not_warn_about_the_schedule(tiny_model_path):
    # a collapsed run's first batch has no signal: the schedule advances without an optimizer step,
    # on purpose, and torch's warning about that order would only confuse the user
    flat = build_train_batch(make_groups([[0, 0, 0], [1, 1]], hinted=False), AdvantageConfig())
    upd = make_updater(tiny_model_path)
    upd.optim_cfg = OptimConfig(lr=1e-3, step_without_signal=False)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        assert float(upd.update(flat, 0)["update/optimizer_skipped"]) == 1.0
    assert not [w for w in seen if "lr_scheduler" in str(w.message)], [str(w.message) for w in seen]


def test_beta_or_entropy_bonus_turns_skipping_off(tiny_model_path):
    upd = make_updater(tiny_model_path)
    assert upd.skip_zero_advantage
    upd = PolicyUpdater(upd.model, upd.optimizer, upd.scheduler, GRPOOptions(entropy_coef=0.01), TrainerConfig(),
                        OptimConfig(), pad_id=PAD)
    assert not upd.skip_zero_advantage
    batch = build_train_batch(make_groups([[0, 0]], hinted=False), AdvantageConfig())
    assert upd.trainable(batch) == [0, 1]


def test_shared_plan_counts_each_prompt_once():
    # 2 prompts of 10 tokens, completions 8, 8, 6, 6, 4, 4 (alternating prompts)
    prompt_index, plens, clens = [0, 1, 0, 1, 0, 1], [10] * 6, [8, 8, 6, 6, 4, 4]
    plans = plan_shared_micro_batches(prompt_index, plens, clens, list(range(6)), token_budget=44)
    assert sorted(i for p in plans for i in p) == list(range(6))
    for plan in plans:
        u = len({prompt_index[i] for i in plan})
        assert u * 10 + len(plan) * max(clens[i] for i in plan) <= 44 or len(plan) == 1
    assert plans[0] == [0, 1, 2]  # 2 * 10 + 3 * 8 = 44 fits; a fourth row would not


@pytest.mark.parametrize("kind", ["truncated_is", "shaping"])
def test_moved_rerolls_are_weighted_from_pi_old_under_q(tiny_model_path, kind):
    """A re-roll sampled under q + h and trained under q (mentor.loss.mode=transfer or shaping puts
    `behaviour_prompt_ids` and a `weighting` on it): pi_old is recomputed under q (a plain forward
    over q + completion gives the same numbers). truncated_is: each token's weight is
    min(pi_old(y|q) / mu(y|q + h), cap); shaping: gamma p / (p + gamma)^2 with p = pi_old(y|q),
    whatever mu was. Sequences without a weighting get weight 1."""
    import dataclasses

    upd = make_updater(tiny_model_path)
    groups = make_groups([[0.0, 0.0, 1.0], [1.0, 0.0, 0.0]])
    hinted = groups[0].rollouts[-1]
    q = groups[0].prompt_ids
    with torch.no_grad():  # pi_old(y|q) from a plain forward, to build mu on both sides of the cap
        logits = upd.model(input_ids=torch.tensor([q + hinted.completion_ids])).logits[0].float()
        want_old = torch.log_softmax(logits, -1)[len(q) - 1 : -1].gather(
            -1, torch.tensor(hinted.completion_ids)[:, None]).squeeze(-1)
    shift = torch.tensor([2.0 if t % 2 else -2.0 for t in range(len(hinted.completion_ids))])
    param = 1.0 if kind == "truncated_is" else 0.1
    moved = dataclasses.replace(hinted, prompt_ids=list(q), behaviour_prompt_ids=hinted.prompt_ids,
                                sampler_logprobs=(want_old + shift).tolist(), weighting=TokenWeighting(kind, param))
    groups[0].rollouts[-1] = moved
    batch = build_train_batch(groups, AdvantageConfig())
    seen = []
    real = upd._policy_weights

    def spy(batch, plan, old, sampler):
        out = real(batch, plan, old, sampler)
        seen.append((plan, old.clone(), out))
        return out

    upd._policy_weights = spy
    upd.update(batch, policy_version=0)
    k = batch.rollouts.index(moved)
    lens = batch.completion_lens.tolist()
    for plan, old, is_w in seen:
        if is_w is None:  # a micro-batch without the moved re-roll: no correction at all
            assert k not in plan
            continue
        offsets = dict(zip(plan, [sum(lens[i] for i in plan[:j]) for j in range(len(plan))]))
        for i in plan:
            sl = slice(offsets[i], offsets[i] + lens[i])
            if i == k:  # recomputed under q (not taken from mu)
                assert torch.allclose(old[sl], want_old, atol=1e-4)
                p = want_old.exp()
                want = torch.exp(-shift).clamp(max=1.0) if kind == "truncated_is" else 0.1 * p / (p + 0.1) ** 2
                assert torch.allclose(is_w[sl], want, atol=1e-4)
            else:
                assert torch.all(is_w[sl] == 1.0)
    assert k in [i for plan, _, _ in seen for i in plan]


def test_distill_is_the_forward_kl_to_the_detached_hinted_policy(tiny_model_path):
    """The distill term (mentor.loss.distill_coef puts it on inserted re-rolls): a re-roll pulls
    pi(.|q, y<t) toward the detached pi(.|q + h, y<t).
    The gradient must be that of lambda sum_t KL(teacher || student) / (mini-batch tokens) with the
    teacher held fixed: checked against finite differences along random directions. A reversed KL,
    a teacher that takes gradient or the wrong contexts would each fail."""
    import dataclasses

    upd = make_updater(tiny_model_path)
    coef = 0.7
    upd.model.double()  # finite differences in fp64
    groups = make_groups([[0.0, 0.0, 1.0], [1.0, 0.0, 0.0]])
    hinted = groups[0].rollouts[-1]
    term = ExtraTerm("distill", coef, tuple(groups[0].prompt_ids))
    groups[0].rollouts[-1] = dataclasses.replace(hinted, origin="mentor", extra_terms=(term,))
    batch = build_train_batch(groups, AdvantageConfig())
    mini = list(range(batch.num_seqs))
    model = upd.model
    q, qh, y = groups[0].prompt_ids, hinted.prompt_ids, hinted.completion_ids
    norm = float(batch.completion_lens.sum())

    def logp(prompt):
        logits = model(input_ids=torch.tensor([prompt + y])).logits[0, len(prompt) - 1 : -1].double()
        return torch.log_softmax(logits, -1)

    with torch.no_grad():
        teacher = logp(qh)  # held fixed below, as the stop-gradient holds it

        def objective():
            return float(coef * (teacher.exp() * (teacher - logp(q))).sum() / norm)

    model.zero_grad()
    metrics = apply_extra_terms(TermContext(model, 1.0), batch, mini, norm)
    assert float(metrics["mentor/distill_kl"][1]) == len(y)  # only the re-roll is distilled
    params = [p for p in model.parameters() if p.grad is not None]
    gen = torch.Generator().manual_seed(1)
    for _ in range(3):
        dirs = [torch.randn(p.shape, generator=gen, dtype=p.dtype) for p in params]
        analytic = sum(float((p.grad * d).sum()) for p, d in zip(params, dirs))
        eps, values = 1e-5, []
        with torch.no_grad():
            for sign in (1, -1):
                for p, d in zip(params, dirs):
                    p.add_(sign * eps * d)
                values.append(objective())
                for p, d in zip(params, dirs):
                    p.sub_(sign * eps * d)
        numeric = (values[0] - values[1]) / (2 * eps)
        assert abs(analytic - numeric) <= 1e-3 * abs(numeric) + 1e-9, (analytic, numeric)


def test_distill_off_leaves_the_update_unchanged(tiny_model_path):
    """No extra term: the update is what it is without the term machinery (weights equal bit for
    bit run to run); with the term, the weights move and the KL is reported."""
    import dataclasses

    def run(coef):
        upd = make_updater(tiny_model_path)
        groups = make_groups([[0.0, 0.0, 1.0], [1.0, 0.0, 0.0]])
        terms = (ExtraTerm("distill", coef, tuple(groups[0].prompt_ids)),) if coef else ()
        groups[0].rollouts[-1] = dataclasses.replace(groups[0].rollouts[-1], origin="mentor", extra_terms=terms)
        metrics = upd.update(build_train_batch(groups, AdvantageConfig()), policy_version=0)
        return [p.detach().clone() for p in upd.model.parameters()], metrics

    base, m0 = run(0.0)
    again, _ = run(0.0)
    pulled, m1 = run(1.0)
    assert all(torch.equal(a, b) for a, b in zip(base, again)) and "mentor/distill_kl" not in m0
    assert float(m1["mentor/distill_kl"]) > 0 and any(not torch.equal(a, b) for a, b in zip(base, pulled))


def test_per_micro_batch_aggregation_normalises_each_micro_batch(tiny_model_path):
    """token_mean_micro (TRL's bnpo): each micro-batch is a token mean of its own, and the micro-batches
    are averaged. In one micro-batch that is token_mean; in several of different token counts it is
    not. The grouping matters, so no sequence may be skipped."""
    batch = build_train_batch(make_groups([[0, 0, 0], [1, 0, 1, 0], [1, 0, 0]], hinted=False), AdvantageConfig())
    micro = {"aggregation": "token_mean_micro"}
    one = make_updater(tiny_model_path, loss=micro, micro_batch_tokens=4096)
    assert not one.skip_zero_advantage and one.trainable(batch) == list(range(batch.num_seqs))
    g_one, _ = grads_of_update(one, batch)
    g_mean, _ = grads_of_update(make_updater(tiny_model_path), batch)
    assert_grads_close(g_one, g_mean, rel=1e-5)
    many = make_updater(tiny_model_path, loss=micro, micro_batch_tokens=40)
    assert len(many.micro_batches(batch, list(range(batch.num_seqs)))) > 1
    g_many, _ = grads_of_update(many, batch)
    name = "model.norm.weight"
    assert float((g_many[name] - g_mean[name]).norm()) > 1e-3 * float(g_mean[name].norm())


def _truncate(groups, which):
    """Marks the rollouts at (group, index) as cut at the length limit."""
    for g, k in which:
        groups[g].rollouts[k].finish_reason = "length"
    return groups


def test_mask_truncated_gives_a_truncated_sequence_no_gradient(tiny_model_path):
    # group 1's only success and one failure are truncated; group 0 has no signal: with the mask,
    # nothing that teaches is left, and the gradient is exactly zero
    groups = _truncate(make_groups([[0, 0], [1, 0, 0]], hinted=False), [(1, 0), (1, 1), (1, 2)])
    batch = build_train_batch(groups, AdvantageConfig())
    masked = make_updater(tiny_model_path, loss={"mask_truncated": True}, skip_zero_advantage=False)
    assert masked.in_loss(batch).tolist() == [True, True, False, False, False]
    g_masked, m = grads_of_update(masked, batch)
    assert all(float(g.abs().max()) == 0.0 for g in g_masked.values())
    assert float(m["update/masked_truncated_frac"]) == pytest.approx(3 / 5)
    g_plain, _ = grads_of_update(make_updater(tiny_model_path), batch)
    assert any(float(g.abs().max()) > 0 for g in g_plain.values())


def test_mask_truncated_takes_the_masked_tokens_out_of_the_normaliser(tiny_model_path):
    # token_mean with the mask: the kept sequences' tokens are weighted 1 / (kept tokens); without it
    # (and with the truncated sequences' advantages set to 0 so that they add nothing), 1 / (all tokens)
    groups = _truncate(make_groups([[1, 0, 0, 1], [0, 1, 1]], hinted=False), [(0, 1), (1, 2)])
    batch = build_train_batch(groups, AdvantageConfig())
    g_masked, _ = grads_of_update(make_updater(tiny_model_path, loss={"mask_truncated": True}), batch)
    kept = torch.tensor([not r.truncated for r in batch.rollouts])
    batch.advantages = batch.advantages * kept
    g_zeroed, _ = grads_of_update(make_updater(tiny_model_path), batch)
    scale = float(batch.completion_lens.sum()) / float(batch.completion_lens[kept].sum())
    assert_grads_close(g_masked, {n: g * scale for n, g in g_zeroed.items()}, rel=1e-5)


def _sampler_near_the_model(path, groups, spread: float, seed: int = 0) -> None:
    """Sets each rollout's sampler log-probs to the model's own (as the trainer recomputes pi_old)
    plus a shift drawn from U(-spread, spread) per token, as a sampler in another precision gives."""
    torch.manual_seed(0)
    model = load_policy(path).eval()
    rng = random.Random(seed)
    for r in (r for g in groups for r in g.rollouts):
        ids = torch.tensor([r.prompt_ids + r.completion_ids])
        with torch.no_grad():
            logp = model(ids).logits[0, :-1].float().log_softmax(-1)
        own = logp[len(r.prompt_ids) - 1:].gather(-1, torch.tensor(r.completion_ids)[:, None])[:, 0]
        r.sampler_logprobs = [float(x) + rng.uniform(-spread, spread) for x in own]


@pytest.mark.parametrize("mode", ["token_truncate", "token_mask", "sequence_truncate", "sequence_mask"])
def test_each_mismatch_mode_corrects_a_recomputed_pi_old_and_logs_it(tiny_model_path, mode):
    # two mini-batches: pi_old is recomputed, so the sampler's log-probs (here the model's own, moved
    # by up to 0.9 nats a token) differ from it and the correction acts
    groups = make_groups([[1, 0, 0, 1], [0, 1, 1]], hinted=False)
    _sampler_near_the_model(tiny_model_path, groups, spread=0.9)
    batch = build_train_batch(groups, AdvantageConfig())
    upd = make_updater(tiny_model_path, loss={"is_mode": mode, "is_cap": 1.5, "is_floor": 0.5}, mini_batches=2)
    _, m = grads_of_update(upd, batch)
    assert 0 < float(m["is/weight_mean"]) <= 1.5
    masked = float(m["is/masked_frac"])
    assert (0 < masked < 1) if mode.endswith("mask") else masked == 0
    assert float(m["is/weight_mean"]) != pytest.approx(1.0, abs=1e-3)  # the correction acted
    off = make_updater(tiny_model_path, loss={"is_mode": mode, "is_cap": 0.0}, mini_batches=2)
    assert "is/weight_mean" not in grads_of_update(off, batch)[1]


@pytest.mark.parametrize("mode", ["token_truncate", "sequence_mask"])
def test_the_mismatch_correction_leaves_out_exactly_the_sequences_a_method_weighs(mode):
    """A sequence with its own `weighting` gets a mismatch weight of exactly 1 on every token (its
    method's weights replace the correction); the others are weighed by pi_old / mu."""
    import dataclasses

    from mentor_fast.kernels.mismatch import mismatch_weights

    groups = make_groups([[1, 0, 0]], seed=3, hinted=False)
    r = groups[0].rollouts[1]
    groups[0].rollouts[1] = dataclasses.replace(r, weighting=TokenWeighting("truncated_is", 2.0))
    batch = build_train_batch(groups, AdvantageConfig())
    plan = list(range(batch.num_seqs))
    lens = batch.completion_lens.tolist()
    sampler = torch.cat([batch.sampler_logprobs(i) for i in plan])
    old = sampler + 0.05  # a recomputed pi_old: e^0.05 a token, e^0.45 for 9 tokens, inside the cap of 3
    given = mismatch_sampler_logprobs(batch, plan, old, sampler)
    seq_ids = torch.repeat_interleave(torch.arange(len(plan)), torch.tensor(lens))
    w = mismatch_weights(old, given, mode, cap=3.0, seq_ids=seq_ids, num_seqs=len(plan)).split(lens)
    for i, (wi, gi, si) in enumerate(zip(w, given.split(lens), sampler.split(lens))):
        if i == 1:
            assert (wi == 1.0).all()
        else:
            assert torch.equal(gi, si) and (wi > 1.0).all()

