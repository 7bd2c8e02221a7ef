"""The transformers rollout engine: the CPU default and the vanilla baseline's engine.

It shares the trainer's policy module in-process, so a weight "sync" is a reference swap. Decoding
is written out (not `model.generate`) so that each sequence draws its randomness from its own
stream, seeded from (seed, prompt index, sample index): its tokens do not depend on batch
neighbours, padding or `hf_batch_size`. A prompt's n samples share one prefill; the prompt's KV rows
are repeated n times afterwards. Two decoders (`rollout.hf_decode`), the same tokens and log-probs:
- the loop (`_decode_loop`; the CPU's): compute follows the live rows, a row that emits EOS leaves
  the batch at once; one host sync per token;
- the static decoder (`static.StaticDecoder`; CUDA's): a preallocated cache and a compiled step
  (CUDA graphs) that samples on the device; finished rows stay in their bucket until the live
  ones fit a smaller one; the host looks every `hf_sync_every` steps.
A later request of a `generate_many` call with a horizon h (`SamplingParams.horizon`: riders, e.g.
the mentor's merged re-rolls) stops at h times the longest row of the first request (the initial
rollouts), so its rows cannot keep a call running after the rest ended.

On CPU the engine decodes with `CPU_GQA_ATTENTION` in place of transformers' "sdpa" (the
constructor's `gqa_attention`, on unless a test turns it off). Under a padding mask, transformers
copies the grouped K/V to every query head before calling SDPA, because the fused GQA kernels on CUDA refuse a mask.
Torch's CPU path takes the mask together with `enable_gqa`, so this attention hands K/V over as
they are. For SmolLM2-135M (9 query heads, 3 K/V heads) it makes a decode step at 32 sequences and
a 92-token context about a quarter faster (docs/experiments/history.md, "Step time of MENTOR").

Shape letters: U unique prompts in a chunk, S sequences in a chunk, L live sequences, T length,
V vocabulary.
"""

from __future__ import annotations

import contextlib
import functools
import math
import warnings

import torch
import torch.nn.functional as F
from transformers.cache_utils import DynamicCache

from mentor_fast.config import RolloutConfig
from mentor_fast.rollout.base import EngineError, Request, SamplingParams, check_mergeable, check_request
from mentor_fast.rollout.sampling import row_seed, sample_tokens
from mentor_fast.rollout.static import Chunk, DecodeMode, StaticDecoder, resolve_compile, resolve_decode
from mentor_fast.rollout.static_step import CPU_GQA_ATTENTION, static_attention
from mentor_fast.types import Sample


def sdpa_gqa_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None,
                       **kwargs):
    """transformers' attention-function contract (query [B, H, T, D], key/value [B, KV, S, D] ->
    ([B, T, H, D], None)), with grouped K/V passed to SDPA as they are, mask or not."""
    if attention_mask is not None and attention_mask.ndim == 4:
        attention_mask = attention_mask[:, :, :, : key.shape[-2]]
    causal = getattr(module, "is_causal", True) if is_causal is None else is_causal
    out = F.scaled_dot_product_attention(
        query, key, value, attn_mask=attention_mask, dropout_p=dropout, scale=scaling,
        is_causal=bool(query.shape[2] > 1 and attention_mask is None and causal),
        enable_gqa=key.shape[1] != query.shape[1],
    )
    return out.transpose(1, 2).contiguous(), None


