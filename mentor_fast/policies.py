"""The modules a run holds of its policy: the one it trains, what the update runs (sharded across
ranks), what the rollout engine decodes with, and the frozen reference for the KL term."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path

import torch

from mentor_fast.config import RunConfig
from mentor_fast.dist import Dist
from mentor_fast.models import apply_liger, apply_lora, load_policy, torch_dtype
from mentor_fast.rollout import hf_engine_dtype
from mentor_fast.sharding import FullWeights, shard_policy


@dataclass
class Policies:
    model: torch.nn.Module
    """The policy as loaded, on this rank's device (with LoRA: the adapted model)."""
    policy: torch.nn.Module
    """What the update trains: `model`, sharded by FSDP2 across ranks."""
    weights: torch.nn.Module | FullWeights
    """What engines read the weights from (across ranks: gathered from the shards)."""
    engine_model: torch.nn.Module
    """What the HF engine decodes with: `model` itself, or a copy of its own."""
    ref_model: torch.nn.Module | None
    """The frozen reference of the KL term (loss.beta > 0 with model.ref_model)."""

    @property
    def engine_owns_weights(self) -> bool:
        return self.engine_model is not self.model


def build_policies(cfg: RunConfig, dist: Dist, weights_path: Path, adapter: Path | None) -> Policies:
    """The policy from `weights_path` (with LoRA: the base model, and `adapter` when resuming)."""
    model = load_policy(weights_path, cfg.model.dtype, cfg.model.attn_implementation)
    if apply_liger(model, cfg.model.liger, dist.device) and dist.is_main:
        print("liger: RMSNorm, SwiGLU and RoPE kernels on the policy", flush=True)
    lora = cfg.model.lora.rank > 0
    if lora:
        model = apply_lora(model, cfg.model.lora, adapter=adapter)
    model.to(dist.device)
    model.train()
    ref_model = None
    if cfg.model.ref_model and cfg.loss.beta > 0:  # frozen and small next to the policy: not sharded
        ref_model = copy.deepcopy(model).eval().requires_grad_(False)
    # Across ranks the HF engine decodes from its own whole copy (a sharded forward would be a
    # collective per decoded token), and in another dtype from a copy in it (rollout.hf_dtype); one
    # rank in the policy's dtype shares the policy module.
    engine_model = model
    hf_dtype = hf_engine_dtype(cfg, dist.device) if cfg.rollout.engine == "hf" and not lora else None
    if cfg.rollout.engine == "hf" and (dist.enabled or hf_dtype):
        engine_model = copy.deepcopy(model).requires_grad_(False)
        if hf_dtype:
            engine_model.to(torch_dtype(hf_dtype))
    policy = shard_policy(model, dist, param_dtype=_param_dtype(cfg))
    weights = FullWeights(policy) if dist.enabled else model
    return Policies(model, policy, weights, engine_model, ref_model)


def _param_dtype(cfg: RunConfig) -> torch.dtype | None:
    """FSDP2's compute dtype for the gathered parameters (None: the parameters' own)."""
    name = cfg.dist.param_dtype
    if name == "auto":
        return torch.bfloat16 if cfg.model.autocast_bf16 else None
    return torch_dtype(name)
