"""The CUDA path against the references: the Triton kernels behind grpo_loss, token_logprobs and
grpo_loss_from_logits on a GPU, compared with the float64 CPU specs under the tolerance rule
(kernels/testing.py), and a tiny training run with the fused loss against one with the reference.

Every test is gpu-marked: tests/conftest.py skips them without CUDA. `bash benchmarks/gpu_check.sh`
runs them on a GPU machine. Shapes are not powers of two and cross every boundary the CUDA launchers
have: V = 10,007 is three 4,096-wide vocab blocks (the last partial) with targets in the last one; a
chunk of 1,100 rows is more than the 1-D grid's programs (8 per SM: 1,056 on an H200), so the
grid-stride loop runs, and 2,600 rows are 3 chunks, the last partial.
"""

from __future__ import annotations

import math

import pytest
import torch
from helpers import grads_of_update, make_groups, make_updater, write_shaped_reward
from mentor_fast.kernels import (
    grpo_loss,
    grpo_loss_from_logits,
    grpo_loss_from_logits_ref,
    grpo_loss_ref,
    token_logprobs,
    token_logprobs_ref,
)
from mentor_fast.kernels.testing import LOSS_CASES, assert_close_rule, make_batch, run_loss, tiny_atol

from mentor_fast.algo.batch import build_train_batch
from mentor_fast.config import AdvantageConfig

pytestmark = pytest.mark.gpu

N, H, V, CHUNK = 2600, 72, 10007, 1100
KL_CASES = ["k1_cold", "k2_hot", "k3_cold"]  # beta > 0 for each KL estimator, temperatures on both sides of 1
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


@pytest.fixture(autouse=True)
def _exact_fp32_matmuls():
    """fp32 GEMMs stay fp32 (no TF32) whatever an earlier test set: the fp32 cases compare with CPU
    fp32, and TF32 alone would be a 1e-3 relative error."""
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def _to(b: dict, device) -> dict:
    return {k: (v.to(device) if torch.is_tensor(v) else v) for k, v in b.items()}


def check_fused_against_ref(dtype, case: dict, n=N, h=H, v=V, chunk=CHUNK, device="cuda", seed=21,
                            backend="triton", logit_scale=1.0, **extra):
    """grpo_loss with a Triton backend ("triton": the row kernels; "gemm": the GEMM head) on `device`
    against grpo_loss_ref in float64 on the CPU (inputs rounded to `dtype` first), with torch at the
    same precision on the CPU as the rule's baseline. Returns the kernel's (output, dH, dW)."""
    b = make_batch(n, h, v, seqs=16, seed=seed, temperature=case["temperature"], logit_scale=logit_scale)
    kw = {**case, "ref_logp": b["ref_logp"]}
    fp64 = {**b, "hidden": b["hidden"].to(dtype).double(), "weight": b["weight"].to(dtype).double()}
    r64, dh64, dw64 = run_loss(grpo_loss_ref, fp64, torch.float64, **kw)
    same = {"logits_dtype": torch.bfloat16} if dtype == torch.bfloat16 else {}
    rs, dhs, dws = run_loss(grpo_loss_ref, b, dtype, **kw, **same)
    bd = _to(b, device)
    out, dh, dw = run_loss(grpo_loss, bd, dtype, backend=backend, chunk_tokens=chunk,
                           **{**kw, "ref_logp": bd["ref_logp"]}, **extra)
    assert dh.device.type == torch.device(device).type and dh.dtype == dtype and dw.dtype == dtype
    # the loss is one number, a w-weighted sum over tokens: its atol adds the w-weighted log-prob error of
    # torch at the same precision (first order; it matters only where logits span hundreds of nats)
    w_err = float((b["token_weights"].double() * (rs.logp.double() - r64.logp).abs()).sum())
    assert_close_rule("loss", out.loss.cpu(), r64.loss, rs.loss, atol=tiny_atol(torch.float32, r64.loss) + w_err)
    assert_close_rule("logp", out.logp.cpu(), r64.logp, rs.logp, atol=tiny_atol(torch.float32, r64.logp))
    assert_close_rule("dH", dh.cpu(), dh64, dhs, atol=tiny_atol(dtype, dh64))
    assert_close_rule("dW", dw.cpu(), dw64, dws, atol=tiny_atol(dtype, dw64))
    assert_close_rule("entropy", out.entropy.cpu(), r64.entropy, rs.entropy,
                      atol=tiny_atol(torch.float32, r64.entropy))
    # the KL is a mean of log-prob differences: its rounding scales with the log-probs, not with it
    assert_close_rule("kl_mean", out.kl_mean.cpu(), r64.kl_mean, rs.kl_mean, atol=tiny_atol(torch.float32, r64.logp))
    assert out.clip_frac_low.item() == pytest.approx(r64.clip_frac_low.item(), abs=1e-6)
    assert out.clip_frac_high.item() == pytest.approx(r64.clip_frac_high.item(), abs=1e-6)
    return out, dh, dw


