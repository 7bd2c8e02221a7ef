"""Triton kernels (K1 row kernel, K2 row kernel with in-kernel K0, logits-level op) against the
float64 references. Without CUDA they run under the Triton interpreter (TRITON_INTERPRET=1, set
here before triton is first imported), ~200x slower than torch, so the shapes are small but still
cross every block boundary: V = 1,000 (one partial block) and 5,003 (three 2,048-wide blocks, the
last partial), targets in the last block, and fewer programs than rows (grid-stride loop).
"""

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton", reason="triton is not installed (pip install triton)")
if not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("no CUDA and TRITON_INTERPRET is not 1", allow_module_level=True)

from mentor_fast.kernels import (
    AdvantageConfig,
    group_advantages,
    grpo_loss,
    grpo_loss_from_logits,
    grpo_loss_from_logits_ref,
    grpo_loss_ref,
    token_logprob_stats,
    token_logprobs_ref,
)
from mentor_fast.kernels.gemm_head import CAP, combine_stats, rescale_tiles_, softmax_stats_gemm
from mentor_fast.kernels.logprobs import logprob_rows_triton
from mentor_fast.kernels.testing import (
    assert_close_rule,
    case_temperature,
    loss_kwargs,
    make_batch,
    run_loss,
    tiny_atol,
)

DEV = "cuda" if torch.cuda.is_available() else "cpu"


def _on(b):
    return {k: (v.to(DEV) if torch.is_tensor(v) else v) for k, v in b.items()}


def test_logprob_rows_kernel_matches_ref():
    b = make_batch(41, 64, 5003, temperature=0.7)
    st = token_logprob_stats(b["hidden"].float().to(DEV), b["weight"].float().to(DEV), b["targets"].to(DEV),
                             0.7, backend="triton")
    r64 = token_logprobs_ref(b["hidden"], b["weight"], b["targets"], 0.7)
    r32 = token_logprobs_ref(b["hidden"].float(), b["weight"].float(), b["targets"], 0.7)
    for name in ("logp", "lse", "entropy"):
        ref = getattr(r64, name)
        assert_close_rule(f"K1 {name}", getattr(st, name).cpu(), ref, getattr(r32, name),
                          atol=tiny_atol(torch.float32, ref))


def test_logprob_rows_kernel_reads_bf16_logits():
    g = torch.Generator().manual_seed(2)
    z = (torch.randn(37, 1000, generator=g) * 4).to(torch.bfloat16)
    y = torch.randint(0, 1000, (37,), generator=g)
    y[-1] = 999
    st = logprob_rows_triton(z.to(DEV), y.to(DEV), inv_temp=1 / 0.9)
    ref = torch.log_softmax(z.double() / 0.9, -1).gather(1, y[:, None])[:, 0]
    assert (st.logp.cpu().double() - ref).abs().max() < 2e-5  # fp32 math on the exact bf16 values


TRITON_CASES = ["temperature_dual_clip_k3", "entropy_bonus_is_k2", "gspo", "gspo_entropy_bonus", "cispo_is_k1",
                "sapo_k3_cold", "is_token_mask_two_sided", "is_sequence_truncate"]