@functools.cache
def _register_cpu_gqa_attention() -> None:
    """Registered on first use: transformers' attention and mask registries import Triton, which
    importing this module should not."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(CPU_GQA_ATTENTION, sdpa_gqa_attention)
    AttentionMaskInterface.register(CPU_GQA_ATTENTION, sdpa_mask)


@contextlib.contextmanager
def cpu_gqa_attention(model):
    """Decode with `sdpa_gqa_attention` while inside, if the model runs "sdpa" on a CPU."""
    config = model.config
    before = config._attn_implementation
    swap = before == "sdpa" and next(model.parameters()).device.type == "cpu"
    if swap:
        _register_cpu_gqa_attention()
        config._attn_implementation = CPU_GQA_ATTENTION
    try:
        yield
    finally:
        if swap:
            config._attn_implementation = before


def eos_token_ids(tokenizer, model) -> set[int]:
    """The tokenizer's EOS plus every EOS id of the model's generation config."""
    ids = set()
    for value in (tokenizer.eos_token_id, getattr(getattr(model, "generation_config", None), "eos_token_id", None)):
        if value is None:
            continue
        ids.update([value] if isinstance(value, int) else value)
    if not ids:
        raise ValueError("neither the tokenizer nor the generation config defines an EOS token")
    return ids


class _Lead:
    """The longest ended row of a generate_many call's first request so far: what a later request's
    horizon is measured against."""

    def __init__(self):
        self.len = 0


class HFEngine:
    """RolloutEngine on transformers, sharing the trainer's policy module (no weight copies), or
    with `owns_weights` decoding from a module of its own (across ranks, where the trainer's is
    sharded): each sync copies the trainer's whole tensors into it in place."""

    def __init__(self, model: torch.nn.Module, tokenizer, cfg: RolloutConfig, gqa_attention: bool = True,
                 owns_weights: bool = False, compile_backend: str = "inductor"):
        self._model = model
        self._owns = owns_weights
        self._tokenizer = tokenizer
        self._cfg = cfg
        self._gqa_attention = gqa_attention
        self._version = 0
        self._eos = eos_token_ids(tokenizer, model)
        self._pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else min(self._eos)
        self._static: StaticDecoder | None = None  # built on the first static decode
        self._static_failed = False  # auto only: its step did not compile, the loop decodes
        self._compile_backend = compile_backend  # torch.compile's backend for it (tests: "eager")

    @property
    def policy_version(self) -> int:
        return self._version

    @property
    def max_context_tokens(self) -> int:
        return int(self._model.config.max_position_embeddings)

    def sleep(self) -> None:
        """Nothing to free: the engine decodes with the trainer's module (or its own copy)."""

    def update_weights(self, model, version: int) -> None:
        """model: the trainer's module, or anything whose `state_dict()` holds its whole tensors
        (sharding.FullWeights: gathered on this rank's device)."""
        if not self._owns:
            self._model = model  # same process, same tensors: nothing to copy
        else:
            own = self._model.state_dict()
            with torch.no_grad():
                for name, t in model.state_dict().items():
                    if name not in own or own[name].shape != t.shape:
                        raise EngineError(f"weight sync: {name} {tuple(t.shape)} does not match the engine's copy")
                    own[name].copy_(t)
        self._version = version

    def close(self) -> None:
        self._model = None
        if self._static is not None:
            self._static.close()

    def pop_metrics(self) -> dict[str, float]:
        """The static decoder's counts since the last call: its compiled steps (a chunk's decode
        steps, which a bucket's finished rows still ride) and compactions. The trainer times
        generation itself."""
        if self._static is None:
            return {}
        counts, self._static.counts = self._static.counts, dict.fromkeys(self._static.counts, 0)
        return {f"rollout/hf_static_{k}": float(v) for k, v in counts.items()}

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[list[Sample]]:
        return self.generate_many([(prompts, params)])[0]

    def generate_many(self, requests: list[Request], *, tag: str = "initial") -> list[list[list[Sample]]]:
        """Requests that differ only in n, seed, keys and horizon, decoded together; each sequence gets
        exactly the random stream it would get from its own `generate` call, and the same tokens
        unless cut. `tag` is not used (this engine keeps no per-phase counters).

        A later request with a horizon h (>= 1) may not outlast requests[0]'s rows for long: once every
        row of requests[0] has ended, a row of it that has decoded h times the longest of them is
        cut: it comes back with finish_reason "cut" and the tokens so far."""
        for prompts, params in requests:
            self._check(prompts, params)
        check_mergeable(requests)
        if not requests:
            return []
        shared = requests[0][1]
        cutting = any(params.horizon for _, params in requests)
        # Similar prompt lengths share a chunk (less padding); seeds follow the original indices.
        # Under a horizon requests[0]'s rows come first, so its longest row is known before any
        # chunk of later rows can be cut.
        rows = sorted(
            ((k, i, j) for k, (prompts, params) in enumerate(requests)
             for i in range(len(prompts)) for j in range(params.n)),
            key=lambda r: (cutting and r[0] > 0, len(requests[r[0]][0][r[1]])),
        )
        lead = _Lead() if cutting else None
        out: list[list[list[Sample | None]]] = [[[None] * p.n for _ in prompts] for prompts, p in requests]
        model = self._model
        modes = [(m, m.training) for m in model.modules()]  # restored exactly, even if mixed
        model.eval()
        try:
            with torch.no_grad(), self.attention():
                size = max(1, self._cfg.hf_batch_size)
                for start in range(0, len(rows), size):
                    chunk = rows[start : start + size]
                    seqs = [((k, i), requests[k][0][i], row_seed(requests[k][1].seed, requests[k][1].key(i), j),
                             requests[k][1].horizon) for k, i, j in chunk]
                    for (k, i, j), sample in zip(chunk, self._decode_chunk(seqs, shared, lead)):
                        out[k][i][j] = sample
        finally:
            for m, training in modes:
                m.training = training
        return out  # type: ignore[return-value]

    def attention(self):
        """The attention decoding runs under: `cpu_gqa_attention` unless the engine was built without it."""
        return cpu_gqa_attention(self._model) if self._gqa_attention else contextlib.nullcontext()

    def _check(self, prompts: list[list[int]], params: SamplingParams) -> None:
        if self._model is None:
            raise EngineError("HFEngine.generate after close()")
        check_request(prompts, params, self.max_context_tokens)

    def _prefill(self, prompts: list[list[int]]):
        """Left-padded forward over the chunk's distinct prompts -> (cache, mask [U, T], logits [U, V])."""
        model = self._model
        device = next(model.parameters()).device
        t = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), t), self._pad, dtype=torch.long)
        mask = torch.zeros((len(prompts), t), dtype=torch.long)
        for r, p in enumerate(prompts):
            ids[r, t - len(p) :] = torch.tensor(p)
            mask[r, t - len(p) :] = 1
        ids, mask = ids.to(device), mask.to(device)
        position_ids = (mask.cumsum(-1) - 1).clamp_(min=0)
        # DynamicCache picks each layer's kind from the config (full or sliding-window attention).
        # A cache preallocated for the whole chunk measured only ~2-5% faster here; not worth owning.
        cache = DynamicCache(config=model.config)
        logits = model(
            input_ids=ids, attention_mask=mask, position_ids=position_ids,
            past_key_values=cache, use_cache=True, logits_to_keep=1,
        ).logits[:, -1]
        return cache, mask, logits

    @property
    def decode_mode(self) -> DecodeMode:
        return resolve_decode(self._cfg.hf_decode, self._model)

    def _decode_chunk(self, chunk: list[tuple[tuple[int, int], list[int], int, float]], params: SamplingParams,
                      lead: _Lead | None = None) -> list[Sample]:
        """Decode S sequences (prompt key, prompt ids, row seed, horizon); a prompt's sequences share
        one prefill. `lead`: see `generate_many` (None: no horizon)."""
        if self.decode_mode is DecodeMode.LOOP or self._static_failed:
            return self._decode_loop(chunk, params, lead)
        if self._static is None:
            device = next(self._model.parameters()).device
            self._static = StaticDecoder(resolve_compile(self._cfg.hf_compile, device), self._cfg.hf_sync_every,
                                         self._eos, self._pad, backend=self._compile_backend)
        prompts = {key: ids for key, ids, _, _ in chunk}  # in first-seen order
        index = {key: i for i, key in enumerate(prompts)}
        rows = Chunk(prompts=list(prompts.values()), prompt_of=[index[key] for key, _, _, _ in chunk],
                     seeds=[seed for _, _, seed, _ in chunk],
                     horizons=[h if lead is not None else 0.0 for _, _, _, h in chunk],
                     leaders=[lead is not None and k == 0 for (k, _), _, _, _ in chunk])
        try:
            with static_attention(self._model):
                out, lead_len = self._static.decode(self._model, rows, params, lead.len if lead is not None else 0)
        except EngineError as e:  # it could not compile: auto takes the loop, loudly; static stops
            if DecodeMode(self._cfg.hf_decode) is not DecodeMode.AUTO:
                raise
            warnings.warn(f"{e}. rollout.hf_decode=auto decodes with the loop from here on", stacklevel=2)
            self._static_failed = True
            return self._decode_loop(chunk, params, lead)
        if lead is not None:
            lead.len = lead_len
        return [Sample(token_ids=t, logprobs=lp, finish_reason=r, policy_version=self._version)
                for t, lp, r in zip(out.tokens, out.logprobs, out.reasons)]

    def _decode_loop(self, chunk: list[tuple[tuple[int, int], list[int], int, float]], params: SamplingParams,
                     lead: _Lead | None = None) -> list[Sample]:
        """The eager loop: a growing cache, and finished rows leave the batch at once."""
        model = self._model
        row_of: dict[tuple[int, int], int] = {}  # prompt key -> its row in the prefill
        uniq: list[list[int]] = []
        for key, ids, _, _ in chunk:
            if key not in row_of:
                row_of[key] = len(uniq)
                uniq.append(ids)
        cache, mask, logits = self._prefill(uniq)
        device = mask.device
        expand = torch.tensor([row_of[key] for key, _, _, _ in chunk], device=device)  # [S] -> prompt row
        cache.batch_select_indices(expand)
        mask, logits = mask[expand], logits[expand]
        position = mask.sum(-1)  # [S] next position of each row (real tokens so far)
        if params.greedy:
            uniforms = torch.zeros(len(chunk), params.max_new_tokens)
        else:  # each sequence's stream depends only on its own (seed, prompt, sample) indices
            uniforms = torch.stack([
                torch.rand(params.max_new_tokens, generator=torch.Generator().manual_seed(seed),
                           dtype=torch.float64)
                for _, _, seed, _ in chunk
            ])  # [S, max_new_tokens]
        uniforms = uniforms.to(device)
        live = list(range(len(chunk)))
        tokens: list[list[int]] = [[] for _ in chunk]
        logprobs: list[list[float]] = [[] for _ in chunk]
        reasons = ["length"] * len(chunk)
        follower = [k > 0 for (k, _), _, _, _ in chunk]  # a row of requests[1:]: its horizon may cut it
        horizon = [h for _, _, _, h in chunk]
        for step in range(params.max_new_tokens):
            tok, lp = sample_tokens(logits, uniforms[live, step], params)
            keep = []
            for k, (s, t, p) in enumerate(zip(live, tok.tolist(), lp.tolist())):
                tokens[s].append(t)
                logprobs[s].append(p)
                if t in self._eos:
                    reasons[s] = "stop"
                elif step + 1 < params.max_new_tokens:
                    keep.append(k)
                    continue
                if lead is not None and not follower[s]:
                    lead.len = max(lead.len, step + 1)
            if lead is not None and lead.len and all(follower[live[k]] for k in keep):
                cut = {k for k in keep
                       if horizon[live[k]] and step + 1 >= math.ceil(horizon[live[k]] * lead.len)}
                for k in cut:
                    reasons[live[k]] = "cut"
                keep = [k for k in keep if k not in cut]
            if not keep:
                break
            if len(keep) < len(live):  # drop finished rows: compute follows the live rows
                idx = torch.tensor(keep, device=device)
                cache.batch_select_indices(idx)
                mask, tok, position = mask[idx], tok[idx], position[idx]
                live = [live[k] for k in keep]
            mask = torch.cat([mask, mask.new_ones(len(live), 1)], dim=1)
            logits = model(
                input_ids=tok[:, None], attention_mask=mask, position_ids=position[:, None],
                past_key_values=cache, use_cache=True,
            ).logits[:, -1]
            position = position + 1
        return [
            Sample(token_ids=tokens[s], logprobs=logprobs[s], finish_reason=reasons[s],
                   policy_version=self._version)
            for s in range(len(chunk))
        ]
