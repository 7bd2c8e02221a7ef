"""The update's attention: one transformers attention function, fed by layouts built on the host.

transformers builds each forward's mask from the inputs and reads it back to choose a kernel (a
packed-sequence scan of the position ids, `padding_mask.all()`, flash-attn's `max_seqlen.item()`):
a host sync per micro-batch. The update already knows where every sequence sits, so it builds the
layout on the host, and for the length of a forward and backward (`update_attention`) the policy
runs `layout_attention`, for which no mask function is registered: transformers hands it no mask
and reads nothing. Each call gets the layout as the `layout` keyword, which transformers passes
through the decoder layers (and gradient checkpointing's recompute) to the attention function.

Layouts, by `AttentionKind` (one registry entry each):
- CAUSAL: right-padded rows (or one sequence): SDPA's causal flag, no mask (its flash kernel on a
  GPU). The pads sit after every real token, so a causal query never sees one; the pads' own
  outputs are never gathered, so they get no gradient.
- MASK: a [B, 1, Q, K] bool mask made on the device from host-known lengths: packed rows where no
  variable-length kernel runs (its cost grows with the square of the pack), and the shared-prompt
  completion pass (its prompt's keys up to the prompt's length, then causal).
- VARLEN: packed rows through a variable-length flash kernel with the host's cumulative lengths
  (flash-attn's when installed, else torch's own `torch.nn.attention.varlen`): each sequence pays
  only its own attention. CUDA and a 16-bit compute dtype only (the layout falls back to MASK
  elsewhere).
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import inspect
from collections.abc import Callable
from dataclasses import dataclass

import torch

from mentor_fast.compat import StrEnum

NAME = "mentor_fast_layout"  # the registered implementation the policy runs during the update


class AttentionKind(StrEnum):
    CAUSAL = "causal"
    MASK = "mask"
    VARLEN = "varlen"


@dataclass
class AttentionLayout:
    """How the queries of one decoder call may attend. mask: [B, 1, Q, K] bool on the device (MASK);
    cu_seqlens: [S + 1] int32 on the device and max_len the longest sequence, a host int (VARLEN)."""

    kind: AttentionKind
    mask: torch.Tensor | None = None
    cu_seqlens: torch.Tensor | None = None
    max_len: int = 0


def block_causal_mask(seq_of: torch.Tensor) -> torch.Tensor:
    """[1, 1, T, T] bool: position q sees position k <= q of its own sequence. seq_of: [T] sequence
    id of each packed position (on the device)."""
    t = torch.arange(seq_of.numel(), device=seq_of.device)
    return ((seq_of[:, None] == seq_of[None, :]) & (t[None, :] <= t[:, None]))[None, None]


def prefix_causal_mask(prompt_lens: torch.Tensor, prompt_width: int, width: int) -> torch.Tensor:
    """[S, 1, C, P + C] bool for a completion pass on its prompt's cached keys: the prompt's keys up
    to its length (the rest are pads), then the completion's own keys causally."""
    device = prompt_lens.device
    key_ok = torch.arange(prompt_width, device=device)[None, :] < prompt_lens[:, None]  # [S, P]
    causal = torch.ones(width, width, dtype=torch.bool, device=device).tril()  # [C, C]
    s = prompt_lens.numel()
    return torch.cat([key_ok[:, None, :].expand(s, width, prompt_width), causal.expand(s, width, width)], -1)[:, None]


def _sdpa(module, q, k, v, mask, dropout, scaling, is_causal):
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    return sdpa_attention_forward(module, q, k, v, mask, dropout=dropout, scaling=scaling, is_causal=is_causal)


def _causal(module, q, k, v, layout, dropout, scaling):
    return _sdpa(module, q, k, v, None, dropout, scaling, True)


def _masked(module, q, k, v, layout, dropout, scaling):
    return _sdpa(module, q, k, v, layout.mask, dropout, scaling, False)


def _varlen(module, q, k, v, layout, dropout, scaling):
    """q [1, h, T, d], k/v [1, kvh, T, d] -> [1, T, h, d] (what transformers' attention returns)."""
    # SDPA is on autocast's list and gets bf16 operands; this kernel is not, and the rotary embedding
    # (fp32 cos/sin of the fp32 master's hidden states) has promoted q and k back to fp32
    dtype = torch.get_autocast_dtype("cuda") if torch.is_autocast_enabled("cuda") else q.dtype
    q, k, v = (x[0].transpose(0, 1).to(dtype, memory_format=torch.contiguous_format) for x in (q, k, v))  # [T, heads, d]
    cu, n = layout.cu_seqlens, layout.max_len
    out = varlen_kernel()(q, k, v, cu, n, scaling, dropout)
    return out[None], None


ATTENTION: dict[AttentionKind, Callable] = {
    AttentionKind.CAUSAL: _causal,
    AttentionKind.MASK: _masked,
    AttentionKind.VARLEN: _varlen,
}


