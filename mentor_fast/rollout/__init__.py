"""Rollout engines behind one protocol (`base.RolloutEngine`): "hf" (transformers) and "vllm"."""

from __future__ import annotations

from pathlib import Path

from mentor_fast.config import RolloutConfig
from mentor_fast.rollout.base import EngineError, RolloutEngine, SamplingParams

__all__ = ["EngineError", "RolloutEngine", "SamplingParams", "engine_dtype", "hf_engine_dtype", "make_engine"]


def engine_dtype(cfg) -> str:
    """The vLLM engine's dtype for a RunConfig: rollout.vllm_dtype, or (auto) the policy's compute
    dtype: bfloat16 under model.autocast_bf16, else model.dtype."""
    if cfg.rollout.vllm_dtype != "auto":
        return cfg.rollout.vllm_dtype
    return "bfloat16" if cfg.model.autocast_bf16 else cfg.model.dtype


def hf_engine_dtype(cfg, device) -> str | None:
    """The dtype of the HF engine's own copy of the policy (rollout.hf_dtype), or None where it decodes
    with the policy's module."""
    want = cfg.rollout.hf_dtype
    if want == "auto":
        bf16_over_fp32 = cfg.model.autocast_bf16 and cfg.model.dtype == "float32"
        return "bfloat16" if device.type == "cuda" and bf16_over_fp32 else None
    return None if want == cfg.model.dtype else want


def make_engine(cfg: RolloutConfig, model, tokenizer, model_path: Path, dtype: str, seed: int,
                owns_weights: bool = False, lora_rank: int = 0) -> RolloutEngine:
    """The HF engine shares the trainer's module in-process (or, `owns_weights`, decodes from a copy
    of its own that each sync overwrites); vLLM loads `model_path` in its own engine and receives
    weights after every optimizer step (with LoRA, lora_rank > 0: the adapter only)."""
    if cfg.engine == "hf":
        from mentor_fast.rollout.hf import HFEngine

        return HFEngine(model, tokenizer, cfg, owns_weights=owns_weights)
    if cfg.vllm_mode == "server":  # vLLM in a process of its own (mentor-fast serve): no vllm import here
        from mentor_fast.rollout.server import ServerEngine

        return ServerEngine(cfg, model_path, lora_rank=lora_rank)
    from mentor_fast.rollout.vllm import VLLMEngine  # vllm*.py: the only modules that import vllm

    return VLLMEngine(model_path, tokenizer, cfg, dtype=dtype, seed=seed, lora_rank=lora_rank)
