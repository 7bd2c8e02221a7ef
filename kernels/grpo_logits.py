"""The K2 row kernel's launcher and the logits-level GRPO op (for callers that already hold logits).
The @triton.jit code is in triton_rows.py (imported lazily, see there).

One program per row (1-D grid, grid-stride): pass 1 reads the row once (online max / sum-exp /
sum e*z -> lse, entropy) and gathers the target logit; the token math (advantage - K0 in-kernel
from the rewards and the group layout when asked -, ratio, clip, dual clip, KL, IS weight) gives
g = d loss / d logp; pass 2 re-reads the row and writes dz = d loss / d logits. Logits stay fp32
until the log-probs are taken. Bytes: 2 reads + 1 write of the row; FLOPs: ~10 per logit.
In K2 dz is written in place into the fp32 chunk buffer: a bf16 dz row fits in the first half of
its fp32 row, and left-to-right blocks only overwrite elements already read (a barrier per block
orders the warps; only block 0 can overlap its own reads).
"""

import torch

from .chunked import dz_with_entropy_, entropy_rows, log_softmax_rows_, rows_torch
from .logprobs import logprob_rows_triton
from .options import Backend, GRPOLossOutput, GRPOOptions, KLEstimator, chunk_rows, resolve_backend, row_grid
from .token_math import (
    POLICY_LOSSES,
    TokenInputs,
    build_token_inputs,
    fused_advantage_inputs,
    loss_grad,
    make_output,
    summarize,
)

_KL_CODE = {KLEstimator.K1: 1, KLEstimator.K2: 2, KLEstimator.K3: 3}
_ADV_CODE = {"grpo": 0, "dr_grpo": 1, "batch": 2, "rloo": 3}


def grpo_rows_triton(z, y, t: TokenInputs, opts: GRPOOptions, *, inv_temp=1.0, need_grad=True, g_given=None,
                     fused_adv=None, row0=0, dz_out=None, dz_dtype=torch.float32, block_v=None):
    """Host launcher. z [C, V] logits (fp32 chunk from K2, or the caller's logits). Returns
    (logp [C], entropy [C] | None, advantages [C] | None (in-kernel K0), dz [C, V] | None, token_loss [C]).
    dz goes to `dz_out`, or in place into z (as a bf16 view of its first half-rows for bf16 inputs)."""
    c, v = z.shape
    f32 = {"dtype": torch.float32, "device": z.device}
    logp, loss = torch.empty(c, **f32), torch.empty(c, **f32)
    with_ent = opts.need_entropy
    ent = torch.empty(c, **f32) if with_ent else logp
    dz = dz_out
    if need_grad and dz is None:
        dz = z if z.dtype == dz_dtype else z.view(dz_dtype)[:, :v]  # bf16 dz in fp32 row's first half
    dummy = logp
    rew, gid, sid = fused_adv if fused_adv is not None else (dummy, dummy, dummy)
    if fused_adv is not None:
        sid = sid[row0:row0 + c]
    adv_out = torch.empty(c, **f32) if fused_adv is not None else dummy
    kl = _KL_CODE[opts.kl_estimator] if t.ref_logp is not None else 0
    bv = block_v or min(4096 if z.is_cuda else 2048, max(16, 1 << (v - 1).bit_length()))
    n_s = int(rew.numel()) if fused_adv is not None else 1
    from .triton_rows import _grpo_rows_kernel

    _grpo_rows_kernel[row_grid(c, z.device)](
        z, z.stride(0), dz if dz is not None else z, (dz if dz is not None else z).stride(0), y,
        t.old_logp, t.advantages, t.weights, t.ref_logp if kl else dummy,
        t.is_weights if t.is_weights is not None else dummy, g_given if g_given is not None else dummy,
        rew, gid, sid, n_s, logp, ent, adv_out, loss, c, v, inv_temp, opts.eps_low, opts.eps_high,
        opts.dual_clip, opts.beta, opts.entropy_coef, opts.adv_eps, float(opts.adv_ddof),
        BLOCK_V=bv, BLOCK_S=max(16, 1 << max(n_s - 1, 0).bit_length()), KL=kl,
        HAS_IS=t.is_weights is not None, G_GIVEN=g_given is not None, FUSED_ADV=fused_adv is not None,
        ADV_EST=_ADV_CODE[str(opts.adv_estimator)], NEED_GRAD=bool(need_grad), WITH_ENTROPY=with_ent,
        ENT_GRAD=opts.entropy_coef != 0, BARRIER=bool(need_grad and z.is_cuda and dz_out is None),
        num_warps=8 if z.is_cuda else 1)
    return (logp, ent if with_ent else None, adv_out if fused_adv is not None else None,
            dz if need_grad else None, loss)


