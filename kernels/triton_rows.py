"""The @triton.jit row kernels of K1 (logprobs.py) and K2 (grpo_logits.py).

They live in this one module, imported only by the launchers, so that `import mentor_fast.kernels`
and the CPU default path never import triton. (A kernel nested in a cached builder function would
keep the layout of one file per op, but the Triton interpreter re-executes kernel source against
module globals and loses closures.) The launchers, `*_ref` specs and public functions sit in the
op files; the per-token math mirrors kernels/objective.py (the spec), and the tests compare the two.
"""

import triton
import triton.language as tl


@triton.jit
def _row_stats(base, V, inv_temp, BLOCK_V: tl.constexpr, WITH_ENTROPY: tl.constexpr):
    # one sweep: online max m, s = sum e^(z-m) and t = sum e^(z-m) (z-m); then lse = m + log s and
    # H = log s - t / s, a sum of two non-negative terms (lse - sum p z would cancel)
    m = float("-inf")
    s = 0.0
    t = 0.0
    for v0 in range(0, V, BLOCK_V):
        cols = v0 + tl.arange(0, BLOCK_V)
        mask = cols < V
        x = tl.load(base + cols, mask=mask, other=float("-inf")).to(tl.float32) * inv_temp
        m_new = tl.maximum(m, tl.max(x, 0))
        alpha = tl.exp(m - m_new)
        e = tl.exp(x - m_new)
        if WITH_ENTROPY:
            shift = tl.where(s > 0.0, m - m_new, 0.0) * s  # first block: m = -inf and s = 0
            t = alpha * (t + shift) + tl.sum(e * tl.where(mask, x - m_new, 0.0), 0)
        s = s * alpha + tl.sum(e, 0)
        m = m_new
    return m + tl.log(s), tl.log(s) - t / s

@triton.jit
def _logprob_rows_kernel(z_ptr, stride_z, y_ptr, logp_ptr, lse_ptr, ent_ptr, n_rows, V, inv_temp,
                         BLOCK_V: tl.constexpr, WITH_ENTROPY: tl.constexpr):
    for row in range(tl.program_id(0).to(tl.int64), n_rows, tl.num_programs(0)):  # int64 offsets
        base = z_ptr + row * stride_z
        lse, ent = _row_stats(base, V, inv_temp, BLOCK_V, WITH_ENTROPY)
        y = tl.load(y_ptr + row).to(tl.int64)
        tl.store(logp_ptr + row, tl.load(base + y).to(tl.float32) * inv_temp - lse)
        tl.store(lse_ptr + row, lse)
        if WITH_ENTROPY:
            tl.store(ent_ptr + row, ent)


@triton.jit
def _group_advantage(rew_ptr, gid_ptr, sid, n_seqs, adv_eps, ddof, EST: tl.constexpr, BLOCK_S: tl.constexpr):
    # K0 for one token: loads all S rewards (S << V, so this is noise next to the row sweep)
    offs = tl.arange(0, BLOCK_S)
    ms = offs < n_seqs
    r_all = tl.load(rew_ptr + offs, mask=ms, other=0.0)
    g_all = tl.load(gid_ptr + offs, mask=ms, other=-1)
    r = tl.load(rew_ptr + sid)
    in_g = ms & (g_all == tl.load(gid_ptr + sid))
    cnt = tl.sum(in_g.to(tl.float32), 0)
    mu = tl.sum(tl.where(in_g, r_all, 0.0), 0) / cnt
    dev = r - mu
    var = tl.sum(tl.where(in_g, (r_all - mu) * (r_all - mu), 0.0), 0) / tl.maximum(cnt - ddof, 1.0)
    var = tl.where(cnt > ddof, var, 0.0)
    same = tl.max(tl.where(in_g, r_all, float("-inf")), 0) == tl.min(tl.where(in_g, r_all, float("inf")), 0)
    if EST == 0:
        a = dev / (tl.sqrt(var) + adv_eps)
    elif EST == 1:
        a = dev
    elif EST == 2:
        nb = n_seqs * 1.0
        bmu = tl.sum(r_all, 0) / nb
        bvar = tl.sum(tl.where(ms, (r_all - bmu) * (r_all - bmu), 0.0), 0) / tl.maximum(nb - ddof, 1.0)
        a = dev / (tl.sqrt(tl.where(nb > ddof, bvar, 0.0)) + adv_eps)
    else:
        a = tl.where(cnt > 1.0, dev * cnt / tl.maximum(cnt - 1.0, 1.0), 0.0)
    return tl.where(same, 0.0, a)


@triton.jit
def _policy_term(logp, old, a, eps_low, eps_high, dual_clip, cispo_cap, tau_pos, tau_neg, LOSS: tl.constexpr):
    """Token policy loss and d/d logp (before w and the IS weight); mirrors objective.POLICY_LOSSES:
    LOSS 0 clip (gspo runs it on a given g), 1 cispo, 2 sapo."""
    lr = logp - old
    ratio = tl.exp(tl.minimum(tl.maximum(lr, -20.0), 20.0))
    in_range = tl.abs(lr) <= 20.0  # the clamped log-ratio carries no gradient outside
    if LOSS == 1:  # -sg(min(r, cap)) A logp
        coef = tl.minimum(ratio, cispo_cap)
        pg = -coef * a * logp
        dpg = -coef * a
    elif LOSS == 2:  # -(4 / tau) sigmoid(tau (r - 1)) A
        tau = tl.where(a > 0.0, tau_pos, tau_neg)
        gate = tl.sigmoid(tau * (ratio - 1.0))
        pg = -gate * (4.0 / tau) * a
        dpg = tl.where(in_range, -4.0 * gate * (1.0 - gate) * ratio * a, 0.0)
    else:
        pg1 = -a * ratio
        pg2 = -a * tl.minimum(tl.maximum(ratio, 1.0 - eps_low), 1.0 + eps_high)
        pg = tl.maximum(pg1, pg2)
        live = (pg1 >= pg2) & in_range  # the clipped side has no gradient
        dual = (dual_clip > 0.0) & (a < 0.0) & (pg > -dual_clip * a)
        pg = tl.where(dual, -dual_clip * a, pg)
        live = live & (dual == 0)
        dpg = tl.where(live, -a * ratio, 0.0)
    return pg, dpg


