"""The chunked-torch building blocks shared by K1 and K2: the LM-head GEMMs with fp32 logits and
the per-row work (log-softmax in place, log-probs, entropy) in vectorised torch.

Why torch and not numba on CPU: measured 2x faster on the row work (AVX-512 exp), and the row work
is under 10% of a step (docs/kernels.md). Memory per chunk: the [C, V] fp32 buffer plus
at most a [64, V] block temporary; no other [C, V] tensor is allocated.

K2 on this path never forms dz (unless the entropy bonus is on): with P = softmax(z/tau) in place,
its target entries set to 0 (P'), q = 1 - p_y = -expm1(logp) and M = P' W (the GEMM that would have
been dz W), dz = g (onehot(y) - P) gives
    dH = g (q W[y] - M) / tau,   dW += -P'^T (g h / tau) + index_add(y, q g h / tau),
    H = lse - (h / tau) . M - p_y z_y / tau,
so the three GEMMs stay three, the row work is one log-softmax and one exp pass, the entropy comes
free from M, and a confident token (p_y -> 1) loses no precision to W[y] - M cancellation.
"""

from __future__ import annotations

import warnings

import torch

_F32 = torch.float32


class LMHead:
    """z = h W^T (fp32 out), dH = dz W, dW += dz^T h for one call.

    compute_dtype: the GEMMs' operand dtype (None: the weight's). bf16 with an fp32 master weight is
    the mixed-precision head: W is cast once per call, hidden rows per chunk, and dW stays fp32.
    CUDA + bf16/fp16: bf16 GEMMs with fp32 output (`out_dtype`), dz in the compute dtype.
    CPU + bf16/fp16: the operands are rounded to the compute dtype and the GEMMs run in fp32 (MKL
    has no bf16->fp32 GEMM): the same numbers as bf16 operands with fp32 accumulation.
    1/tau is applied to the fp32 logits by the row work, not folded into h: rounding h/tau (even
    in fp32) made dH 2.4x less accurate at tau = 0.7 in the tests, and in bf16 it would perturb
    every logit.
    """

    def __init__(self, weight: torch.Tensor, temperature: float, compute_dtype: torch.dtype | None = None):
        self.dtype = compute_dtype or weight.dtype
        self.native = weight.device.type == "cuda" and self.dtype != _F32
        if self.native:
            self.w = weight.to(self.dtype)
        else:  # rounded to the compute dtype once, then fp32 (no copy for an fp32 weight in fp32)
            self.w = weight.to(self.dtype).to(_F32)
        self.inv_temp = 1.0 / temperature

    def rows(self, h: torch.Tensor) -> torch.Tensor:
        """The chunk's hidden rows as the GEMMs want them (fp32 unless on the native CUDA path)."""
        return h.to(self.dtype) if self.native else h.to(self.dtype).to(_F32)

    def logits(self, hs: torch.Tensor) -> torch.Tensor:  # [C, V] fp32
        if self.native:
            try:  # bf16 operands, fp32 accumulate *and* output (torch >= 2.8 on CUDA)
                return torch.mm(hs, self.w.T, out_dtype=_F32)
            except (TypeError, RuntimeError, NotImplementedError):
                warnings.warn("torch.mm(out_dtype=float32) unavailable: upcasting the LM head to fp32",
                              stacklevel=2)
                self.native, self.w = False, self.w.to(_F32)
                return hs.to(_F32) @ self.w.T
        return hs @ self.w.T

    def grad_dtype(self, dz: torch.Tensor) -> torch.Tensor:
        """dz as the backward GEMMs take it (the weight dtype on the native CUDA path)."""
        return dz.to(self.w.dtype) if self.native else dz

    def grad_hidden(self, dz: torch.Tensor) -> torch.Tensor:  # [C, H]; dz = d loss / d(raw z)
        return dz @ self.w if self.native else dz.to(_F32) @ self.w

    def mm_f32(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        """a @ b with fp32 output: operands in the compute dtype with fp32 accumulation on the native
        CUDA path, fp32 GEMM otherwise."""
        if self.native:
            try:
                return torch.mm(a.to(self.w.dtype), b.to(self.w.dtype), out_dtype=_F32)
            except (TypeError, RuntimeError, NotImplementedError):
                return a.to(_F32) @ b.to(_F32)
        return a.to(_F32) @ b.to(_F32)

    def probs_w(self, p: torch.Tensor) -> torch.Tensor:
        """M = P W [C, H] fp32."""
        return (p.to(self.w.dtype) @ self.w).to(_F32) if self.native else p @ self.w

    def grads_from_probs(self, p, m, q, g, hs, targets, dw: torch.Tensor | None, need_dh: bool,
                         first: bool = False):
        """dH, dW from P (softmax of z / tau with the target entries zeroed), M = P W, q = 1 - p_y
        and g = d loss / d logp (see the module doc). `first`: dw is uninitialised (overwrite it)."""
        dh = None
        if need_dh:
            dh = self.w[targets].to(_F32).mul_(q[:, None]).sub_(m).mul_(g[:, None] * self.inv_temp)
        if dw is not None:
            gh = hs.to(_F32) * (g[:, None] * self.inv_temp)  # g h / tau
            self.grad_weight_(dw, p, gh, alpha=-1.0, first=first)
            # index_put_ (accumulate): the CPU index_add_ along dim 0 took 120 ms here, this 11 ms
            dw.index_put_((targets,), gh.mul_(q[:, None]), accumulate=True)
        return dh

    def grad_weight_(self, dw: torch.Tensor, dz: torch.Tensor, hs: torch.Tensor, alpha: float = 1.0,
                     first: bool = False) -> None:
        """dw [V, H] fp32 (+)= alpha dz^T hs; `first` overwrites (dw comes from torch.empty: no
        113 MB memset, and beta = 0 never reads the garbage)."""
        beta = 0.0 if first else 1.0
        if not self.native:
            dw.addmm_(dz.to(_F32).T, hs.to(_F32), beta=beta, alpha=alpha)
            return
        dz, hs = dz.to(self.w.dtype), hs.to(self.w.dtype)
        try:  # fp32 accumulation of a bf16 GEMM without a [V, H] temporary (torch >= 2.8, CUDA)
            torch.addmm(dw, dz.T, hs, beta=beta, alpha=alpha, out_dtype=_F32, out=dw)
        except (TypeError, RuntimeError):
            upd = torch.mm(dz.T, hs, out_dtype=_F32).mul_(alpha)
            dw.copy_(upd) if first else dw.add_(upd)


def log_softmax_rows_(z: torch.Tensor, targets: torch.Tensor, inv_temp: float = 1.0):
    """z [C, V] fp32 logits -> log-probs, in place (one fused max/sum/write kernel per row, no
    [C, V] temporary). Returns logp [C] and lse [C] of z / tau."""
    if inv_temp != 1.0:
        z.mul_(inv_temp)
    zy = z.gather(1, targets[:, None]).squeeze(1)
    torch._log_softmax(z, 1, False, out=z)
    logp = z.gather(1, targets[:, None]).squeeze(1)
    return logp, zy - logp


# Rows per block for the entropy and dz loops: big enough that each torch op keeps both OpenMP
# threads busy (2-row blocks ran 10x slower on a loaded 2-core machine), small enough that the
# [rb, V] temporary stays a few MB.
_BLOCK_ROWS = 64


def entropy_rows(lp: torch.Tensor) -> torch.Tensor:
    """H = -sum_j p_j log p_j from log-probs lp [C, V] (unchanged), with a [64, V] temporary."""
    ent = lp.new_empty(lp.shape[0])
    for s in range(0, lp.shape[0], _BLOCK_ROWS):
        blk = lp[s:s + _BLOCK_ROWS]
        ent[s:s + _BLOCK_ROWS] = torch.linalg.vecdot(torch.exp(blk), blk).neg_()
    return ent


def dz_with_entropy_(lp: torch.Tensor, targets: torch.Tensor, g: torch.Tensor, ent: torch.Tensor,
                     ent_w: torch.Tensor) -> torch.Tensor:
    """lp [C, V] log-probs -> dz = d loss / d(z / tau), in place, for a loss with the entropy bonus:
    dz_j = p_j ((log p_j + H) ent_w - g) + g [j == y],  ent_w = entropy_coef * w."""
    for s in range(0, lp.shape[0], _BLOCK_ROWS):
        blk = lp[s:s + _BLOCK_ROWS]
        p = torch.exp(blk)
        blk.add_(ent[s:s + _BLOCK_ROWS, None]).mul_(ent_w[s:s + _BLOCK_ROWS, None])
        blk.sub_(g[s:s + _BLOCK_ROWS, None]).mul_(p)
    lp.scatter_add_(1, targets[:, None], g[:, None])
    return lp


def rows_torch(z: torch.Tensor, targets: torch.Tensor, *, inv_temp: float = 1.0, entropy: bool = False):
    """K1 row work: z [C, V] fp32 logits (overwritten by log-probs) -> logp, lse, entropy | None."""
    logp, lse = log_softmax_rows_(z, targets, inv_temp)
    return logp, lse, entropy_rows(z) if entropy else None
