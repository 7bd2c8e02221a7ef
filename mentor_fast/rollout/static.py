"""The HF engine's fast decode (`rollout.hf_decode: static`): a preallocated KV cache, a compiled
decode step, and no host sync per token.

On a GPU the eager loop is launch-bound: a 0.51B Llama's decode step took 27 ms on an H200 whose
bf16 weights stream in 0.23 ms, because every token crossed to the host (`.tolist()`), walked a
Python loop over rows and re-indexed the cache of every finished row. Here a step is one call of a
function compiled once per shape (`torch.compile`; mode "reduce-overhead" captures it in a CUDA
graph), and everything it needs stays on the device:
- static shapes: a chunk's S rows sit in a batch bucket of B = a power of two >= S rows; its cache
  holds L = Pb + max_new_tokens columns, Pb = the widest prompt rounded up to a power of two. A
  run meets a few (B, L) pairs and compiles each once; later calls reuse them.
- the step samples on the device (`sampling.sample_tokens`, the loop's sampler), writes the token and its
  log-prob into the chunk's tables, and keeps each row's end on the device: EOS, the length limit
  and the horizon cut of generate_many's riders, the same rules as the loop.
- the host looks every `sync_every` steps: the chunk ends when every row has; a finished row stays
  in its bucket, masked, until the live rows fit a smaller bucket, then they move (compaction).
The uniforms are the loop's (one CPU stream per sequence, copied to the device once per chunk),
so a sequence's tokens do not depend on its neighbours, padding or bucket.

Layout: a row's prompt is right-aligned at column Pb (left padding), its completion follows.
Cache columns [start, column] of a row are visible to its next token; the 4-D mask says so, so
transformers builds no mask of its own and never asks the cache for its sizes. The compiled
region (cache, row state, sampling and end rules, the decode attention) is static_step.py; this
module sizes and fills its buffers and drives it.

Shape letters: U distinct prompts of a chunk, S rows of a chunk, B its batch bucket, L cache
columns, T max_new_tokens, V vocabulary, KV key/value heads, D head width.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

from mentor_fast.compat import StrEnum
from mentor_fast.rollout.base import EngineError, SamplingParams
from mentor_fast.rollout.static_step import SDPA_FAMILY, RowState, SlotCache, decode_step, sample_and_record

MIN_BUCKET = 8  # below 8 rows a GPU decode step costs the same: the weights' bandwidth bounds it


class DecodeMode(StrEnum):
    """`rollout.hf_decode`."""

    AUTO = "auto"
    LOOP = "loop"  # `hf.HFEngine._decode_loop`
    STATIC = "static"  # `StaticDecoder`


def resolve_decode(mode: str, model) -> DecodeMode:
    """auto: static on CUDA (where the loop is launch-bound) for the models it serves, else the loop."""
    mode = DecodeMode(mode)
    why = unsupported(model)
    if mode is DecodeMode.STATIC and why:
        raise ValueError(f"rollout.hf_decode=static cannot decode this model ({why}); use rollout.hf_decode=loop")
    if mode is DecodeMode.AUTO:
        cuda = next(model.parameters()).device.type == "cuda"
        return DecodeMode.STATIC if cuda and not why else DecodeMode.LOOP
    return mode


class CompileMode(StrEnum):
    """`rollout.hf_compile`: how the static decode step runs."""

    AUTO = "auto"  # reduce-overhead on CUDA, default elsewhere
    REDUCE_OVERHEAD = "reduce-overhead"  # inductor + CUDA graphs
    DEFAULT = "default"  # inductor, no CUDA graphs
    NONE = "none"  # not compiled: the same step, eager (debugging; a reference for the compiled one)


def resolve_compile(mode: str, device: torch.device) -> CompileMode:
    mode = CompileMode(mode)
    if mode is CompileMode.AUTO:
        return CompileMode.REDUCE_OVERHEAD if device.type == "cuda" else CompileMode.DEFAULT
    return mode


def bucket(n: int, least: int = 1) -> int:
    """The smallest power of two >= max(n, least)."""
    return 1 << (max(n, least) - 1).bit_length()


def unsupported(model) -> str | None:
    """Why the static decoder cannot run this model (None: it can). It hands every layer one
    full-attention boolean mask: sliding-window or hybrid layers would attend too far, and only
    SDPA takes the mask as it is."""
    config = model.config.get_text_config(decoder=True) if hasattr(model.config, "get_text_config") else model.config
    kinds = set(getattr(config, "layer_types", None) or ["full_attention"])
    if kinds != {"full_attention"} or getattr(config, "use_sliding_window", False):
        return f"layer types {sorted(kinds)}: the static decoder masks full attention only"
    if model.config._attn_implementation not in SDPA_FAMILY:
        return (f"attention {model.config._attn_implementation!r}: the static decoder's boolean mask needs "
                "model.attn_implementation=sdpa")
    return None


@dataclass
class Chunk:
    """A chunk's rows as the engine hands them over: prompts, each row's prompt, seed, horizon."""

    prompts: list[list[int]]  # U distinct prompts
    prompt_of: list[int]  # [S] row -> its prompt
    seeds: list[int]  # [S]
    horizons: list[float]  # [S]
    leaders: list[bool]  # [S]: rows of generate_many's first request, when a horizon can cut


@dataclass
class Result:
    tokens: list[list[int]]
    logprobs: list[list[float]]
    reasons: list[str]


class _Buffers:
    """A decoder's device memory for one max_new_tokens: the KV cache and the row state, sized for
    `capacity` slots and Pb prompt columns. Both only grow, so the step's shapes stay few; a bucket
    smaller than the capacity decodes in a prefix view (same addresses: a CUDA graph stays valid)."""

    def __init__(self, model, capacity: int, pb: int, t: int, eos: list[int]):
        config = model.config.get_text_config(decoder=True) if hasattr(model.config, "get_text_config") else model.config
        device = next(model.parameters()).device
        self.capacity, self.pb, self.t = capacity, pb, t
        self.layers = config.num_hidden_layers
        self.keys: list[torch.Tensor | None] = [None] * self.layers  # allocated by the first prefill:
        self.values: list[torch.Tensor | None] = [None] * self.layers  # its K/V dtype is the cache's
        self.column = torch.zeros((), dtype=torch.long, device=device)
        z = lambda dtype, *shape: torch.zeros(shape, dtype=dtype, device=device)
        self.state = RowState(
            tok=z(torch.long, capacity), start=z(torch.long, capacity), u=z(torch.float64, capacity, t),
            tokens=z(torch.long, capacity, t), logps=z(torch.float32, capacity, t), length=z(torch.long, capacity),
            ended=z(torch.bool, capacity), stopped=z(torch.bool, capacity), cut=z(torch.bool, capacity),
            leader=z(torch.bool, capacity), horizon=z(torch.float64, capacity),
            eos=torch.tensor(eos, dtype=torch.long, device=device), step=z(torch.long), lead_len=z(torch.long))

    @property
    def length(self) -> int:
        return self.pb + self.t

    def allocating_cache(self) -> SlotCache:
        """The whole cache, for the prefill: allocates each layer's K/V on its first write."""
        buffers = self

        class _Allocating(SlotCache):
            def update(self, key_states, value_states, layer_idx, *args, **kwargs):
                if buffers.keys[layer_idx] is None:
                    shape = (buffers.capacity, key_states.shape[1], buffers.length, key_states.shape[3])
                    buffers.keys[layer_idx] = key_states.new_zeros(shape)  # zeros: a masked column must
                    buffers.values[layer_idx] = value_states.new_zeros(shape[:3] + value_states.shape[3:])  # be finite
                return super().update(key_states, value_states, layer_idx)

        return _Allocating(self.keys, self.values, self.column)

    def views(self, b: int) -> tuple[SlotCache, RowState]:
        cache = SlotCache([k[:b] for k in self.keys], [v[:b] for v in self.values], self.column)
        st = self.state.rows(b)
        for t in [*cache.keys, *cache.values, cache.column, *st.row_tensors(), st.step, st.lead_len, st.eos]:
            torch._dynamo.mark_static_address(t)  # CUDA graphs read these in place, never copy them in
        return cache, st

    def gather(self, idx: torch.Tensor) -> None:
        """Slots [0, len(idx)) <- slots idx (KV rows and row state), e.g. the prompt of each row
        after the prefill, or the live rows at a compaction."""
        b = idx.numel()
        for t in [*self.keys, *self.values, *self.state.row_tensors()]:
            t[:b] = t.index_select(0, idx)