@pytest.mark.parametrize("kl", KL_CASES)
@pytest.mark.parametrize("dtype", list(DTYPES))
def test_fused_loss_on_cuda_matches_fp64_reference(dtype, kl):
    check_fused_against_ref(DTYPES[dtype], LOSS_CASES[kl])


@pytest.mark.parametrize("kl", KL_CASES)
@pytest.mark.parametrize("dtype", list(DTYPES))
def test_gemm_head_on_cuda_matches_fp64_reference(dtype, kl):
    """The GEMM head (backend="gemm": the autotuned Triton GEMM with the statistics epilogue, P' in
    the operand dtype, cuBLAS for dH and dW) on the same cases as the row kernels."""
    check_fused_against_ref(DTYPES[dtype], LOSS_CASES[kl], backend="gemm")


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_gemm_head_on_cuda_for_tokens_far_below_their_row_max(dtype):
    """Logits spread over ~200 nats (most targets more than CAP = 64 nats below their row's max): the
    epilogue's per-tile references and the fix-up kernel on the GPU, within the rule."""
    check_fused_against_ref(DTYPES[dtype], LOSS_CASES["k1_cold"], backend="gemm", logit_scale=12.0)


def test_gemm_head_logprobs_on_cuda_match_fp64_reference():
    b = make_batch(1500, H, V, seed=23, temperature=0.8)
    for dtype in DTYPES.values():
        hid, w, y = b["hidden"].to(dtype), b["weight"].to(dtype), b["targets"]
        got = token_logprobs(hid.cuda(), w.cuda(), y.cuda(), 0.8, chunk_tokens=700, backend="gemm")
        ref64 = token_logprobs_ref(hid.double(), w.double(), y, 0.8).logp
        same = token_logprobs_ref(hid, w, y, 0.8).logp
        assert_close_rule(f"GEMM K1 logp {dtype}", got.cpu(), ref64, same, atol=tiny_atol(torch.float32, ref64))


def test_default_backend_on_cuda_is_the_triton_kernel():
    """backend=None on a CUDA tensor must dispatch to the Triton row kernel (the chunked-torch path
    rounds differently, so its log-probs would not be bit-identical)."""
    b = _to(make_batch(700, H, V, seqs=8, seed=22, temperature=0.7), "cuda")
    kw = {"temperature": 0.7, "beta": 0.1, "ref_logp": b["ref_logp"], "chunk_tokens": 300}
    tri, dh_t, _ = run_loss(grpo_loss, b, torch.float32, backend="triton", **kw)
    dflt, dh_d, _ = run_loss(grpo_loss, b, torch.float32, **kw)
    assert torch.equal(dflt.logp, tri.logp) and torch.equal(dflt.loss, tri.loss)
    torch.testing.assert_close(dh_d, dh_t, rtol=1e-6, atol=0)


def check_logprobs_against_ref(dtype, n=1500, h=H, v=V, device="cuda", temperature=0.8, chunk=700):
    b = make_batch(n, h, v, seed=23, temperature=temperature)
    hid, w, y = b["hidden"].to(dtype), b["weight"].to(dtype), b["targets"]
    got = token_logprobs(hid.to(device), w.to(device), y.to(device), temperature, chunk_tokens=chunk)
    assert got.device.type == torch.device(device).type and got.dtype == torch.float32
    ref64 = token_logprobs_ref(hid.double(), w.double(), y, temperature).logp
    same = token_logprobs_ref(hid, w, y, temperature).logp  # fp32 math on the same rounded inputs
    assert_close_rule(f"K1 logp {dtype}", got.cpu(), ref64, same, atol=tiny_atol(torch.float32, ref64))


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_token_logprobs_on_cuda_matches_fp64_reference(dtype):
    check_logprobs_against_ref(DTYPES[dtype])


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs a second CUDA device")
def test_a_tensor_on_cuda1_gives_what_cuda0_gives():
    """The launchers run on the tensor's device, not the current one (which stays cuda:0 here)."""
    assert torch.cuda.current_device() == 0
    b = make_batch(900, H, V, seqs=8, seed=24, temperature=0.7)
    kw = {"temperature": 0.7, "beta": 0.1, "chunk_tokens": 400}
    res = {}
    for dev in ("cuda:0", "cuda:1"):
        bd = _to(b, dev)
        out, dh, dw = run_loss(grpo_loss, bd, torch.float32, ref_logp=bd["ref_logp"], **kw)
        lp = token_logprobs(bd["hidden"].float(), bd["weight"].float(), bd["targets"], 0.7)
        z = (bd["hidden"].float() @ bd["weight"].float().T).requires_grad_()
        lo = grpo_loss_from_logits(z, bd["targets"], bd["old_logp"], bd["advantages"], bd["token_weights"])
        lo.loss.backward()
        assert dh.device == torch.device(dev) and lp.device == torch.device(dev) and z.grad.device == torch.device(dev)
        res[dev] = [t.detach().cpu() for t in (out.loss, out.logp, dh, dw, lp, lo.logp, z.grad)]
    assert torch.cuda.current_device() == 0
    for name, a, c in zip(("loss", "logp", "dH", "dW", "K1 logp", "logits logp", "dlogits"),
                          res["cuda:0"], res["cuda:1"]):
        torch.testing.assert_close(c, a, rtol=1e-5, atol=1e-7, msg=lambda m, name=name: f"{name}: {m}")


