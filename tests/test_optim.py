"""AdamW with bf16 moments (optim.state_dtype=bfloat16, mentor_fast/optim.py)."""

from __future__ import annotations

import pytest
import torch
from helpers import write_shaped_reward

from mentor_fast.config import OptimConfig
from mentor_fast.optim import AdamWBF16States, pending_state_bytes, store_bf16_
from mentor_fast.update import build_optimizer


def test_moments_are_bf16_and_the_steps_follow_torch_adamw():
    torch.manual_seed(0)
    w = torch.randn(300, 40)
    a, b = w.clone().requires_grad_(), w.clone().requires_grad_()
    ref = torch.optim.AdamW([a], lr=1e-2, weight_decay=0.1)
    opt = AdamWBF16States([b], lr=1e-2, weight_decay=0.1)
    for _ in range(20):
        g = torch.randn_like(w)
        a.grad, b.grad = g.clone(), g.clone()
        ref.step()
        opt.step()
    state = opt.state[b]
    assert state["exp_avg"].dtype == state["exp_avg_sq"].dtype == torch.bfloat16 and b.dtype == torch.float32
    moved = (a - w).norm()
    assert float((b - a).norm() / moved) < 2e-2  # bf16 moments: percent-level, not a different optimizer


def test_stochastic_store_is_unbiased_where_rounding_to_nearest_stalls():
    """beta2 = 0.999 decay of a second moment with no new gradient: fp32 gives 0.999^200 = 0.819;
    rounding to nearest keeps 1.0 for ever (a 0.1% step is under half a bf16 gap); the stochastic
    store tracks the fp32 value on average."""
    gen = torch.Generator().manual_seed(0)
    nearest = torch.ones(20000, dtype=torch.bfloat16)
    sr = torch.ones(20000, dtype=torch.bfloat16)
    for _ in range(200):
        nearest.copy_(nearest.float() * 0.999)
        store_bf16_(sr, sr.float() * 0.999, gen)
    assert float(nearest.float().mean()) == 1.0
    assert float(sr.float().mean()) == pytest.approx(0.999**200, rel=2e-3)
    x = torch.full((100000,), 1.0 + 2**-9, dtype=torch.float32)  # a quarter of the way from 1 to 1 + 2^-7
    out = torch.empty(100000, dtype=torch.bfloat16)
    store_bf16_(out, x, gen)
    assert set(out.float().unique().tolist()) == {1.0, 1.0 + 2**-7}
    assert float(out.float().mean()) == pytest.approx(1.0 + 2**-9, abs=2e-5)


@pytest.mark.parametrize("stochastic", [True, False])
def test_the_foreach_step_gives_the_loops_bits(stochastic):
    """The bucketed foreach step against the per-parameter loop (its specification), over shapes that
    are not powers of two, a bucket limit that cuts between parameters and a parameter bigger than a
    bucket, weight decay, and a parameter that has no gradient on one step. On the CPU the noise is
    drawn in the loop's order, so the moments and the weights agree bit for bit."""
    torch.manual_seed(0)
    shapes = [(37, 5), (300,), (11, 3, 7), (1,), (129, 2)]
    weights = [torch.randn(s) for s in shapes]
    loop_p = [w.clone().requires_grad_() for w in weights]
    each_p = [w.clone().requires_grad_() for w in weights]
    loop = AdamWBF16States(loop_p, lr=1e-2, weight_decay=0.1, stochastic=stochastic, foreach=False)
    each = AdamWBF16States(each_p, lr=1e-2, weight_decay=0.1, stochastic=stochastic, bucket_elements=250)
    for step in range(6):
        for i, (a, b) in enumerate(zip(loop_p, each_p)):
            g = None if (step == 2 and i == 1) else torch.randn_like(a)
            a.grad, b.grad = g, None if g is None else g.clone()
        loop.step()
        each.step()
    for a, b in zip(loop_p, each_p):
        assert torch.equal(a, b)
        for key in ("exp_avg", "exp_avg_sq", "step"):
            assert torch.equal(loop.state[a][key], each.state[b][key]), key
    assert not torch.equal(loop_p[0], weights[0])


