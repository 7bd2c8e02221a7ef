"""The static decoder's compiled region and what it reads: the KV cache transformers' attention
writes into, the row state, the sampling and end rules of a step, and the attention of a decode
step. Everything here runs inside `torch.compile`: no host syncs, no data-dependent Python
branches, in-place updates of tensors whose addresses never move (a CUDA graph replays them).
static.py drives it. Shape letters: as static.py's.
"""

from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass, fields

import torch
import torch.nn.functional as F

from mentor_fast.rollout.base import SamplingParams
from mentor_fast.rollout.sampling import sample_tokens

CPU_GQA_ATTENTION = "mentor_fast_sdpa_gqa"  # the HF engine's SDPA on a CPU (hf.sdpa_gqa_attention)
SDPA_FAMILY = ("sdpa", CPU_GQA_ATTENTION)


def grouped_decode_attention(module, query, key, value, attention_mask, dropout: float = 0.0,
                             scaling: float | None = None, is_causal: bool | None = None, *, fallback, **kwargs):
    """transformers' attention contract. A decode step (one query) of a grouped-query model: SDPA
    gets each K/V head once, its G query heads as G queries of it, the same scores as K/V copied to
    every head, which transformers' SDPA path does under a mask (reading the cache G times a step).
    Anything else: `fallback`, the attention this one wraps."""
    b, h, q, d = query.shape
    kv = key.shape[1]
    if q != 1 or kv == h or attention_mask is None:
        return fallback(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                        is_causal=is_causal, **kwargs)
    out = F.scaled_dot_product_attention(query.reshape(b, kv, h // kv, d), key, value,  # [B, KV, G, D]
                                         attn_mask=attention_mask[..., : key.shape[-2]], dropout_p=dropout, scale=scaling)
    return out.reshape(b, 1, h, d), None  # query head kv * G + g: repeat_kv's order


@functools.cache
def _static_attention_name(inner: str) -> str:
    """Registered once per wrapped attention (a new function object each call would recompile the step)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    name = f"mentor_fast_static_{inner}"
    AttentionInterface.register(name, functools.partial(grouped_decode_attention, fallback=ALL_ATTENTION_FUNCTIONS[inner]))
    AttentionMaskInterface.register(name, sdpa_mask)
    return name


@contextlib.contextmanager
def static_attention(model):
    """Attend with `grouped_decode_attention` over the model's SDPA-family attention while inside."""
    config = model.config
    before = config._attn_implementation
    if before not in SDPA_FAMILY:
        raise ValueError(f"the static decoder needs SDPA attention, not {before!r}")
    config._attn_implementation = _static_attention_name(before)
    try:
        yield
    finally:
        config._attn_implementation = before


class SlotCache:
    """A preallocated KV cache for transformers' attention: per layer keys and values [B, KV, L, D],
    written at `column` (a device scalar, so the compiled step does not specialise on it).
    `update` is all the model calls; it returns the whole rows, which the 4-D mask windows."""

    is_compileable = True

    def __init__(self, keys: list[torch.Tensor], values: list[torch.Tensor], column: torch.Tensor):
        self.keys, self.values, self.column = keys, values, column

    @property
    def length(self) -> int:
        return self.keys[0].shape[2]

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args, **kwargs):
        rows, q = key_states.shape[0], key_states.shape[2]
        at = self.column + torch.arange(q, device=key_states.device)  # [q]
        keys, values = self.keys[layer_idx][:rows], self.values[layer_idx][:rows]
        keys.index_copy_(2, at, key_states.to(keys.dtype))
        values.index_copy_(2, at, value_states.to(values.dtype))
        return keys, values


@dataclass
class RowState:
    """The device side of a chunk: a row per slot of the bucket, mutated in place by the step."""

    tok: torch.Tensor  # [B] long: the last sampled token (the next step's input)
    start: torch.Tensor  # [B] long: first cache column of the row's prompt
    u: torch.Tensor  # [B, T] float64: the row's uniforms
    tokens: torch.Tensor  # [B, T] long
    logps: torch.Tensor  # [B, T] float32
    length: torch.Tensor  # [B] long: tokens kept once ended
    ended: torch.Tensor  # [B] bool (bucket padding starts ended)
    stopped: torch.Tensor  # [B] bool: ended by EOS
    cut: torch.Tensor  # [B] bool: ended by the horizon
    leader: torch.Tensor  # [B] bool: a row of generate_many's first request (only when cutting)
    horizon: torch.Tensor  # [B] float64: the row's horizon (0: never cut)
    eos: torch.Tensor  # [E] long
    step: torch.Tensor  # [] long: index of the token the next step samples
    lead_len: torch.Tensor  # [] long: longest ended leader row of the call so far (0: none yet)

    def rows(self, b: int) -> RowState:
        """The first b slots (views: the same memory, so the step's address does not move)."""
        return RowState(**{f.name: (t[:b] if t.ndim and f.name != "eos" else t)
                           for f in fields(self) for t in [getattr(self, f.name)]})

    def row_tensors(self) -> list[torch.Tensor]:
        return [getattr(self, f.name) for f in fields(self) if f.name != "eos" and getattr(self, f.name).ndim]


def sample_and_record(st: RowState, logits: torch.Tensor, params: SamplingParams, pad: int) -> None:
    """Sample the token at index `st.step` for every slot and apply the loop's end rules: EOS, the
    length limit, and (once no leader row is live) the horizon cut of a rider at ceil(h x lead)."""
    s = st.step.view(1)
    u = st.u.index_select(1, s).squeeze(1)  # [B]
    tok, lp = sample_tokens(logits, u, params)
    live = ~st.ended
    tok = torch.where(live, tok, pad)
    st.tokens.index_copy_(1, s, tok[:, None])
    st.logps.index_copy_(1, s, lp[:, None].to(st.logps.dtype))
    n = st.step + 1  # tokens of a row that is still live after this one
    stop = live & (tok[:, None] == st.eos).any(-1)
    newly = stop | (live & (n >= st.tokens.shape[1]))
    st.lead_len.copy_(torch.maximum(st.lead_len, torch.where((newly & st.leader).any(), n, 0)))
    ended = st.ended | newly
    leaders_live = (st.leader & ~ended).any()
    cut = (~ended & (st.horizon > 0) & (st.lead_len > 0) & ~leaders_live
           & (n >= torch.ceil(st.horizon * st.lead_len)))
    st.length.copy_(torch.where(newly | cut, n, st.length))
    st.stopped.logical_or_(stop)
    st.cut.logical_or_(cut)
    st.ended.copy_(ended | cut)
    st.tok.copy_(tok)
    st.step.add_(1)


def decode_step(model, cache: SlotCache, st: RowState, params: SamplingParams, pad: int) -> None:
    """Feed each slot's last token at `cache.column`, sample the next: the compiled region. No
    data-dependent Python control flow: a CUDA graph of it replays the same kernels every step."""
    col = cache.column
    cols = torch.arange(cache.length, device=col.device)
    mask = (cols >= st.start[:, None]) & (cols <= col)  # [B, L]: the row's prompt and completion so far
    logits = model(input_ids=st.tok[:, None], position_ids=(col - st.start)[:, None],
                   attention_mask=mask[:, None, None, :], past_key_values=cache, use_cache=True,
                   logits_to_keep=1).logits[:, -1]
    col.add_(1)
    sample_and_record(st, logits, params, pad)