_KL_REF = {  # as functions of d = logp - ref
    KLEstimator.K1: lambda d: d,
    KLEstimator.K2: lambda d: 0.5 * d * d,
    KLEstimator.K3: lambda d: torch.exp(-d) + d - 1.0,  # exp(ref - logp) - (ref - logp) - 1
}


def grpo_loss_from_logits_ref(logits, targets, old_logp, advantages=None, token_weights=None, *,
                              ref_logp=None, is_weights=None, seq_ids=None, rewards=None, group_ids=None,
                              options: GRPOOptions | None = None, backend=None, **knobs) -> GRPOLossOutput:
    """Spec of K2 on logits [N, V] (raw, before the temperature), autograd for the gradient.

        logp_t = log_softmax(z_t / tau)[y_t];   r_t = exp(clamp(logp_t - old_t, -20, 20))
        pg_t   = max(-A_t r_t, -A_t clip(r_t, 1 - eps_low, 1 + eps_high))
        dual clip c > 1, only where A_t < 0:  pg_t = min(pg_t, -c A_t)          (verl's form)
        gspo:  r_t = s_i = exp(clamp(mean over t' in seq i with w_t' != 0 of (logp_t' - old_t'), -20, 20))
        H_t = -sum_j p_tj log p_tj;  kl_t = k1: d, k2: d^2 / 2, k3: e^-d + d - 1  (d = logp_t - ref_t)
        loss = sum_t w_t (is_t pg_t + beta kl_t - entropy_coef H_t)
    Bytes: the logits plus ~2 [N, V] autograd buffers. Computes in fp32 (fp64 for fp64 logits).
    """
    opts = GRPOOptions.build(options, knobs)
    dt = torch.promote_types(logits.dtype, torch.float32)
    t = build_token_inputs(logits.shape[0], logits.device, dt, old_logp, advantages, token_weights, ref_logp,
                           is_weights, seq_ids, rewards, group_ids, opts)
    logprobs = torch.log_softmax(logits.to(dt) / opts.temperature, dim=-1)
    logp = logprobs.gather(-1, targets[:, None].long()).squeeze(-1)
    with torch.set_grad_enabled(torch.is_grad_enabled() and opts.entropy_coef != 0):
        entropy = -(logprobs.exp() * logprobs).sum(-1) if opts.need_entropy else None
    if opts.loss_type == "gspo":
        active = (t.weights != 0).to(dt)
        n_s = max(t.n_seqs, int(t.seq_ids.max()) + 1)
        length = torch.zeros(n_s, dtype=dt).index_add(0, t.seq_ids, active).clamp_min(1)
        seq_lr = torch.zeros(n_s, dtype=dt).index_add(0, t.seq_ids, (logp - t.old_logp) * active) / length
        ratio = torch.exp(seq_lr.clamp(-20, 20))[t.seq_ids]
    else:
        ratio = torch.exp((logp - t.old_logp).clamp(-20, 20))
    a = t.advantages
    pg = torch.maximum(-a * ratio, -a * ratio.clamp(1 - opts.eps_low, 1 + opts.eps_high))
    if opts.dual_clip > 0:
        pg = torch.where(a < 0, torch.minimum(pg, -opts.dual_clip * a), pg)
    tok = pg if t.is_weights is None else pg * t.is_weights
    if opts.beta != 0 and t.ref_logp is not None:
        tok = tok + opts.beta * _KL_REF[opts.kl_estimator](logp - t.ref_logp)
    if opts.entropy_coef != 0:
        tok = tok - opts.entropy_coef * entropy
    loss = (t.weights * tok).sum()
    m = summarize(logp.detach(), None if entropy is None else entropy.detach(), t, opts)
    return make_output(loss, logp.detach(), entropy, t, m)


def _rows_torch_grad(z, y, g, t: TokenInputs, opts: GRPOOptions, need_entropy: bool):
    """Chunked-torch row work on fp32 logits z [C, V] (overwritten by dz = d loss / d z)."""
    logp, _ = log_softmax_rows_(z, y, 1.0 / opts.temperature)
    ent = entropy_rows(z) if (need_entropy or opts.entropy_coef != 0) else None
    if g is None:
        g = loss_grad(logp, t, opts)
    if opts.entropy_coef != 0:
        dz_with_entropy_(z, y, g, ent, opts.entropy_coef * t.weights)
    else:
        z.exp_().mul_(g[:, None].neg()).scatter_add_(1, y[:, None], g[:, None])
    return logp, ent, z.mul_(1.0 / opts.temperature) if opts.temperature != 1.0 else z


