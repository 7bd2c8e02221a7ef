"""AdamW with bf16 moments (optim.state_dtype=bfloat16, mentor_fast/optim.py)."""

from __future__ import annotations

import pytest
import torch
from helpers import write_shaped_reward

from mentor_fast.config import OptimConfig
from mentor_fast.optim import AdamWBF16States, store_bf16_
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


def test_config_picks_it():
    model = torch.nn.Linear(4, 3)
    opt, _ = build_optimizer(model, OptimConfig(lr=1e-3, state_dtype="bfloat16"), max_steps=5)
    assert isinstance(opt, AdamWBF16States)
    assert isinstance(build_optimizer(model, OptimConfig(lr=1e-3), max_steps=5)[0], torch.optim.AdamW)


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