def check_many_rows(device="cuda", n=70_000, v=1000, h=64):
    """n rows in one launch (more than a 2-D grid's 65,535), through the logits-level row kernel and
    through grpo_loss with one chunk of all n rows."""
    g = torch.Generator().manual_seed(25)
    z16 = (torch.randn(n, v, generator=g) * 3).to(torch.bfloat16)
    y = torch.randint(0, v, (n,), generator=g)
    y[-1] = v - 1
    with torch.no_grad():
        logp = torch.log_softmax(z16.double(), -1).gather(1, y[:, None])[:, 0]
    old = (logp + (torch.rand(n, generator=g, dtype=torch.float64) - 0.5) * 1.2).float()
    ref = (logp + torch.randn(n, generator=g, dtype=torch.float64) * 0.3).float()
    adv = torch.randn(n, generator=g)
    w = torch.rand(n, generator=g) / n
    w[::7] = 0.0
    args, kw = (y, old, adv, w), {"ref_logp": ref, "beta": 0.05}
    # same precision: the spec's fp32 math on the bf16 logits, its gradient rounded to bf16 at the leaf
    z64, z32 = z16.double().requires_grad_(), z16.clone().requires_grad_()
    r64, r32 = (grpo_loss_from_logits_ref(z, *args, **kw) for z in (z64, z32))
    r64.loss.backward()
    r32.loss.backward()
    zd = z16.to(device).requires_grad_()
    out = grpo_loss_from_logits(zd, *(a.to(device) for a in args), backend="triton",
                                **{**kw, "ref_logp": ref.to(device)})
    out.loss.backward()
    assert_close_rule("rows loss", out.loss.cpu(), r64.loss, r32.loss, atol=tiny_atol(torch.float32, r64.loss))
    assert_close_rule("rows logp", out.logp.cpu(), r64.logp, r32.logp, atol=tiny_atol(torch.float32, r64.logp))
    assert_close_rule("rows dlogits", zd.grad.cpu(), z64.grad, z32.grad, atol=tiny_atol(torch.bfloat16, z64.grad))

    b = make_batch(n, h, v, seqs=64, seed=26)
    kw = {"ref_logp": b["ref_logp"], "beta": 0.05}
    r64, dh64, dw64 = run_loss(grpo_loss_ref, b, torch.float64, **kw)
    rs, dhs, dws = run_loss(grpo_loss_ref, b, torch.float32, **kw)
    bd = _to(b, device)
    got, dh, dw = run_loss(grpo_loss, bd, torch.float32, backend="triton", chunk_tokens=n,
                           **{**kw, "ref_logp": bd["ref_logp"]})
    assert_close_rule("one chunk loss", got.loss.cpu(), r64.loss, rs.loss, atol=tiny_atol(torch.float32, r64.loss))
    assert_close_rule("one chunk logp", got.logp.cpu(), r64.logp, rs.logp, atol=tiny_atol(torch.float32, r64.logp))
    assert_close_rule("one chunk dH", dh.cpu(), dh64, dhs, atol=tiny_atol(torch.float32, dh64))
    assert_close_rule("one chunk dW", dw.cpu(), dw64, dws, atol=tiny_atol(torch.float32, dw64))


def test_more_rows_than_a_2d_grid_allows():
    check_many_rows()