def _check(b, dtype, case, n_chunk, backend="triton", compute_dtype=None):
    """`backend` on inputs of `dtype` (with `compute_dtype`: operands rounded to it, as the mixed-
    precision head takes them) against fp64 on the same rounded inputs, torch at that precision as
    the rule's baseline."""
    rd = compute_dtype or dtype
    fp64 = {**b, "hidden": b["hidden"].to(rd).double(), "weight": b["weight"].to(rd).double()}
    r64, dh64, dw64 = run_loss(grpo_loss_ref, fp64, torch.float64, **loss_kwargs(b, case))
    same = {"logits_dtype": torch.bfloat16} if rd == torch.bfloat16 else {}
    if compute_dtype is not None:
        same["compute_dtype"] = compute_dtype
    rs, dhs, dws = run_loss(grpo_loss_ref, b, dtype, **loss_kwargs(b, case), **same)
    bd = _on(b)
    kw = {"compute_dtype": compute_dtype} if compute_dtype is not None else {}
    out, dh, dw = run_loss(grpo_loss, bd, dtype, backend=backend, chunk_tokens=n_chunk, **loss_kwargs(bd, case), **kw)
    assert_close_rule("loss", out.loss.cpu(), r64.loss, rs.loss, atol=tiny_atol(torch.float32, r64.loss))
    assert_close_rule("logp", out.logp.cpu(), r64.logp, rs.logp, atol=tiny_atol(torch.float32, r64.logp))
    assert_close_rule("dH", dh.cpu(), dh64, dhs, atol=tiny_atol(dtype, dh64))
    assert_close_rule("dW", dw.cpu(), dw64, dws, atol=tiny_atol(dtype, dw64))
    assert out.clip_frac_low.item() == pytest.approx(r64.clip_frac_low.item(), abs=1e-6)
    if out.entropy is not None:
        assert_close_rule("entropy", out.entropy.cpu(), r64.entropy, rs.entropy, atol=tiny_atol(torch.float32, r64.entropy))


@pytest.mark.parametrize("case", TRITON_CASES)
def test_grpo_rows_kernel_fp32(case):
    b = make_batch(53, 64, 1000, seed=11, temperature=case_temperature(case))
    _check(b, torch.float32, case, n_chunk=24)


def test_grpo_rows_kernel_bf16_in_place_half_rows():
    # bf16 dz is written into the first half of each fp32 logits row: crosses 3 blocks of V = 5003
    b = make_batch(29, 72, 5003, seed=12, temperature=0.7)
    _check(b, torch.bfloat16, "temperature_dual_clip_k3", n_chunk=16)


def test_float64_inputs_with_an_odd_vocabulary_run_on_the_triton_backend():
    """fp64 hidden and weight (any V, here odd: an fp64 dz cannot be viewed into an fp32 row) through
    the Triton K2 and K1 paths: the head computes in fp32 as on the torch path, the gradients come
    back in fp64, and the results are within the rule of torch in fp32 on the same inputs."""
    b = make_batch(37, 64, 1003, seed=16, temperature=0.7)
    kw = {"temperature": 0.7, "beta": 0.1, "kl_estimator": "k3", "ref_logp": b["ref_logp"]}
    r64, dh64, dw64 = run_loss(grpo_loss_ref, b, torch.float64, **kw)
    rs, dhs, dws = run_loss(grpo_loss_ref, b, torch.float32, **kw)
    bd = _on(b)
    out, dh, dw = run_loss(grpo_loss, bd, torch.float64, backend="triton", chunk_tokens=16,
                           **{**kw, "ref_logp": bd["ref_logp"]})
    assert dh.dtype == dw.dtype == torch.float64
    assert_close_rule("fp64 loss", out.loss.cpu(), r64.loss, rs.loss, atol=tiny_atol(torch.float32, r64.loss))
    assert_close_rule("fp64 dH", dh.cpu(), dh64, dhs, atol=tiny_atol(torch.float32, dh64))
    assert_close_rule("fp64 dW", dw.cpu(), dw64, dws, atol=tiny_atol(torch.float32, dw64))
    st = token_logprob_stats(bd["hidden"], bd["weight"], bd["targets"], 0.7, backend="triton", chunk_tokens=16)
    ref = token_logprobs_ref(b["hidden"], b["weight"], b["targets"], 0.7).logp
    same = token_logprobs_ref(b["hidden"].float(), b["weight"].float(), b["targets"], 0.7).logp
    assert_close_rule("fp64 K1 logp", st.logp.cpu(), ref, same, atol=tiny_atol(torch.float32, ref))
    z64 = (b["hidden"] @ b["weight"].T).to(DEV).requires_grad_()
    lo = grpo_loss_from_logits(z64, *(bd[k] for k in ("targets", "old_logp", "advantages", "token_weights")),
                               backend="triton", **{**kw, "ref_logp": bd["ref_logp"]})
    lo.loss.backward()
    assert z64.grad.dtype == torch.float64
    assert lo.loss.item() == pytest.approx(r64.loss.item(), rel=1e-5)


