"""Kernel tests on the CPU default path (chunked torch) and the plain-torch references.

Every value is compared with a float64 autograd reference under the tolerance rule: the kernel's
max and mean error against float64 each at most 2x torch's at the same precision, plus a tiny atol
(mentor_fast.kernels.testing.rule_check).
The Triton kernels (interpreter) are in test_kernels_triton.py.
"""

import subprocess
import sys

import pytest
import torch
from mentor_fast.kernels import (
    aggregation_weights,
    group_advantages,
    group_advantages_ref,
    grpo_loss,
    grpo_loss_ref,
    token_advantages,
    token_logprob_stats,
    token_logprobs,
    token_logprobs_ref,
)
from mentor_fast.kernels.testing import (
    assert_close_rule,
    case_temperature,
    loss_kwargs,
    make_batch,
    rule_check,
    run_loss,
    tiny_atol,
)

# ---------------------------------------------------------------- K0 advantages


def test_group_advantages_worked_example():
    # one success in a group of 8, ddof 1: mu = 1/8, sigma = sqrt(1/8) -> +2.4749 / -0.35355
    r = torch.tensor([1.0] + [0.0] * 7)
    a = group_advantages(r, group_size=8)
    assert a[0].item() == pytest.approx(2.47487, abs=1e-4)
    assert torch.allclose(a[1:], torch.full((7,), -0.353553), atol=1e-5)
    assert a.sum().abs().item() < 1e-5


@pytest.mark.parametrize("estimator", ["grpo", "dr_grpo", "batch", "rloo"])
@pytest.mark.parametrize("ddof", [0, 1])
def test_group_advantages_match_ref(estimator, ddof):
    g = torch.Generator().manual_seed(1)
    group_ids = torch.tensor([5, 5, 5, 2, 2, 9, 7, 7, 7, 7, 5, 3, 3, 3])  # unequal, interleaved, singleton
    rewards = torch.rand(group_ids.numel(), generator=g)
    rewards[group_ids == 3] = 0.7  # identical rewards -> exactly 0
    got = group_advantages(rewards, group_ids, estimator, ddof)
    want = group_advantages_ref(rewards, group_ids, estimator, ddof)
    assert torch.allclose(got.double(), want, atol=1e-5, rtol=1e-5), (got, want)
    assert (got[group_ids == 3] == 0).all() and (got[group_ids == 9] == 0).all()
    assert got.abs().max() > 0.05  # not trivially zero


def test_rloo_and_batch_values():
    r = torch.tensor([1.0, 0.0, 0.0, 0.0, 3.0, 1.0])
    gid = torch.tensor([0, 0, 0, 0, 1, 1])
    rloo = group_advantages(r, gid, "rloo")
    assert rloo[0].item() == pytest.approx(4 / 3 * 0.75, abs=1e-6)  # G/(G-1) (r - mu)
    batch = group_advantages(r, gid, "batch", ddof=1)
    assert batch[4].item() == pytest.approx(1.0 / (r.std().item() + 1e-6), abs=1e-5)


def test_token_advantages_broadcast():
    seq_ids = torch.tensor([0, 0, 1, 1, 1, 2, 3])
    a = token_advantages(torch.tensor([1.0, 0.0, 0.0, 1.0]), seq_ids, torch.tensor([0, 0, 1, 1]), "dr_grpo")
    assert a.tolist() == [0.5, 0.5, -0.5, -0.5, -0.5, -0.5, 0.5]


def test_aggregation_weights():
    seq_ids = torch.tensor([0, 0, 0, 1, 1, 2, 2, 2, 2])
    mask = torch.tensor([1, 1, 0, 1, 1, 0, 0, 0, 0])  # sequence 2 fully masked
    w = aggregation_weights("seq_mean_token_mean", seq_ids, mask, n_seqs=3)
    assert torch.allclose(w[:2], torch.full((2,), 1 / 6)) and torch.allclose(w[3:5], torch.full((2,), 1 / 6))
    assert (w[mask == 0] == 0).all()
    assert aggregation_weights("token_mean_micro", seq_ids, mask).sum().item() == pytest.approx(1.0)
    assert aggregation_weights("token_mean", seq_ids, mask, total_tokens=8)[0].item() == pytest.approx(1 / 8)
    assert aggregation_weights("constant", seq_ids, mask, n_seqs=3, max_len=5)[0].item() == pytest.approx(1 / 15)
    assert aggregation_weights("seq_mean_token_sum", seq_ids, mask, n_seqs=3)[0].item() == pytest.approx(1 / 3)
    with pytest.raises(ValueError, match="max_len"):
        aggregation_weights("constant", seq_ids, mask)