class _LogitsRun:
    def __init__(self, targets, t, opts, backend, fused_adv, inplace):
        self.targets, self.t, self.opts, self.backend = targets, t, opts, backend
        self.fused_adv, self.inplace, self.out = fused_adv, inplace, {}

    def __call__(self, logits, need_grad: bool):
        opts, t, y = self.opts, self.t, self.targets
        g_all = None
        if need_grad and POLICY_LOSSES[opts.loss_type].sequence_level:  # gspo: all logp first
            g_all = loss_grad(self._logp(logits), t, opts)
        dz = (logits if self.inplace else torch.empty_like(logits)) if need_grad else None
        if self.backend is Backend.TRITON:
            logp, ent, adv, _, tok = grpo_rows_triton(logits, y, t, opts, inv_temp=1.0 / opts.temperature,
                                                      need_grad=need_grad, g_given=g_all,
                                                      fused_adv=self.fused_adv, dz_out=dz)
            if adv is not None:
                t.advantages = adv
        else:
            c = chunk_rows(logits.shape[0], logits.shape[1], opts, logits.device)
            parts = []
            for s in range(0, logits.shape[0], c):
                z = logits[s:s + c].to(torch.float32, copy=not (self.inplace and logits.dtype == torch.float32))
                tc = t.rows(s, s + z.shape[0])
                if not need_grad:
                    parts.append(rows_torch(z, y[s:s + c], inv_temp=1.0 / opts.temperature,
                                            entropy=opts.need_entropy)[::2])
                    continue
                lp, en, dzc = _rows_torch_grad(z, y[s:s + c], None if g_all is None else g_all[s:s + c],
                                               tc, opts, opts.need_entropy)
                if dzc.data_ptr() != dz[s:s + c].data_ptr():
                    dz[s:s + c] = dzc
                parts.append((lp, en))
            logp = torch.cat([p[0] for p in parts])
            ent = torch.cat([p[1] for p in parts]) if parts and parts[0][1] is not None else None
        self.out = summarize(logp, ent, t, opts) | {"logp": logp, "entropy": ent}
        if self.backend is Backend.TRITON and not POLICY_LOSSES[opts.loss_type].sequence_level:  # same pass
            self.out["loss"] = tok.sum()
        return dz


    def _logp(self, logits):
        inv_t = 1.0 / self.opts.temperature
        if self.backend is Backend.TRITON:
            return logprob_rows_triton(logits, self.targets, inv_t, entropy=False).logp
        c = chunk_rows(logits.shape[0], logits.shape[1], self.opts, logits.device)
        return torch.cat([rows_torch(logits[s:s + c].to(torch.float32, copy=True), self.targets[s:s + c],
                                     inv_temp=inv_t)[0] for s in range(0, logits.shape[0], c)])


class _LogitsGRPOFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, run: _LogitsRun):
        ctx.dz, ctx.dtype = run(logits, ctx.needs_input_grad[0]), logits.dtype
        return run.out["loss"]

    @staticmethod
    def backward(ctx, grad_out):
        dz, ctx.dz = ctx.dz, None
        if dz is not None and not torch.equal(grad_out, torch.ones_like(grad_out)):
            dz = dz.mul_(grad_out.to(dz.dtype))
        return dz, None


def grpo_loss_from_logits(logits: torch.Tensor, targets: torch.Tensor, old_logp: torch.Tensor,
                          advantages: torch.Tensor | None = None, token_weights: torch.Tensor | None = None, *,
                          ref_logp=None, is_weights=None, seq_ids=None, rewards=None, group_ids=None,
                          options: GRPOOptions | None = None, backend: str | None = None,
                          inplace: bool = False, **knobs) -> GRPOLossOutput:
    """K2 on logits [N, V] (raw, any float dtype) for callers that hold them: one read for the
    log-sum-exp, one read + one write for d loss / d logits (computed in the forward pass).
    Same arguments and result as grpo_loss. `inplace=True` writes the gradient into `logits`
    (they are destroyed; only safe when nothing else saved them for backward, e.g. logits = h @ W.T)."""
    if Backend(backend or "torch") is Backend.REF:
        return grpo_loss_from_logits_ref(logits, targets, old_logp, advantages, token_weights, ref_logp=ref_logp,
                                         is_weights=is_weights, seq_ids=seq_ids, rewards=rewards,
                                         group_ids=group_ids, options=options, **knobs)
    opts = GRPOOptions.build(options, knobs)
    b = resolve_backend(backend, logits.device)
    advantages, fused = fused_advantage_inputs(advantages, rewards, seq_ids, group_ids, logits,
                                               b is Backend.TRITON, opts)
    t = build_token_inputs(logits.shape[0], logits.device, torch.float32, old_logp, advantages, token_weights,
                           ref_logp, is_weights, seq_ids, rewards, group_ids, opts)
    run = _LogitsRun(targets.long(), t, opts, b, fused, inplace)
    loss = _LogitsGRPOFunction.apply(logits, run)
    return make_output(loss, run.out["logp"], run.out["entropy"], t, run.out)