@pytest.mark.parametrize("impl", ["fused", "fused_gemm"])
def test_fused_run_on_gpu_matches_reference_run(tmp_path, monkeypatch, impl):
    """Tiny model on the GPU, same seed: loss.impl=fused (Triton row kernel, chunked GEMMs) against
    loss.impl=reference (materialised logits, autograd). The rollouts before the first update are
    the same samples, and every later step sees the same samples too (same rewards, asserted).

    Tolerance rel 1e-4 (abs 1e-6) per step on loss, grad_norm and entropy, as the CPU test: both
    paths compute the fp32 log-softmax of the same fp32 logits (no TF32: the tiny model is fp32 and
    torch keeps fp32 matmuls exact by default), in a different order (4,096-wide online log-sum-exp
    vs one torch log-softmax; chunked vs one GEMM; GPU reductions), so log-probs agree to ~1e-6
    relative; after 3 Adam steps of lr 1e-4 the weights differ by ~1e-7, far below what flips a
    sampled token, so the per-step metrics agree to ~1e-5. The kernel tests above are what catch a
    wrong gradient element by element; this run checks that the trainer's wiring on the GPU gives the
    same training with either loss. A grad_norm of 0 (nothing to learn: a vacuous match) is refused."""
    from mentor_fast.config import load_config
    from mentor_fast.metrics import read_metrics
    from mentor_fast.trainer import Trainer

    reward_fn = write_shaped_reward(tmp_path, monkeypatch, "gpu_tiny_rewards")
    rows = {}
    for run, name in (("reference", "reference"), (impl, "fused")):
        cfg = load_config(["configs/tiny_test.yaml"], [
            f"output_dir={tmp_path / run}", "model.device=cuda", f"loss.impl={run}", "trainer.max_steps=3",
            "trainer.tensorboard=false", "trainer.progress=false", "model.tf32=false", "model.liger=false",
            reward_fn])
        rows[name] = read_metrics(Trainer(cfg).fit() / "metrics.jsonl")
    assert [r["step"] for r in rows["fused"]] == [r["step"] for r in rows["reference"]] == [1, 2, 3]
    assert rows["fused"][0]["grad_norm"] > 0 and rows["fused"][-1]["perf/peak_mem_gb"] > 0  # it ran on the GPU
    for ref, fused in zip(rows["reference"], rows["fused"]):
        assert fused["reward/mean"] == ref["reward/mean"], f"step {ref['step']}: different samples"
        for key in ("loss", "grad_norm", "entropy"):
            assert fused[key] == pytest.approx(ref[key], rel=1e-4, abs=1e-6), (ref["step"], key)


def test_bf16_head_on_fp32_master_weights_native_path():
    """compute_dtype=bf16 with fp32 hidden and master weight on CUDA: bf16 GEMMs with fp32 output
    (torch.mm out_dtype), fp32 dW. Within the rule of the bf16-rounded inputs; dW's error is far
    below one bf16 rounding of dW (the gradient reaches the master weight unrounded)."""
    bf = torch.bfloat16
    case = {"temperature": 0.7, "beta": 0.1, "kl_estimator": "k3"}
    b = make_batch(N, H, V, seqs=16, seed=31, temperature=0.7)
    kw = {**case, "ref_logp": b["ref_logp"]}
    fp64 = {**b, "hidden": b["hidden"].to(bf).double(), "weight": b["weight"].to(bf).double()}
    r64, dh64, dw64 = run_loss(grpo_loss_ref, fp64, torch.float64, **kw)
    rs, dhs, dws = run_loss(grpo_loss_ref, b, torch.float32, **kw, compute_dtype=bf, logits_dtype=bf)
    bd = _to(b, "cuda")
    for backend in ("triton", "gemm"):
        got, dh, dw = run_loss(grpo_loss, bd, torch.float32, **{**kw, "ref_logp": bd["ref_logp"]},
                               compute_dtype=bf, chunk_tokens=CHUNK, backend=backend)
        assert dh.dtype == torch.float32 and dw.dtype == torch.float32
        for name, x, ref, same in (("loss", got.loss, r64.loss, rs.loss), ("logp", got.logp, r64.logp, rs.logp)):
            assert_close_rule(f"{backend} bf16-compute {name}", x.cpu(), ref, same, atol=tiny_atol(torch.float32, ref))
        assert_close_rule(f"{backend} bf16-compute dH", dh.cpu(), dh64, dhs, atol=tiny_atol(bf, dh64))
        assert_close_rule(f"{backend} bf16-compute dW", dw.cpu(), dw64, dws, atol=tiny_atol(torch.float32, dw64))
        rounding = (dw64.to(bf).double() - dw64).abs().max().item()
        assert (dw.cpu().double() - dw64).abs().max().item() < rounding / 4