# ---------------------------------------------------------------- K1 log-probs


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_token_logprobs_match_ref(dtype, temperature):
    b = make_batch(301, 72, 1003, temperature=temperature)
    h, w = b["hidden"].to(dtype), b["weight"].to(dtype)
    ref64 = token_logprobs_ref(h.double(), w.double(), b["targets"], temperature)
    same = token_logprobs_ref(h.float(), w.float(), b["targets"], temperature)
    if dtype == torch.bfloat16:  # torch at the same precision: bf16 logits
        same_logits = (h @ w.T).float() / temperature
        same = same._replace(logp=torch.log_softmax(same_logits, -1).gather(1, b["targets"][:, None])[:, 0])
    st = token_logprob_stats(h, w, b["targets"], temperature, chunk_tokens=64, backend="torch")
    for name in ("logp", "lse", "entropy"):
        ref = getattr(ref64, name)
        assert_close_rule(name, getattr(st, name), ref, getattr(same, name), atol=tiny_atol(torch.float32, ref))
    plain = token_logprobs(h, w, b["targets"], temperature)
    assert plain.dtype == torch.float32 and torch.equal(plain, st.logp)


def test_token_logprobs_no_grad_and_ref_backend():
    b = make_batch(40, 64, 1000)
    h = b["hidden"].float().requires_grad_()
    out = token_logprobs(h, b["weight"].float(), b["targets"])
    assert not out.requires_grad
    ref = token_logprobs(h, b["weight"].float(), b["targets"], backend="reference")
    assert torch.allclose(out, ref, atol=1e-5)


# ---------------------------------------------------------------- K2 fused loss (chunked torch)

CPU_CASES = ["base", "temperature_dual_clip", "k3_beta", "k1_beta", "k2_beta_entropy_bonus", "is_weights", "gspo",
             "cispo", "sapo_k3_beta", "fused_k0_rewards", "is_token_truncate", "is_token_mask_two_sided",
             "is_sequence_truncate", "is_sequence_mask_gspo"]


def _check_against_ref(b, dtype, backend, case, chunk_tokens):
    kw = loss_kwargs(b, case)
    fp64 = {**b, "hidden": b["hidden"].to(dtype).double(), "weight": b["weight"].to(dtype).double()}
    if "rewards" in kw:
        fp64 = {**fp64, "advantages": None}
        b = {**b, "advantages": None}
    r64, dh64, dw64 = run_loss(grpo_loss_ref, fp64, torch.float64, **kw)
    same_kw = {"logits_dtype": torch.bfloat16} if dtype == torch.bfloat16 else {}
    rs, dhs, dws = run_loss(grpo_loss_ref, b, dtype, **kw, **same_kw)
    out, dh, dw = run_loss(grpo_loss, b, dtype, **kw, backend=backend, chunk_tokens=chunk_tokens)
    assert dh.dtype == dtype and dw.dtype == dtype and out.logp.dtype == torch.float32
    assert_close_rule("loss", out.loss, r64.loss, rs.loss, atol=tiny_atol(torch.float32, r64.loss))
    assert_close_rule("logp", out.logp, r64.logp, rs.logp, atol=tiny_atol(torch.float32, r64.logp))
    assert_close_rule("dH", dh, dh64, dhs, atol=tiny_atol(dtype, dh64))
    assert_close_rule("dW", dw, dw64, dws, atol=tiny_atol(dtype, dw64))
    for name in ("clip_frac_low", "clip_frac_high", "ratio_mean", "kl_mean", "entropy_mean"):
        a, r = getattr(out, name), getattr(r64, name)
        assert (a.isnan() and r.isnan()) or abs(a.item() - r.item()) <= 2e-3 * max(1.0, abs(r.item())), name
    return out, r64


@pytest.mark.parametrize("case", CPU_CASES)
def test_grpo_loss_torch_fp32(case):
    b = make_batch(203, 80, 1500, temperature=case_temperature(case))
    _check_against_ref(b, torch.float32, "torch", case, chunk_tokens=64)


