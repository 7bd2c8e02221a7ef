"""The @triton.jit kernels of the GEMM head (gemm_head.py): the LM-head GEMM with the softmax
statistics in its epilogue, and the per-row fix-up of the scaled probabilities it writes.

Imported only by gemm_head.py's launchers (as triton_rows.py is by the row launchers), so that
`import mentor_fast.kernels` never imports triton. The math is specified by gemm_head.py's
`softmax_stats_ref`; the tests compare the two under the Triton interpreter.
"""

import os

import triton
import triton.language as tl

from .options import BN_MIN


def _configs():
    """Tile shapes for the autotuner, keyed on (V, K). On a GPU: the shapes Triton's Hopper matmul
    tutorials tune over (bf16 operands, fp32 accumulation), a few for fp32 operands with smaller K
    steps. Under the interpreter: one small tile, so tests cross tile boundaries on small shapes."""
    if os.environ.get("TRITON_INTERPRET") == "1":
        return [triton.Config({"BM": 16, "BN": BN_MIN, "BK": 32, "GROUP_M": 2}, num_warps=1, num_stages=1)]
    shapes = [(128, 256, 64, 8, 3), (128, 128, 64, 8, 4), (64, 256, 64, 4, 4), (256, 128, 64, 8, 3),
              (128, 128, 128, 8, 3), (128, 64, 64, 4, 4), (64, 128, 32, 4, 4), (64, BN_MIN, 32, 4, 4)]
    return [triton.Config({"BM": bm, "BN": bn, "BK": bk, "GROUP_M": 8}, num_warps=w, num_stages=s)
            for bm, bn, bk, w, s in shapes]


@triton.autotune(configs=_configs(), key=["V", "K", "STORE_P"])
@triton.jit
def _softmax_stats_gemm(h_ptr, w_ptr, y_ptr, m0_ptr, p_ptr, pm_ptr, ps_ptr, pt_ptr, xy_ptr, M, V, K,
                        stride_hm, stride_hk, stride_wv, stride_wk, stride_pm, stride_sm, inv_temp, cap,
                        BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr,
                        STORE_P: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    # x = (h W^T) / tau for one [BM, BN] tile, in fp32 registers; what leaves the chip: the tile's row
    # max m_t, s_t = sum e^(x - m_t), t_t = sum e^(x - m_t) (x - m_t), the target logit x_y from the
    # tile that holds it (the same rounding as the lse's terms, so logp = x_y - lse cancels it as a
    # log-softmax does), and (STORE_P) the scaled probabilities e^(x - r_t), r_t = max(m0, m_t - cap),
    # with the target column set to 0
    pid = tl.program_id(0)
    n_m = tl.cdiv(M, BM)
    n_n = tl.cdiv(V, BN)
    width = GROUP_M * n_n  # GROUP_M row tiles sweep the vocabulary together: W tiles reused from L2
    first_m = (pid // width) * GROUP_M
    size_m = tl.minimum(n_m - first_m, GROUP_M)
    pid_m = first_m + (pid % width) % size_m
    pid_n = (pid % width) // size_m
    rm = pid_m * BM + tl.arange(0, BM)
    rn = pid_n * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    row_ok = rm < M
    col_ok = rn < V
    a_ptrs = h_ptr + rm[:, None].to(tl.int64) * stride_hm + rk[None, :] * stride_hk
    b_ptrs = w_ptr + rn[None, :].to(tl.int64) * stride_wv + rk[:, None] * stride_wk
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in range(0, K, BK):
        k_ok = (k0 + rk) < K
        a = tl.load(a_ptrs, mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        b = tl.load(b_ptrs, mask=k_ok[:, None] & col_ok[None, :], other=0.0)
        if UPCAST:  # the interpreter's dot mishandles bf16 operands: exact fp32 products of the same values
            a = a.to(tl.float32)
            b = b.to(tl.float32)
        acc = tl.dot(a, b, acc, input_precision=PRECISION)
        a_ptrs += BK * stride_hk
        b_ptrs += BK * stride_wk
    x = acc * inv_temp
    xm = tl.where(col_ok[None, :], x, float("-inf"))
    mt = tl.max(xm, 1)
    e = tl.exp(xm - mt[:, None])
    s_off = rm.to(tl.int64) * stride_sm + pid_n
    tl.store(pm_ptr + s_off, mt, mask=row_ok)
    tl.store(ps_ptr + s_off, tl.sum(e, 1), mask=row_ok)
    tl.store(pt_ptr + s_off, tl.sum(e * tl.where(col_ok[None, :], x - mt[:, None], 0.0), 1), mask=row_ok)
    y = tl.load(y_ptr + rm, mask=row_ok, other=-1)
    hit = rn[None, :] == y[:, None]
    tl.store(xy_ptr + rm, tl.sum(tl.where(hit, x, 0.0), 1), mask=row_ok & (tl.max(hit.to(tl.int32), 1) > 0))
    if STORE_P:
        r = tl.maximum(tl.load(m0_ptr + rm, mask=row_ok, other=0.0), mt - cap)
        p = tl.where(hit, 0.0, tl.exp(xm - r[:, None]))
        tl.store(p_ptr + rm[:, None].to(tl.int64) * stride_pm + rn[None, :], p.to(p_ptr.dtype.element_ty),
                 mask=row_ok[:, None] & col_ok[None, :])


@triton.jit
def _rescale_tiles(p_ptr, stride_pm, pm_ptr, stride_sm, m0_ptr, r_ptr, n_rows, n_tiles, V, cap, BN,
                   BLOCK: tl.constexpr, BLOCK_T: tl.constexpr):
    # one program per row (grid-stride): tiles written against r_t = max(m0, m_t - cap) below the row's
    # reference r = max(m0, max_t m_t - cap) are brought to r. Only rows whose logits reach above
    # m0 + cap have such tiles; every other row costs one vector read of its tile maxima.
    toffs = tl.arange(0, BLOCK_T)
    for row in range(tl.program_id(0).to(tl.int64), n_rows, tl.num_programs(0)):
        m0 = tl.load(m0_ptr + row)
        r = tl.load(r_ptr + row)
        pm = tl.load(pm_ptr + row * stride_sm + toffs, mask=toffs < n_tiles, other=float("-inf"))
        if tl.max(r - tl.maximum(m0, pm - cap), 0) > 0.0:
            for t in range(n_tiles):
                rt = tl.maximum(m0, tl.load(pm_ptr + row * stride_sm + t) - cap)
                if rt < r:
                    f = tl.exp(rt - r)
                    end = tl.minimum((t + 1) * BN, V)
                    for c0 in range(t * BN, end, BLOCK):
                        cols = c0 + tl.arange(0, BLOCK)
                        q = p_ptr + row * stride_pm + cols
                        v = tl.load(q, mask=cols < end, other=0.0).to(tl.float32)
                        tl.store(q, (v * f).to(p_ptr.dtype.element_ty), mask=cols < end)