# ---------------------------------------------------------------- the GEMM head (kernels/gemm_head.py)
# Interpreter tiles: BM = 16 rows, BN = 64 vocab columns, BK = 32 (triton_gemm._configs), so 24-row
# chunks are two row tiles (the last partial), V = 1,003 is 16 vocab tiles (the last partial) and H = 72
# three K steps (the last partial).
GEMM_CASES = ["base", "temperature_dual_clip_k3", "k3_beta", "entropy_bonus_is_k2", "gspo", "cispo_is_k1",
              "sapo_k3_cold", "is_sequence_truncate"]


@pytest.mark.parametrize("case", GEMM_CASES)
def test_gemm_head_matches_the_fp64_reference(case):
    b = make_batch(53, 72, 1003, seed=17, temperature=case_temperature(case))
    _check(b, torch.float32, case, n_chunk=24, backend="gemm")


def test_gemm_head_on_bf16_rounded_operands_of_fp32_master_weights():
    b = make_batch(40, 72, 1003, seed=18, temperature=0.7)
    _check(b, torch.float32, "temperature_dual_clip_k3", n_chunk=24, backend="gemm", compute_dtype=torch.bfloat16)


def test_gemm_head_on_tokens_far_below_their_row_max():
    """Logits spread over ~200 nats: most targets lie more than CAP (64) below their row's max, so the
    epilogue writes those tiles against m_t - CAP and the fix-up rescales the rows: the gradients stay
    within the rule, and the scaled probabilities stay finite."""
    b = make_batch(45, 64, 1003, seed=19, logit_scale=12.0)
    x = b["hidden"] @ b["weight"].T
    far = (x.max(1).values - x.gather(1, b["targets"][:, None])[:, 0]) > CAP
    assert far.float().mean() > 0.5
    _check(b, torch.float32, "k1_beta", n_chunk=24, backend="gemm")


def test_gemm_epilogue_writes_bf16_scaled_probabilities_and_the_fixup_rescales_them():
    """The launcher on bf16 operands: the statistics against the fp32 logits of the same values, and
    P' in bf16 against its definition e^(x - r) (target 0) after the fix-up, to one bf16 step per
    rounding (the interpreter truncates where a GPU rounds to nearest)."""
    g = torch.Generator().manual_seed(20)
    hs, w = torch.randn(37, 40, generator=g).bfloat16(), (torch.randn(1003, 40, generator=g) / 2).bfloat16()
    y = torch.randint(0, 1003, (37,), generator=g)
    x = hs.double() @ w.double().T
    m0 = x.gather(1, y[:, None])[:, 0].float()
    m0[5] -= 90.0  # row 5's tiles lie above m0 + CAP: written against m_t - CAP, then rescaled
    p = torch.empty(37, 1003, dtype=torch.bfloat16, device=DEV)
    st, x_y, bn = softmax_stats_gemm(hs.to(DEV), w.to(DEV), 1.0, y.to(DEV), m0=m0.to(DEV), p_out=p)
    assert (x_y.cpu().double() - x.gather(1, y[:, None])[:, 0]).abs().max() < 1e-5
    lse, ent, big = (t.cpu().double() for t in combine_stats(st))
    lp = torch.log_softmax(x, 1)
    assert (lse - torch.logsumexp(x, 1)).abs().max() < 1e-5
    assert (ent + (lp.exp() * lp).sum(1)).abs().max() < 1e-5
    r = torch.maximum(m0.double(), big - CAP)
    assert r[5] > m0[5] and torch.equal(r[:5], m0[:5].double())
    rescale_tiles_(p, st, m0.to(DEV), r.float().to(DEV), bn)
    want = torch.exp(x - r[:, None]).scatter_(1, y[:, None], 0.0)
    err = (p.cpu().double() - want).abs()
    assert torch.isfinite(p.cpu().float()).all()
    assert (err[torch.arange(37) != 5] <= 2**-7 * want[torch.arange(37) != 5]).all()  # one bf16 step
    assert (err[5] <= 2**-6 * want[5]).all()  # stored, then rescaled and stored again: two steps