@pytest.mark.parametrize("case", ["base", "temperature_dual_clip", "k2_beta_entropy_bonus", "gspo", "cispo"])
def test_grpo_loss_torch_bf16(case):
    b = make_batch(157, 64, 1201, seed=3, temperature=case_temperature(case))
    _check_against_ref(b, torch.bfloat16, "torch", case, chunk_tokens=50)


@pytest.mark.parametrize("case", ["base", "temperature_dual_clip", "k2_beta_entropy_bonus", "gspo"])
def test_grpo_loss_bf16_compute_fp32_master(case):
    """The mixed-precision head (model.autocast_bf16): fp32 hidden and master weight, bf16 GEMM
    operands, fp32 logits. Within the rule of the bf16-rounded inputs, and the gradients come back
    fp32 and unrounded: dW's error is far below one bf16 rounding of dW (a rounded dW fails)."""
    b = make_batch(157, 64, 1201, seed=5, temperature=case_temperature(case))
    kw = loss_kwargs(b, case)
    bf = torch.bfloat16
    fp64 = {**b, "hidden": b["hidden"].to(bf).double(), "weight": b["weight"].to(bf).double()}
    r64, dh64, dw64 = run_loss(grpo_loss_ref, fp64, torch.float64, **kw)
    rs, dhs, dws = run_loss(grpo_loss_ref, b, torch.float32, **kw, compute_dtype=bf, logits_dtype=bf)
    out, dh, dw = run_loss(grpo_loss, b, torch.float32, **kw, compute_dtype=bf, chunk_tokens=50)
    assert dh.dtype == torch.float32 and dw.dtype == torch.float32
    assert_close_rule("loss", out.loss, r64.loss, rs.loss, atol=tiny_atol(torch.float32, r64.loss))
    assert_close_rule("logp", out.logp, r64.logp, rs.logp, atol=tiny_atol(torch.float32, r64.logp))
    assert_close_rule("dH", dh, dh64, dhs, atol=tiny_atol(torch.float32, dh64))
    assert_close_rule("dW", dw, dw64, dws, atol=tiny_atol(torch.float32, dw64))
    rounding = (dw64.to(bf).double() - dw64).abs().max().item()
    assert (dw.double() - dw64).abs().max().item() < rounding / 8
    # the reference with the same option is the same math (rounded operands, fp32 logits)
    rr, _, dwr = run_loss(grpo_loss_ref, b, torch.float32, **kw, compute_dtype=bf)
    assert (rr.loss - out.loss).abs().item() <= 1e-5 * max(1.0, abs(rr.loss.item()))
    assert (dwr.double() - dw64).abs().max().item() < rounding / 8
    # K1 with the same operands
    lp = token_logprobs(b["hidden"].float(), b["weight"].float(), b["targets"], case_temperature(case),
                        compute_dtype=bf, chunk_tokens=40)
    assert (lp.double() - r64.logp).abs().max().item() < 1e-4


def test_batch_hits_every_branch():
    b = make_batch(203, 80, 1500, temperature=0.7)
    out, _ = _check_against_ref(b, torch.float32, "torch", "temperature_dual_clip", chunk_tokens=1000)
    assert out.clip_frac_low > 0.02 and out.clip_frac_high > 0.02 and out.clip_frac_dual == 0
    inside = (out.ratio > 0.8) & (out.ratio < 1.28)
    assert inside.float().mean() > 0.2
    assert out.ratio_min < 0.8 and out.ratio_max > 1.28


def test_zero_advantage_tokens_get_zero_gradient():
    b = make_batch(120, 64, 1000)
    b["advantages"] = torch.where(b["seq_ids"] % 2 == 0, 0.0, b["advantages"])
    _, dh, _ = run_loss(grpo_loss, b, torch.float32)
    zero = b["seq_ids"] % 2 == 0
    assert (dh[zero] == 0).all() and dh[~zero].abs().sum() > 0


def test_dual_clip_caps_negative_advantage_loss():
    b = make_batch(64, 64, 1000)
    n = 64
    b["old_logp"] = b["old_logp"] - 3.0  # ratio ~ e^3 >> c: every A < 0 token hits the dual clip
    b["advantages"] = -torch.ones(n)
    b["token_weights"] = torch.full((n,), 1.0 / n)
    out, dh, _ = run_loss(grpo_loss, b, torch.float32, dual_clip=3.0)
    assert out.loss.item() == pytest.approx(3.0, rel=1e-6)  # sum_t w_t * (-c * A) = c
    assert out.clip_frac_dual.item() == 1.0 and dh.abs().max().item() == 0.0


