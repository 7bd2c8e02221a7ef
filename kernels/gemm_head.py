"""The GEMM head (Backend.GEMM): the LM-head GEMM z = h W^T with the softmax statistics taken in its
epilogue, so the fp32 logits never leave the chip. The jit code is in triton_gemm.py (lazy import).

Per chunk of C rows and [BM, BN] tile, the epilogue reduces the tile's fp32 logits x = z / tau to
three numbers per row - m_t = max x, s_t = sum e^(x - m_t), t_t = sum e^(x - m_t)(x - m_t) - from
which the host combines lse and the entropy exactly as the row kernels do (online max, so the
entropy is a sum of non-negative terms). For K1 that is all: the logits are never written, and the
target logit x_y comes from a [C, H] gather-dot. For K2 the epilogue also writes the *scaled*
probabilities P'_j = e^(x_j - r) (the target column 0) in the GEMM operand dtype: the only
row-dependent factor of the logits gradient is g = d loss / d logp, which needs lse and so is not
known inside the tile, but

    dz_j = g (onehot_j(y) - p_j) / tau = a P'_j + b onehot_j(y),   a = -g e^(r - lse) / tau,
                                                                    b = g (1 - p_y) / tau
    dH = a * (P' W) + b * W[y]        dW += P'^T (a * h) + index_put(y, b * h)

so a and b are applied to [C, H] operands and the three GEMMs stay three (6NHV). Bytes per logit
beyond the GEMMs' own operands: P' written once in bf16 (2), where the row-kernel path writes the
fp32 logits (4), reads them twice (8) and writes dz (2). The target entry is handled exactly by b
(q = 1 - p_y = -expm1(logp)), as the chunked CPU path does (chunked.py).

The reference r: r = m0 = x_y for almost every row (so P' = p / p_y); a tile whose max is above
m0 + CAP writes against r_t = m_t - CAP instead (P' stays below e^CAP: its fp32 GEMM sums cannot
overflow), and a per-row fix-up brings the row's tiles to one r = max(m0, max_t m_t - CAP). Only
tokens with log-prob below -CAP have such rows; nothing waits on the host for them.
Entries with x - r < -87 underflow to 0: they are below e^-87 of the row's largest probability.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

from .chunked import LMHead
from .options import BN_MIN

CAP = 64.0  # P' <= e^64: V * e^64 * |W| stays far below fp32's 3.4e38 in the backward GEMMs
_F32 = torch.float32


class TileStats(NamedTuple):
    """Per-row, per-vocab-tile statistics of x = logits / tau ([C, T] fp32; unused slots: max -inf, sums 0)."""

    max: torch.Tensor
    sum_exp: torch.Tensor  # sum e^(x - max)
    sum_exp_x: torch.Tensor  # sum e^(x - max) (x - max)


def softmax_stats_ref(hs, w, y, inv_temp: float, m0=None, bn: int = 64, cap: float = CAP):
    """Spec of the GEMM epilogue on materialised logits: (TileStats over tiles of `bn` columns,
    P' [C, V] fp32 or None). hs [C, H], w [V, H], y [C]; m0 [C] the rows' reference (P' needs it)."""
    x = (hs.to(_F32) @ w.to(_F32).T) * inv_temp  # [C, V]
    c, v = x.shape
    n_t = math.ceil(v / bn)
    xt = torch.nn.functional.pad(x, (0, n_t * bn - v), value=float("-inf")).view(c, n_t, bn)
    mt = xt.max(-1).values
    e = torch.exp(xt - mt[..., None])
    st = TileStats(mt, e.sum(-1), torch.where(e > 0, e * (xt - mt[..., None]), 0.0).sum(-1))
    if m0 is None:
        return st, None
    r = torch.maximum(m0[:, None], mt - cap).repeat_interleave(bn, 1)[:, :v]
    p = torch.exp(x - r).scatter_(1, y[:, None].long(), 0.0)
    return st, p


def combine_stats(st: TileStats) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(lse [C], entropy [C], row max [C]) of x from its tiles' statistics: with M the row max,
    S = sum_t e^(m_t - M) s_t, T = sum_t e^(m_t - M) (t_t + (m_t - M) s_t) <= 0,
    lse = M + log S and H = log S - T / S (two non-negative terms)."""
    big = st.max.max(1).values
    d = st.max - big[:, None]
    scale = torch.exp(d)
    s = (scale * st.sum_exp).sum(1)
    t = torch.where(st.sum_exp > 0, scale * (st.sum_exp_x + d * st.sum_exp), 0.0).sum(1)
    log_s = torch.log(s)
    return big + log_s, log_s - t / s, big


def target_logits(lm: LMHead, hs: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """x_y = h . W[y] / tau [C] fp32 by a [C, H] gather: P's reference m0, known before the GEMM."""
    return torch.linalg.vecdot(hs.to(_F32), lm.w[y].to(_F32)) * lm.inv_temp


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _next_pow2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


def _precision(dtype: torch.dtype):
    """tl.dot's input precision: fp32 operands stay fp32 (IEEE) unless torch allows TF32 GEMMs."""
    if dtype != _F32:
        return None
    return "tf32" if torch.backends.cuda.matmul.allow_tf32 else "ieee"


def softmax_stats_gemm(hs: torch.Tensor, w: torch.Tensor, inv_temp: float, y: torch.Tensor, *, m0=None,
                       p_out: torch.Tensor | None = None) -> tuple[TileStats, torch.Tensor, int]:
    """Host launcher: the GEMM with the statistics epilogue (and P' into p_out [C, V] when given,
    which needs m0). hs [C, H] and w [V, H] in one operand dtype, y [C] the targets. Returns (stats,
    the target logits x_y [C] as the GEMM computed them, the BN used)."""
    from .options import launch_device
    from .triton_gemm import _softmax_stats_gemm

    c, k = hs.shape
    v = w.shape[0]
    if hs.dtype != w.dtype:
        raise ValueError(f"softmax_stats_gemm: operands of one dtype, got {hs.dtype} and {w.dtype}")
    slots = math.ceil(v / BN_MIN)
    f32 = {"dtype": _F32, "device": hs.device}
    st = TileStats(torch.full((c, slots), float("-inf"), **f32), torch.zeros(c, slots, **f32),
                   torch.zeros(c, slots, **f32))
    store = p_out is not None
    if store and m0 is None:
        raise ValueError("softmax_stats_gemm: p_out needs the rows' references m0")
    x_y = torch.empty(c, **f32)
    dummy = st.max
    grid = lambda meta: (_cdiv(c, meta["BM"]) * _cdiv(v, meta["BN"]),)
    with launch_device(hs.device):
        _softmax_stats_gemm[grid](
            hs, w, y, m0 if store else dummy, p_out if store else dummy, *st, x_y, c, v, k,
            hs.stride(0), hs.stride(1), w.stride(0), w.stride(1), p_out.stride(0) if store else 0,
            st.max.stride(0), inv_temp, CAP, STORE_P=store, PRECISION=_precision(hs.dtype),
            UPCAST=not hs.is_cuda and hs.dtype != _F32)
    return st, x_y, _softmax_stats_gemm.best_config.kwargs["BN"]


def rescale_tiles_(p: torch.Tensor, st: TileStats, m0: torch.Tensor, r: torch.Tensor, bn: int) -> None:
    """Brings every tile of P' written against r_t < r to the row's reference r, in place."""
    from .options import launch_device, row_grid
    from .triton_gemm import _rescale_tiles

    c, v = p.shape
    n_t = _cdiv(v, bn)
    with launch_device(p.device):
        _rescale_tiles[row_grid(c, p.device)](p, p.stride(0), st.max, st.max.stride(0), m0, r, c, n_t, v,
                                              CAP, bn, BLOCK=min(1024, max(16, _next_pow2(bn))),
                                              BLOCK_T=max(16, _next_pow2(n_t)),
                                              num_warps=4 if p.is_cuda else 1)


def gemm_logprob_stats(lm: LMHead, hs: torch.Tensor, y: torch.Tensor):
    """K1 on one chunk: (logp, lse, entropy) [C] fp32; the logits are never written."""
    st, x_y, _ = softmax_stats_gemm(hs, lm.w, lm.inv_temp, y)
    lse, ent, _ = combine_stats(st)
    return x_y - lse, lse, ent


def gemm_head_chunk(lm: LMHead, hs: torch.Tensor, y: torch.Tensor, grads_of, *, need_dh: bool,
                    dw: torch.Tensor | None, first: bool):
    """K2 on one chunk: (logp [C], entropy [C], dH_c [C, H] fp32 | None); dw [V, H] fp32 (+)= dW_c
    (`first`: overwrite it). grads_of(logp, entropy) -> g = d loss / d logp [C]."""
    m0 = target_logits(lm, hs, y)
    p = torch.empty(hs.shape[0], lm.w.shape[0], dtype=lm.w.dtype, device=hs.device)  # P' [C, V]
    st, x_y, bn = softmax_stats_gemm(hs, lm.w, lm.inv_temp, y, m0=m0, p_out=p)
    lse, ent, big = combine_stats(st)
    logp = x_y - lse
    r = torch.maximum(m0, big - CAP)
    rescale_tiles_(p, st, m0, r, bn)
    g = grads_of(logp, ent)
    a = -g * torch.exp(r - lse) * lm.inv_temp
    b = -g * torch.expm1(logp) * lm.inv_temp  # g (1 - p_y) / tau, exact for p_y -> 1
    dh = None
    if need_dh:
        dh = lm.mm_f32(p, lm.w).mul_(a[:, None]).add_(lm.w[y].to(_F32) * b[:, None])
    if dw is not None:
        h32 = hs.to(_F32)
        lm.grad_weight_(dw, p, h32 * a[:, None], first=first)
        dw.index_put_((y,), h32 * b[:, None], accumulate=True)
    return logp, ent, dh


def bytes_per_logit(lm: LMHead, with_probs: bool) -> float:
    """The chunk memory per logit: P' in the operand dtype (K2) plus the tile statistics."""
    return (lm.w.element_size() if with_probs else 0.0) + 12.0 / BN_MIN