def test_gemm_head_logprobs_without_writing_logits():
    b = make_batch(41, 72, 1003, temperature=0.7)
    st = token_logprob_stats(b["hidden"].float().to(DEV), b["weight"].float().to(DEV), b["targets"].to(DEV),
                             0.7, backend="gemm")
    r64 = token_logprobs_ref(b["hidden"], b["weight"], b["targets"], 0.7)
    r32 = token_logprobs_ref(b["hidden"].float(), b["weight"].float(), b["targets"], 0.7)
    for name in ("logp", "lse", "entropy"):
        ref = getattr(r64, name)
        assert_close_rule(f"GEMM K1 {name}", getattr(st, name).cpu(), ref, getattr(r32, name),
                          atol=tiny_atol(torch.float32, ref))


@pytest.mark.parametrize("estimator", ["grpo", "dr_grpo", "batch", "rloo"])
def test_advantages_inside_the_row_kernel(estimator):
    b = make_batch(24, 64, 64, seqs=8, seed=13)  # V = 64: one block, so this checks K0 only
    b["rewards"][4:8] = torch.tensor([1.0, 0.0, 0.0, 0.0])  # group 1: one success in four
    kw = {"rewards": b["rewards"], "seq_ids": b["seq_ids"], "group_ids": b["group_ids"], "advantage": AdvantageConfig(estimator)}
    bd = _on(dict(b, advantages=None))
    out, dh, _ = run_loss(grpo_loss, bd, torch.float32, backend="triton",
                          **{k: (v.to(DEV) if torch.is_tensor(v) else v) for k, v in kw.items()})
    want = group_advantages(b["rewards"], b["group_ids"], estimator)[b["seq_ids"]]
    assert torch.allclose(out.advantages.cpu(), want, atol=1e-5), (out.advantages, want)
    assert (out.advantages.cpu()[b["seq_ids"] < 4] == 0).all()  # identical rewards -> exactly 0
    ref, dh_ref, _ = run_loss(grpo_loss_ref, dict(b, advantages=want), torch.float32)
    assert torch.allclose(dh.cpu(), dh_ref, atol=tiny_atol(torch.float32, dh_ref))
    assert out.loss.item() == pytest.approx(ref.loss.item(), rel=1e-5, abs=1e-9)


@pytest.mark.parametrize("dtype,inplace", [(torch.float32, True), (torch.bfloat16, False)])
def test_logits_level_op(dtype, inplace):
    b = make_batch(45, 64, 1000, seed=14, temperature=0.8)
    logits64 = (b["hidden"] @ b["weight"].T).to(dtype).double().requires_grad_()
    kw = {"temperature": 0.8, "beta": 0.1, "ref_logp": b["ref_logp"], "dual_clip": 2.5}
    args = (b["targets"], b["old_logp"], b["advantages"], b["token_weights"])
    r64 = grpo_loss_from_logits_ref(logits64, *args, **kw)
    r64.loss.backward()
    lt = logits64.detach().to(dtype).requires_grad_()
    rs = grpo_loss_from_logits_ref(lt, *args, **kw)
    rs.loss.backward()
    for backend in ("triton", "torch"):
        z = logits64.detach().to(dtype).to(DEV).requires_grad_()
        out = grpo_loss_from_logits(z, *(a.to(DEV) for a in args), backend=backend, inplace=inplace,
                                    **{**kw, "ref_logp": b["ref_logp"].to(DEV)})
        out.loss.backward()
        if inplace:  # the logits buffer itself was overwritten with the gradient
            assert torch.equal(z.detach(), z.grad)
        assert_close_rule(f"{backend} dlogits", z.grad.cpu(), logits64.grad, lt.grad,
                          atol=tiny_atol(dtype, logits64.grad))
        assert_close_rule(f"{backend} logp", out.logp.cpu(), r64.logp, rs.logp,
                          atol=tiny_atol(torch.float32, r64.logp))


@pytest.mark.slow
def test_grpo_rows_kernel_large_interpreter_shape():
    b = make_batch(1030, 96, 5003, seed=15)
    _check(b, torch.float32, "temperature_dual_clip_k3", n_chunk=512)