def test_config_picks_it_and_its_implementation():
    model = torch.nn.Linear(4, 3)
    opt, _ = build_optimizer(model, OptimConfig(lr=1e-3, state_dtype="bfloat16"), max_steps=5)
    assert isinstance(opt, AdamWBF16States) and opt.foreach
    loop, _ = build_optimizer(model, OptimConfig(lr=1e-3, state_dtype="bfloat16", implementation="for_loop"), 5)
    assert not loop.foreach
    assert isinstance(build_optimizer(model, OptimConfig(lr=1e-3), max_steps=5)[0], torch.optim.AdamW)
    flags = {impl: build_optimizer(model, OptimConfig(lr=1e-3, implementation=impl), 5)[0].defaults
             for impl in ("auto", "fused", "foreach", "for_loop")}
    # auto on the CPU leaves the choice to torch (its loop); fused is taken where every parameter is on CUDA
    assert flags["auto"]["fused"] is None and flags["auto"]["foreach"] is None
    assert flags["fused"]["fused"] and flags["foreach"]["foreach"] and not flags["for_loop"]["foreach"]


def test_pending_state_counts_what_the_first_step_allocates():
    model = torch.nn.Linear(40, 30)
    n = sum(p.numel() for p in model.parameters())
    for dtype, moments in (("float32", 8), ("bfloat16", 4)):
        opt, _ = build_optimizer(model, OptimConfig(lr=1e-3, state_dtype=dtype), max_steps=5)
        assert pending_state_bytes(opt) == n * (4 + moments)  # gradients and both moments
        model(torch.randn(2, 40)).sum().backward()
        assert pending_state_bytes(opt) == n * moments
        opt.step()
        assert pending_state_bytes(opt) == 0
        model.zero_grad(set_to_none=True)


def test_a_run_checkpoints_and_resumes_the_bf16_moments(tmp_path, monkeypatch):
    from mentor_fast.config import load_config
    from mentor_fast.trainer import Trainer

    overrides = [f"output_dir={tmp_path / 'run'}", "trainer.max_steps=1", "trainer.tensorboard=false",
                 "optim.state_dtype=bfloat16", write_shaped_reward(tmp_path, monkeypatch)]
    first = Trainer(load_config(["configs/tiny_test.yaml"], overrides))
    first.fit()
    saved = {n: first.optimizer.state[p]["exp_avg_sq"].clone() for n, p in first.model.named_parameters()}
    again = Trainer(load_config(["configs/tiny_test.yaml"], [*overrides[:1], "trainer.max_steps=2", *overrides[2:]]),
                    resume="auto")
    for n, p in again.model.named_parameters():
        got = again.optimizer.state[p]["exp_avg_sq"]
        assert got.dtype == torch.bfloat16 and torch.equal(got, saved[n]), n
    assert any(float(v.abs().max()) > 0 for v in saved.values())  # a real step was taken and kept


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_a_gpu_the_foreach_step_follows_the_loop():
    """On CUDA: round-to-nearest moments bit for bit (the same fp32 ops, foreach); stochastic rounding
    draws another stream there (Philox per call), so its weights agree to a bf16 rounding of the
    moments' effect, far below one step."""
    torch.manual_seed(0)
    weights = [torch.randn(s, device="cuda") for s in [(37, 5), (300,), (11, 3, 7)]]
    for stochastic in (False, True):
        loop_p = [w.clone().requires_grad_() for w in weights]
        each_p = [w.clone().requires_grad_() for w in weights]
        loop = AdamWBF16States(loop_p, lr=1e-2, weight_decay=0.1, stochastic=stochastic, foreach=False)
        each = AdamWBF16States(each_p, lr=1e-2, weight_decay=0.1, stochastic=stochastic, bucket_elements=250)
        for _ in range(5):
            for a, b in zip(loop_p, each_p):
                a.grad = torch.randn_like(a)
                b.grad = a.grad.clone()
            loop.step()
            each.step()
        for a, b, w in zip(loop_p, each_p, weights):
            if stochastic:
                assert float((a - b).abs().max()) < 0.02 * float((a - w).abs().max())
            else:
                assert torch.equal(a, b)