def test_liger_patched_policy_matches_the_plain_one(tiny_model_path):
    """Liger's RMSNorm / SwiGLU / RoPE on the tiny Llama (fp32, CUDA) against the unpatched model:
    hidden states and parameter gradients to fp32 noise. In a subprocess: the patch is global."""
    pytest.importorskip("liger_kernel", reason="needs liger-kernel (make gpu-wheels)")
    import subprocess
    import sys

    code = f"""
import copy, torch
torch.backends.cuda.matmul.allow_tf32 = False
from mentor_fast.models import load_policy, patch_liger
plain = load_policy({str(tiny_model_path)!r}).cuda()
liger = copy.deepcopy(plain)
patch_liger(liger)
ids = torch.randint(0, 40000, (3, 37), generator=torch.Generator().manual_seed(0)).cuda()
out = []
for m in (plain, liger):
    h = m.model(input_ids=ids).last_hidden_state
    (h.float() ** 2).mean().backward()
    out.append((h.detach(), {{n: p.grad for n, p in m.named_parameters()}}))
(h0, g0), (h1, g1) = out
err_h = ((h1 - h0).abs().max() / h0.abs().max()).item()
err_g = max(((g1[n] - g0[n]).norm() / g0[n].norm().clamp_min(1e-30)).item() for n in g0)
assert liger.model.norm._get_name() == "LigerRMSNorm", liger.model.norm._get_name()
print(err_h, err_g)
assert err_h < 1e-4 and err_g < 1e-3, (err_h, err_g)
"""
    out = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]


def test_bf16_update_on_gpu_fused_is_within_the_rule_of_torch(tiny_model_path):
    """model.autocast_bf16 on the GPU (fp32 master weights, bf16 decoder, the bf16-operand head), one
    update on fixed rollouts, so both losses score the same samples: per parameter, the fused head's
    gradient is as close to a float64 update as torch's bf16 update (the reference loss on
    materialised logits under the same autocast) by the rule on error distributions. Two bf16 *runs*
    are not compared past their first step: one update apart they sample different tokens (reduction
    order moves a bf16 rounding), so their later steps score different samples."""
    batch = build_train_batch(make_groups([[1, 0, 0, 1], [0, 1, 1], [1, 0]]), AdvantageConfig())
    fused, _ = grads_of_update(make_updater(tiny_model_path, "fused", bf16=True, device="cuda"), batch)
    ref, _ = grads_of_update(make_updater(tiny_model_path, "reference", bf16=True, device="cuda"), batch)
    g64, _ = grads_of_update(make_updater(tiny_model_path, "reference", dtype=torch.float64, device="cuda"), batch)
    assert all(g.dtype == torch.float32 for g in fused.values())
    for name, want in g64.items():
        assert_close_rule(f"bf16 update {name}", fused[name], want, ref[name], atol=tiny_atol(torch.float32, want))
    assert max(float((fused[n].double() - g64[n]).abs().max()) for n in g64) > 0, "bf16 was not in effect"


def test_bf16_training_run_on_gpu_fused_and_reference_agree_on_their_shared_first_step(tmp_path, monkeypatch):
    """The trainer's wiring with model.autocast_bf16 on the GPU: fused and reference runs draw the same
    first step (same weights, same seeds), so its reward is equal and its loss and grad_norm agree to
    bf16 head noise; both runs go on to a finite second step (whose samples may differ, see above)."""
    from mentor_fast.config import load_config
    from mentor_fast.metrics import read_metrics
    from mentor_fast.trainer import Trainer

    reward_fn = write_shaped_reward(tmp_path, monkeypatch, "gpu_tiny_rewards")
    rows = {}
    for impl in ("reference", "fused"):
        cfg = load_config(["configs/tiny_test.yaml"], [
            f"output_dir={tmp_path / impl}", "model.device=cuda", f"loss.impl={impl}", "trainer.max_steps=2",
            "model.autocast_bf16=true", "model.liger=false", "trainer.tensorboard=false", "trainer.progress=false",
            reward_fn])
        rows[impl] = read_metrics(Trainer(cfg).fit() / "metrics.jsonl")
    ref, fused = rows["reference"][0], rows["fused"][0]
    assert fused["grad_norm"] > 0 and fused["reward/mean"] == ref["reward/mean"]
    for key in ("loss", "grad_norm"):
        assert fused[key] == pytest.approx(ref[key], rel=1e-3, abs=1e-6), key
    assert all(len(r) == 2 and all(math.isfinite(x["loss"]) for x in r) for r in rows.values())
