"""bf16 compute with fp32 master weights (model.autocast_bf16) on the tiny Llama, on the CPU.

What a GPU run relies on, checked where it can be: the decoder computes in bf16 under autocast, the
parameters, their gradients and AdamW's states stay fp32, and the LM head takes bf16 operands with
fp32 logits (GRPOOptions.compute_dtype). The fused head and the reference (the same rounded
operands, materialised fp32 logits, autograd) then give the same gradients to fp32 summation noise
(1e-4 relative in norm per parameter), while the bf16 update differs from the fp32 one by far more
than that: the bf16 path is really taken, and is not the fp32 one under another name.
"""

from __future__ import annotations

import pytest
import torch
from conftest import REPO
from test_update import PAD, _assert_grads_close, _grads_of_update, _groups

from mentor_fast.algo.batch import build_train_batch
from mentor_fast.config import AdvantageConfig, LossConfig, OptimConfig, TrainerConfig, load_config
from mentor_fast.models import load_policy
from mentor_fast.rollout import engine_dtype
from mentor_fast.update import PolicyUpdater, build_optimizer


def _updater(path, impl: str, bf16: bool) -> PolicyUpdater:
    torch.manual_seed(0)
    model = load_policy(path)
    model.train()
    optim_cfg = OptimConfig(lr=1e-3)
    optimizer, scheduler = build_optimizer(model, optim_cfg, max_steps=10)
    return PolicyUpdater(model, optimizer, scheduler, LossConfig(impl=impl), TrainerConfig(), optim_cfg,
                         temperature=1.0, max_new_tokens=16, pad_id=PAD, autocast_bf16=bf16)


def test_bf16_update_keeps_fp32_master_weights_and_the_fused_head_matches_the_reference(tiny_model_path):
    batch = build_train_batch(_groups([[1, 0, 0, 1], [0, 1, 1], [1, 0]]), AdvantageConfig())
    runs = {}
    for impl, bf16 in (("fused", True), ("reference", True), ("fused", False)):
        upd = _updater(tiny_model_path, impl, bf16)
        assert upd.options.compute_dtype == (torch.bfloat16 if bf16 else None)
        grads, metrics = _grads_of_update(upd, batch)
        assert all(g.dtype == torch.float32 for g in grads.values())
        assert all(p.dtype == torch.float32 for p in upd.model.parameters())
        states = [s for st in upd.optimizer.state.values() for s in st.values() if torch.is_tensor(s) and s.dim()]
        assert states and all(s.dtype == torch.float32 for s in states)
        runs[impl, bf16] = grads, metrics
    (g_fused, m_fused), (g_ref, m_ref) = runs["fused", True], runs["reference", True]
    _assert_grads_close(g_fused, g_ref, rel=1e-4)
    assert float(m_fused["loss"]) == pytest.approx(float(m_ref["loss"]), rel=1e-4, abs=1e-6)
    g32 = runs["fused", False][0]
    diffs = [float((g_fused[n] - g32[n]).norm() / g32[n].norm()) for n in g32 if float(g32[n].norm()) > 0]
    assert max(diffs) > 1e-3, "the bf16 update equals the fp32 one: autocast or the bf16 head is not in effect"
    assert max(diffs) < 0.2


def test_engine_dtype_follows_the_compute_dtype_unless_set():
    cfg = load_config([REPO / "configs" / "qwen2.5-1.5b-instruct_gpu.yaml"])
    assert cfg.model.autocast_bf16 and engine_dtype(cfg) == "bfloat16"
    cfg.model.autocast_bf16 = False
    assert engine_dtype(cfg) == cfg.model.dtype == "float32"
    cfg.rollout.vllm_dtype = "float16"
    assert engine_dtype(cfg) == "float16"