class StaticDecoder:
    """Decodes a chunk with `_Buffers` and the compiled `decode_step` (see the module docstring)."""

    def __init__(self, mode: CompileMode, sync_every: int, eos: set[int], pad: int, backend: str = "inductor"):
        """backend: torch.compile's; "eager" runs dynamo's tracing, guards and recompiles with eager
        kernels (the tests' way to count graphs without inductor's minutes of CPU codegen)."""
        self.mode, self.sync_every, self.pad = mode, sync_every, pad
        self._eos = sorted(eos)
        self._buffers: dict[int, _Buffers] = {}  # max_new_tokens -> buffers
        self.counts = {"steps": 0, "compactions": 0}  # since the engine's last pop_metrics
        if mode is CompileMode.NONE:
            self._step = decode_step
        else:  # fullgraph: a graph break would cut the CUDA graph and put the host back in the loop
            self._step = torch.compile(decode_step, backend=backend, fullgraph=True, dynamic=False,
                                       mode=None if mode is CompileMode.DEFAULT or backend != "inductor" else str(mode))

    def close(self) -> None:
        self._buffers.clear()

    def decode(self, model, chunk: Chunk, params: SamplingParams, lead_len: int) -> tuple[Result, int]:
        """-> (each row's tokens, log-probs and finish reason; the call's lead length after it)."""
        s_rows, t = len(chunk.prompt_of), params.max_new_tokens
        b = bucket(s_rows, MIN_BUCKET)
        buf = self._buffers_for(model, b, bucket(max(map(len, chunk.prompts)), 32), t)
        logits = self._prefill(model, buf, chunk.prompts)  # [U, V]
        expand = torch.tensor(chunk.prompt_of + [0] * (b - s_rows), device=buf.column.device)
        buf.gather(expand)
        cache, st = buf.views(b)
        self._reset(st, chunk, params, buf.pb, lead_len)
        buf.column.fill_(buf.pb)
        sample_and_record(st, logits[expand], params, self.pad)  # token 0, from the prefill
        slots = list(range(s_rows)) + [-1] * (b - s_rows)  # slot -> row (-1: bucket padding)
        # the step sees only what sampling needs: other fields (seed, keys) must not key its graph
        step_params = SamplingParams(n=1, max_new_tokens=t, temperature=params.temperature, top_p=params.top_p,
                                     greedy=params.greedy)
        out = Result([[] for _ in range(s_rows)], [[] for _ in range(s_rows)], ["length"] * s_rows)
        with _recompile_limit(64):
            for s in range(1, t):
                if s % self.sync_every == 0:
                    live = (~st.ended).nonzero().squeeze(1)  # the host's only look inside the loop
                    if live.numel() == 0:
                        break
                    if bucket(live.numel(), MIN_BUCKET) < b:
                        self._collect(st, slots, out, ended_only=True)
                        b, slots = self._compact(buf, live, slots)
                        cache, st = buf.views(b)
                        self.counts["compactions"] += 1
                self._call_step(model, cache, st, step_params)
        self._collect(st, slots, out, ended_only=False)
        return out, int(st.lead_len)

    def _call_step(self, model, cache: SlotCache, st: RowState, params: SamplingParams) -> None:
        try:
            self._step(model, cache, st, params, self.pad)
        except torch._dynamo.exc.TorchDynamoException as e:  # a compile failure is no bad input: name the way out
            why = " ".join(str(e).split())[:300]
            raise EngineError(f"rollout.hf_decode=static: compiling the decode step (rollout.hf_compile={self.mode}) "
                              f"failed ({type(e).__name__}: {why}); rollout.hf_decode=loop decodes without it") from e
        self.counts["steps"] += 1

    def _buffers_for(self, model, b: int, pb: int, t: int) -> _Buffers:
        old = self._buffers.get(t)
        if old is not None and old.capacity >= b and old.pb >= pb:
            return old
        grow = (max(b, old.capacity), max(pb, old.pb)) if old is not None else (b, pb)
        self._buffers.pop(t, None)
        del old  # freed before the larger one is allocated
        buf = self._buffers[t] = _Buffers(model, *grow, t, self._eos)
        return buf

    def _prefill(self, model, buf: _Buffers, prompts: list[list[int]]) -> torch.Tensor:
        """Eager forward over the distinct prompts, right-aligned at column Pb -> last logits [U, V]."""
        device = buf.column.device
        u, p = len(prompts), max(map(len, prompts))
        ids = torch.full((u, p), self.pad, dtype=torch.long)
        for r, q in enumerate(prompts):
            ids[r, p - len(q):] = torch.tensor(q)
        lens = torch.tensor([len(q) for q in prompts], device=device)
        real = torch.arange(p, device=device) >= (p - lens)[:, None]  # [U, P]
        cols = torch.arange(buf.length, device=device)
        qcol = buf.pb - p + torch.arange(p, device=device)  # [P] each query's cache column
        start = (buf.pb - lens)[:, None, None]
        # a padding query sees only itself: a fully masked row would be NaN, and its K/V with it
        mask = ((cols >= start) & (cols <= qcol[:, None])) | (cols == qcol[:, None])  # [U, P, L]
        buf.column.fill_(buf.pb - p)
        return model(input_ids=ids.to(device), position_ids=(real.long().cumsum(-1) - 1).clamp_(min=0),
                     attention_mask=mask[:, None], past_key_values=buf.allocating_cache(), use_cache=True,
                     logits_to_keep=1).logits[:, -1]

    def _reset(self, st: RowState, chunk: Chunk, params: SamplingParams, pb: int, lead_len: int) -> None:
        b, s_rows = st.tok.shape[0], len(chunk.prompt_of)
        pad = b - s_rows
        device = st.tok.device
        lens = [len(chunk.prompts[i]) for i in chunk.prompt_of] + [len(chunk.prompts[0])] * pad
        st.start.copy_(pb - torch.tensor(lens, device=device))
        if params.greedy:
            st.u.zero_()
        else:  # the loop's streams: each row's from its own (seed, prompt, sample) seed
            st.u.copy_(torch.stack(
                [torch.rand(params.max_new_tokens, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
                 for seed in chunk.seeds] + [torch.zeros(params.max_new_tokens, dtype=torch.float64)] * pad))
        st.ended.copy_(torch.arange(b, device=device) >= s_rows)
        st.leader.copy_(torch.tensor(chunk.leaders + [False] * pad, device=device))
        st.horizon.copy_(torch.tensor(chunk.horizons + [0.0] * pad, dtype=torch.float64, device=device))
        st.length.fill_(params.max_new_tokens)
        st.stopped.zero_()
        st.cut.zero_()
        st.step.zero_()
        st.lead_len.fill_(lead_len)

    def _compact(self, buf: _Buffers, live: torch.Tensor, slots: list[int]) -> tuple[int, list[int]]:
        """Move the live slots to the front of the smallest bucket that holds them."""
        k = live.numel()
        b = bucket(k, MIN_BUCKET)
        idx = torch.cat([live, live[:1].expand(b - k)])
        buf.gather(idx)
        st = buf.state
        st.ended[k:b] = True  # the padding copies of slot live[0] take no part
        st.leader[k:b] = False
        keep = live.tolist()
        return b, [slots[i] for i in keep] + [-1] * (b - k)

    def _collect(self, st: RowState, slots: list[int], out: Result, ended_only: bool) -> None:
        """Copy rows out of the device tables (once per chunk and compaction)."""
        tokens, logps = st.tokens.tolist(), st.logps.tolist()
        length, ended, stopped, cut = (t.tolist() for t in (st.length, st.ended, st.stopped, st.cut))
        for slot, row in enumerate(slots):
            if row < 0 or (ended_only and not ended[slot]):
                continue
            n = length[slot]
            out.tokens[row], out.logprobs[row] = tokens[slot][:n], logps[slot][:n]
            out.reasons[row] = "stop" if stopped[slot] else "cut" if cut[slot] else "length"


@contextlib.contextmanager
def _recompile_limit(n: int):
    """Room for one graph per bucket pair and sampling setting (dynamo's default is 8 per function;
    torch before 2.6 names the setting cache_size_limit)."""
    cfg = torch._dynamo.config
    name = "recompile_limit" if hasattr(cfg, "recompile_limit") else "cache_size_limit"
    with cfg.patch(**{name: max(n, getattr(cfg, name))}):
        yield