def test_all_weights_zero():
    b = make_batch(50, 64, 1000)
    b["token_weights"] = torch.zeros(50)
    out, dh, dw = run_loss(grpo_loss, b, torch.float32, beta=0.1, ref_logp=b["ref_logp"])
    assert out.loss.item() == 0.0 and dh.abs().max() == 0 and dw.abs().max() == 0
    assert out.ratio_mean.isnan() and out.clip_frac_low.isnan()


@pytest.mark.parametrize("chunk", [1, 37, 256])
def test_chunk_size_does_not_change_result(chunk):
    b = make_batch(101, 64, 1000)
    base, dh0, dw0 = run_loss(grpo_loss, b, torch.float32, chunk_tokens=101)
    out, dh, dw = run_loss(grpo_loss, b, torch.float32, chunk_tokens=chunk)
    assert torch.allclose(out.logp, base.logp, atol=1e-6)
    assert torch.allclose(dh, dh0, atol=1e-7) and torch.allclose(dw, dw0, atol=1e-7)


def test_frozen_head_and_grad_output_scaling():
    b = make_batch(90, 64, 1000)
    _, dh, dw = run_loss(grpo_loss, b, torch.float32)
    h = b["hidden"].float().requires_grad_()
    w = b["weight"].float().requires_grad_()
    out = grpo_loss(h, w, b["targets"], b["old_logp"], b["advantages"], b["token_weights"],
                    compute_weight_grad=False)
    (2.5 * out.loss).backward()
    assert w.grad is None or w.grad.abs().max() == 0
    assert torch.allclose(h.grad, 2.5 * dh, rtol=1e-6, atol=1e-9)
    h2 = b["hidden"].float().requires_grad_()
    grpo_loss(h2, b["weight"].float(), b["targets"], b["old_logp"], b["advantages"],
              b["token_weights"]).loss.backward()  # weight without grad: no dW GEMM at all
    assert torch.allclose(h2.grad, dh, rtol=1e-6, atol=1e-9) and dw.abs().max() > 0


def test_tied_embeddings_accumulate():
    b = make_batch(80, 64, 1000)
    ids = torch.randint(0, 1000, (80,), generator=torch.Generator().manual_seed(5))
    grads = []
    for fn in (grpo_loss_ref, grpo_loss):
        emb = b["weight"].clone().requires_grad_()  # [V, H] used as embedding table and LM head
        hidden = torch.tanh(emb[ids] * 2.0)
        out = fn(hidden, emb, b["targets"], b["old_logp"], b["advantages"], b["token_weights"])
        out.loss.backward()
        grads.append(emb.grad)
    assert_close_rule("tied dW", grads[1], grads[0], grads[0], atol=tiny_atol(torch.float32, grads[0]))


def test_microbatching_with_global_weights_matches_full_batch():
    b = make_batch(120, 64, 1000)
    seq = b["seq_ids"]
    w = aggregation_weights("token_mean", seq, b["token_weights"] > 0,
                            total_tokens=float((b["token_weights"] > 0).sum()))
    full = dict(b, token_weights=w)
    _, dh_full, dw_full = run_loss(grpo_loss, full, torch.float32)
    h = b["hidden"].float().requires_grad_()
    wt = b["weight"].float().requires_grad_()
    for part in (slice(0, 50), slice(50, 120)):
        grpo_loss(h[part], wt, b["targets"][part], b["old_logp"][part], b["advantages"][part],
                  w[part]).loss.backward()
    assert torch.allclose(h.grad, dh_full, atol=1e-8) and torch.allclose(wt.grad, dw_full, atol=1e-8)


def test_options_are_validated():
    b = make_batch(8, 64, 1000)
    with pytest.raises(TypeError, match="eps_hgh"):
        run_loss(grpo_loss, b, torch.float32, eps_hgh=0.3)
    with pytest.raises(ValueError, match="dual_clip"):
        run_loss(grpo_loss, b, torch.float32, dual_clip=0.5)
    with pytest.raises(ValueError, match="rewards"):
        grpo_loss(b["hidden"].float(), b["weight"].float(), b["targets"], b["old_logp"], None)