def layout_attention(module, query, key, value, attention_mask, dropout: float = 0.0, scaling: float | None = None,
                     layout: AttentionLayout | None = None, **kwargs):
    """The registered attention function: the call's layout decides; a call without one (a forward
    outside the update's own) is plain SDPA on transformers' mask."""
    if layout is None:
        return _sdpa(module, query, key, value, attention_mask, dropout, scaling, None)
    if kwargs.get("sliding_window") or kwargs.get("softcap"):
        raise NotImplementedError(
            f"{type(module).__name__}: the update's attention layouts have no sliding window or logit softcap; "
            "this model needs transformers' own attention (not supported by the update yet)")
    return ATTENTION[layout.kind](module, query, key, value, layout, dropout, scaling)


@functools.cache
def varlen_kernel() -> Callable | None:
    """(q, k, v [T, heads, d], cu_seqlens, max_len, scale, dropout) -> [T, h, d], causal within each
    sequence: flash-attn's varlen function when installed, else torch's (torch >= 2.10); None if
    neither is there. Grouped-query keys are passed as they are (both kernels take fewer KV heads)."""
    if importlib.util.find_spec("flash_attn") is not None:
        from flash_attn import flash_attn_varlen_func

        def flash(q, k, v, cu, n, scale, dropout):
            return flash_attn_varlen_func(q, k, v, cu, cu, n, n, dropout_p=dropout, softmax_scale=scale, causal=True)

        return flash
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    params = inspect.signature(varlen_attn).parameters
    # torch 2.10 says causal with is_causal=True; later versions with a (left, right) window
    causal = {"window_size": (-1, 0)} if "window_size" in params else {"is_causal": True}

    def torch_varlen(q, k, v, cu, n, scale, dropout):
        if dropout:
            raise ValueError("torch's varlen attention has no dropout; the layout should have been MASK")
        extra = dict(causal)
        if "scale" in params:
            extra["scale"] = scale
        elif scale is not None and abs(scale * q.shape[-1] ** 0.5 - 1) > 1e-6:
            raise ValueError(f"this torch's varlen attention takes no scale and the model's is {scale}")
        if k.shape[1] != q.shape[1]:
            if "enable_gqa" in params:
                extra["enable_gqa"] = True
            else:
                k, v = (x.repeat_interleave(q.shape[1] // x.shape[1], dim=1) for x in (k, v))
        return varlen_attn(q, k, v, cu, cu, n, n, **extra)

    return torch_varlen


def varlen_available(device: torch.device, dtype: torch.dtype | None) -> bool:
    """Whether VARLEN layouts can run: a CUDA device, a 16-bit compute dtype, a varlen kernel that
    passes `_varlen_probe` there."""
    if device.type != "cuda" or dtype not in (torch.bfloat16, torch.float16) or varlen_kernel() is None:
        return False
    return _varlen_probe(device, dtype)


@functools.cache
def _varlen_probe(device: torch.device, dtype: torch.dtype) -> bool:
    """One small call of the kernel, forward and backward, against SDPA on each sequence alone: a
    torch or flash-attn whose varlen API differs from what `varlen_kernel` expects leaves the update
    on padded rows, with a warning, instead of stopping the run."""
    import warnings

    try:
        gen = torch.Generator(device).manual_seed(0)
        q, k, v = (torch.randn(9, 2, 64, device=device, dtype=dtype, generator=gen).requires_grad_() for _ in range(3))
        cu = torch.tensor([0, 4, 9], dtype=torch.int32, device=device)
        out = varlen_kernel()(q, k, v, cu, 5, 64**-0.5, 0.0)
        out.float().sum().backward()
        ref = torch.cat([torch.nn.functional.scaled_dot_product_attention(
            *(x[a:b].transpose(0, 1)[None].float() for x in (q, k, v)), is_causal=True)[0].transpose(0, 1)
            for a, b in ((0, 4), (4, 9))])
        ok = q.grad is not None and float((out.float() - ref).abs().max()) < 0.05
    except Exception as e:  # noqa: BLE001 - any failure of the optional kernel means: do not use it
        warnings.warn(f"variable-length attention unavailable ({type(e).__name__}: {e}); packing falls back "
                      "to padded rows (trainer.packing=auto)", stacklevel=2)
        return False
    if not ok:
        warnings.warn("variable-length attention disagrees with SDPA on a probe; packing falls back to padded "
                      "rows", stacklevel=2)
    return ok


@contextlib.contextmanager
def update_attention(model: torch.nn.Module):
    """The policy runs `layout_attention` inside: its forwards must pass a `layout`."""
    from transformers import AttentionInterface

    AttentionInterface.register(NAME, layout_attention)  # idempotent
    config = model.get_decoder().config
    before = config._attn_implementation
    config._attn_implementation = NAME
    try:
        yield
    finally:
        config._attn_implementation = before