@triton.jit
def _kl_terms(d, KL: tl.constexpr):
    """KL estimator and d/d logp as functions of d = logp - ref (objective.KL_ESTIMATORS)."""
    if KL == 1:
        kl = d
        dkl = d * 0.0 + 1.0
    elif KL == 2:
        kl = 0.5 * d * d
        dkl = d
    else:  # x = clamp(ref - logp, -20, 20): exp(x) - x - 1, no gradient outside the clamp
        x = tl.minimum(tl.maximum(-d, -20.0), 20.0)
        kl = tl.exp(x) - x - 1.0
        dkl = tl.where(tl.abs(d) <= 20.0, 1.0 - tl.exp(x), 0.0)
    return kl, dkl


@triton.jit
def _write_dz(base, dbase, V, y, lse, ent, g, ecw, inv_temp, BLOCK_V: tl.constexpr, ENT_GRAD: tl.constexpr,
              BARRIER: tl.constexpr):
    """Pass 2: dz = (g (onehot(y) - p) [+ p ((log p + H) ecw - g) instead with the bonus]) / tau."""
    for v0 in range(0, V, BLOCK_V):
        cols = v0 + tl.arange(0, BLOCK_V)
        mask = cols < V
        lp = tl.load(base + cols, mask=mask, other=0.0).to(tl.float32) * inv_temp - lse
        p = tl.exp(lp)
        if ENT_GRAD:
            dz = p * ((lp + ent) * ecw - g)
        else:
            dz = -g * p
        dz = tl.where(cols == y, dz + g, dz) * inv_temp
        if BARRIER:  # in-place bf16 write into the fp32 row: all warps must have read this block
            tl.debug_barrier()
        tl.store(dbase + cols, dz.to(dbase.dtype.element_ty), mask=mask)


@triton.jit
def _grpo_rows_kernel(z_ptr, stride_z, dz_ptr, stride_dz, y_ptr, old_ptr, adv_ptr, w_ptr, ref_ptr,
                      isw_ptr, g_ptr, rew_ptr, gid_ptr, sid_ptr, n_seqs, logp_ptr, ent_ptr, adv_out_ptr,
                      loss_ptr, n_rows, V, inv_temp, eps_low, eps_high, dual_clip, cispo_cap, tau_pos,
                      tau_neg, beta, ent_coef, adv_eps, ddof, BLOCK_V: tl.constexpr,
                      BLOCK_S: tl.constexpr, KL: tl.constexpr, LOSS: tl.constexpr, HAS_IS: tl.constexpr, G_GIVEN: tl.constexpr, FUSED_ADV: tl.constexpr,
                      ADV_EST: tl.constexpr, NEED_GRAD: tl.constexpr, WITH_ENTROPY: tl.constexpr,
                      ENT_GRAD: tl.constexpr, BARRIER: tl.constexpr):
    for row in range(tl.program_id(0).to(tl.int64), n_rows, tl.num_programs(0)):  # int64 offsets
        base = z_ptr + row * stride_z
        lse, ent = _row_stats(base, V, inv_temp, BLOCK_V, WITH_ENTROPY)  # pass 1
        y = tl.load(y_ptr + row).to(tl.int64)
        logp = tl.load(base + y).to(tl.float32) * inv_temp - lse
        w = tl.load(w_ptr + row)
        if FUSED_ADV:  # K0 in-kernel
            a = _group_advantage(rew_ptr, gid_ptr, tl.load(sid_ptr + row), n_seqs, adv_eps, ddof,
                                 ADV_EST, BLOCK_S)
            tl.store(adv_out_ptr + row, a)
        else:
            a = tl.load(adv_ptr + row)
        pg, dpg = _policy_term(logp, tl.load(old_ptr + row), a, eps_low, eps_high, dual_clip, cispo_cap,
                               tau_pos, tau_neg, LOSS)
        if HAS_IS:
            isw = tl.load(isw_ptr + row)
            pg = pg * isw
            dpg = dpg * isw
        tok = pg
        g = dpg * w
        if KL != 0:
            kl, dkl = _kl_terms(logp - tl.load(ref_ptr + row), KL)
            tok += beta * kl
            g += beta * w * dkl
        if ENT_GRAD:
            tok -= ent_coef * ent
        if G_GIVEN:  # gspo: g from the whole sequence, computed between the two phases
            g = tl.load(g_ptr + row)
        tl.store(logp_ptr + row, logp)
        tl.store(loss_ptr + row, w * tok)
        if WITH_ENTROPY:
            tl.store(ent_ptr + row, ent)
        if NEED_GRAD:
            _write_dz(base, dz_ptr + row * stride_dz, V, y, lse, ent, g, ent_coef * w, inv_temp,
                      BLOCK_V, ENT_GRAD, BARRIER)
