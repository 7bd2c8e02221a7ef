"""bf16 compute with fp32 master weights (model.autocast_bf16) on the tiny Llama, on the CPU.

What a GPU run relies on, checked where it can be: the decoder computes in bf16 under autocast, the
parameters, their gradients and AdamW's states stay fp32, and the LM head takes bf16 operands with
fp32 logits (GRPOOptions.compute_dtype).

Tolerance: the project's rule (flash-attention's), per parameter, on the largest error: the fused
head's bf16 update may be at most twice as far from the float64 update as plain torch's bf16 update
is (the reference loss on materialised logits, under the same autocast), plus a tiny atol. A fixed
relative bound does not hold across processors: CPU bf16 GEMMs round and accumulate differently
with and without AVX512-BF16 (a 1e-4 bound passed on a Xeon and failed at 4.6e-4 on an EPYC), and a
bf16 rounding flip deep in the decoder moves a gradient entry by a bf16 ulp. Torch's own error sets
the scale on each machine. The bf16 update also differs from the fp32 one by far more than the rule
allows the fused head to differ from torch: the bf16 path is really taken.
"""

from __future__ import annotations

import torch
from conftest import REPO
from helpers import grads_of_update, make_groups, make_updater

from mentor_fast.algo.batch import build_train_batch
from mentor_fast.config import AdvantageConfig, load_config
from mentor_fast.rollout import engine_dtype


def _max_err(got: dict[str, torch.Tensor], ref: dict[str, torch.Tensor]) -> dict[str, float]:
    return {n: float((got[n].double() - ref[n]).abs().max()) for n in ref}


def test_bf16_update_keeps_fp32_master_weights_and_the_fused_head_is_within_the_rule(tiny_model_path):
    batch = build_train_batch(make_groups([[1, 0, 0, 1], [0, 1, 1], [1, 0]]), AdvantageConfig())
    runs = {}
    for impl, bf16 in (("fused", True), ("reference", True), ("fused", False)):
        upd = make_updater(tiny_model_path, impl, bf16=bf16)
        assert upd.options.compute_dtype == (torch.bfloat16 if bf16 else None)
        grads, metrics = grads_of_update(upd, batch)
        assert all(g.dtype == torch.float32 for g in grads.values())
        assert all(p.dtype == torch.float32 for p in upd.model.parameters())
        states = [s for st in upd.optimizer.state.values() for s in st.values() if torch.is_tensor(s) and s.dim()]
        assert states and all(s.dtype == torch.float32 for s in states)
        runs[impl, bf16] = grads, metrics
    g64, m64 = grads_of_update(make_updater(tiny_model_path, "reference", dtype=torch.float64), batch)
    fused, torch_bf16 = _max_err(runs["fused", True][0], g64), _max_err(runs["reference", True][0], g64)
    for name, err in fused.items():
        atol = 1e-6 * float(g64[name].abs().max()) + 1e-12
        assert err <= 2 * torch_bf16[name] + atol, (
            f"{name}: fused bf16 max err {err:.3e} vs torch bf16 {torch_bf16[name]:.3e} (float64 |grad| max "
            f"{float(g64[name].abs().max()):.3e})")
    loss = {k: abs(float(runs[k][1]["loss"]) - float(m64["loss"])) for k in (("fused", True), ("reference", True))}
    assert loss["fused", True] <= 2 * loss["reference", True] + 1e-6 * abs(float(m64["loss"]))
    # bf16 is in effect: the fp32 update is much closer to float64 than either bf16 one
    fp32 = _max_err(runs["fused", False][0], g64)
    worst = max(fused, key=lambda n: fused[n] / (float(g64[n].abs().max()) + 1e-30))
    assert fused[worst] > 20 * fp32[worst], "the bf16 update is as exact as fp32: autocast or the bf16 head is off"


def test_engine_dtype_follows_the_compute_dtype_unless_set():
    cfg = load_config([REPO / "configs" / "qwen2.5-1.5b-instruct_gpu.yaml"])
    assert cfg.model.autocast_bf16 and engine_dtype(cfg) == "bfloat16"
    cfg.model.autocast_bf16 = False
    assert engine_dtype(cfg) == cfg.model.dtype == "float32"
    cfg.model.autocast_bf16 = True
    cfg.rollout.vllm_dtype = "float16"
    assert engine_dtype(cfg) == "float16"