def test_cpu_path_never_imports_triton():
    code = (
        "import sys, torch\n"
        "from mentor_fast.kernels import grpo_loss, token_logprobs\n"
        "h = torch.randn(5, 8, requires_grad=True); w = torch.randn(11, 8)\n"
        "y = torch.tensor([0, 1, 2, 3, 10]); z = torch.zeros(5)\n"
        "grpo_loss(h, w, y, z, torch.ones(5), torch.ones(5)).loss.backward(); token_logprobs(h, w, y)\n"
        "assert 'triton' not in sys.modules, 'triton was imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_every_export_resolves_and_the_enums_import_without_torch():
    import mentor_fast.kernels as k

    assert sorted(k.__all__) == sorted(k._WHERE)
    for name in k.__all__:
        assert getattr(k, name) is not None
    code = "import sys, mentor_fast.kernels.enums, mentor_fast.config; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("backend", ["torch", "reference"])
def test_a_masked_sequence_and_a_masked_token_get_exactly_no_gradient(backend):
    """sequence_mask drops every token of a sequence whose ratio product leaves the bounds, token_mask
    each token outside them: their rows of dH are exactly 0, on the fused path and the reference."""
    from mentor_fast.kernels.mismatch import mismatch_weights
    from mentor_fast.kernels.testing import sampler_logp

    b = make_batch(203, 48, 700)
    s = sampler_logp(b)
    for mode, cap in (("sequence_mask", 3.0), ("token_mask", 1.5)):
        kw = {"sampler_logp": s, "seq_ids": b["seq_ids"], "is_mode": mode, "is_cap": cap, "is_floor": 0.5}
        out, dh, _ = run_loss(grpo_loss, b, torch.float32, backend=backend, chunk_tokens=40, **kw)
        w = mismatch_weights(b["old_logp"], s, mode, cap, 0.5, b["seq_ids"])
        dropped = (w == 0) & (b["token_weights"] != 0)
        kept = (w != 0) & (b["token_weights"] != 0) & (b["advantages"] != 0)
        assert dropped.any() and kept.any(), mode
        assert float(dh[dropped].abs().max()) == 0.0, mode
        assert float(dh[kept].abs().sum()) > 0, mode  # (a kept token the PPO clip cut may have none)
        if mode == "sequence_mask":  # whole sequences: a dropped token's sequence has no kept token
            assert not set(b["seq_ids"][dropped].tolist()) & set(b["seq_ids"][kept].tolist())
        assert 0 < float(out.is_masked_frac) < 1


def test_the_tolerance_rule_reads_error_distributions_and_catches_planted_errors():
    """rule_check bounds the max and the mean error, each by 2x torch's: a kernel as accurate as
    torch overall passes even where torch is exact on single elements (the elementwise rule failed
    there); one element far off fails on the max; an error spread thinly over every element, each
    under torch's max, fails on the mean."""
    g = torch.Generator().manual_seed(0)
    ref = torch.randn(10_000, generator=g, dtype=torch.float64)
    torch_out = ref + torch.randn(10_000, generator=g, dtype=torch.float64) * 1e-7
    torch_out[:100] = ref[:100]  # torch exact on some elements
    kernel = ref + torch.randn(10_000, generator=g, dtype=torch.float64) * 1e-7  # as accurate, elsewhere exact
    assert rule_check(kernel, ref, torch_out, atol=0.0)["bad"] == []
    assert ((kernel - ref).abs() > 2 * (torch_out - ref).abs()).any()  # the elementwise rule would fail
    spike = kernel.clone()
    spike[1234] += 1e-5
    s = rule_check(spike, ref, torch_out, atol=0.0)
    assert s["bad"] == ["max"] and s["worst"] == 1234
    spread = ref + (torch_out - ref).abs().max() * 0.9  # every element near torch's worst
    assert rule_check(spread, ref, torch_out, atol=0.0)["bad"] == ["mean"]
    with pytest.raises(AssertionError, match=r"over 2x torch on the max; worst element 1234"):
        assert_close_rule("planted", spike, ref, torch_out, atol=0.0)
    b = make_batch(64, 32, 300, seed=3)
    _, dh, _ = run_loss(grpo_loss, b, torch.float32)
    _, dh64, _ = run_loss(grpo_loss_ref, b, torch.float64)
    _, dhs, _ = run_loss(grpo_loss_ref, b, torch.float32)
    assert_close_rule("dH", dh, dh64, dhs, atol=tiny_atol(torch.float32, dh64))
    with pytest.raises(AssertionError):  # a gradient 1% off, as a wrong kernel would give
        assert_close_rule("dH x 1.01", dh * 1.01, dh64, dhs, atol=tiny_atol(torch.float32, dh64))
