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
from .enums import AdvEstimator, Backend, KLEstimator, LossType
from .logprobs import logprob_rows_triton
from .objective import (
    POLICY_LOSSES,
    TokenInputs,
    build_token_inputs,
    fused_advantage_inputs,
    make_output,
    summarize,
    token_grads,
    token_objective,
)
from .options import GRPOLossOutput, GRPOOptions, chunk_rows, is_one, launch_device, resolve_backend, row_grid

# constexpr codes of the row kernel (triton_rows.py); gspo runs the clip code on a given g
_KL_CODE = {KLEstimator.K1: 1, KLEstimator.K2: 2, KLEstimator.K3: 3}
_ADV_CODE = {AdvEstimator.GRPO: 0, AdvEstimator.DR_GRPO: 1, AdvEstimator.BATCH: 2, AdvEstimator.RLOO: 3}
_LOSS_CODE = {LossType.CLIP: 0, LossType.GSPO: 0, LossType.CISPO: 1, LossType.SAPO: 2}


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
        if dz_dtype.itemsize > z.dtype.itemsize:
            raise ValueError(f"grpo_rows_triton: a {dz_dtype} gradient cannot be written in place into {z.dtype} "
                             "logits; pass dz_out, or a dz_dtype no wider than the logits'")
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

    with launch_device(z.device):
        _grpo_rows_kernel[row_grid(c, z.device)](
            z, z.stride(0), dz if dz is not None else z, (dz if dz is not None else z).stride(0), y,
            t.old_logp, t.advantages, t.weights, t.ref_logp if kl else dummy,
            t.is_weights if t.is_weights is not None else dummy, g_given if g_given is not None else dummy,
            rew, gid, sid, n_s, logp, ent, adv_out, loss, c, v, inv_temp, opts.eps_low, opts.eps_high,
            opts.dual_clip, opts.cispo_cap, opts.sapo_tau_pos, opts.sapo_tau_neg, opts.beta,
            opts.entropy_coef, opts.advantage.eps, float(opts.advantage.std_ddof),
            BLOCK_V=bv, BLOCK_S=max(16, 1 << max(n_s - 1, 0).bit_length()), KL=kl,
            LOSS=_LOSS_CODE[opts.type], HAS_IS=t.is_weights is not None, G_GIVEN=g_given is not None,
            FUSED_ADV=fused_adv is not None, ADV_EST=_ADV_CODE[opts.advantage.estimator], NEED_GRAD=bool(need_grad),
            WITH_ENTROPY=with_ent, ENT_GRAD=opts.entropy_coef != 0,
            BARRIER=bool(need_grad and z.is_cuda and dz_out is None), num_warps=8 if z.is_cuda else 1)
    return (logp, ent if with_ent else None, adv_out if fused_adv is not None else None,
            dz if need_grad else None, loss)


def grpo_loss_from_logits_ref(logits, targets, old_logp, advantages=None, token_weights=None, *,
                              ref_logp=None, is_weights=None, seq_ids=None, rewards=None, group_ids=None,
                              sampler_logp=None, num_seqs=None, options: GRPOOptions | None = None, backend=None,
                              **knobs) -> GRPOLossOutput:
    """Spec of K2 on logits [N, V] (raw, before the temperature): log-probs and entropies from the
    materialised softmax, the loss from objective.token_objective, autograd for every gradient.

        logp_t = log_softmax(z_t / tau)[y_t],   H_t = -sum_j p_tj log p_tj
        loss   = sum_t w_t (is_t pg_t + beta kl_t - entropy_coef H_t)   (pg, kl: objective.py)
    Bytes: the logits plus ~2 [N, V] autograd buffers. Computes in fp32 (fp64 for fp64 logits).
    """
    opts = GRPOOptions.build(options, knobs)
    dt = torch.promote_types(logits.dtype, torch.float32)
    t = build_token_inputs(logits.shape[0], logits.device, dt, old_logp, advantages, token_weights, ref_logp,
                           is_weights, seq_ids, rewards, group_ids, opts, sampler_logp, num_seqs)
    logprobs = torch.log_softmax(logits.to(dt) / opts.temperature, dim=-1)
    logp = logprobs.gather(-1, targets[:, None].long()).squeeze(-1)
    with torch.set_grad_enabled(torch.is_grad_enabled() and opts.entropy_coef != 0):
        entropy = -(logprobs.exp() * logprobs).sum(-1) if opts.need_entropy else None
    loss = token_objective(logp, t, opts, entropy).loss
    m = summarize(logp, entropy, t, opts)
    return make_output(loss, logp.detach(), entropy, t, m)


def _rows_torch_grad(z, y, grads, t: TokenInputs, opts: GRPOOptions, need_entropy: bool):
    """Chunked-torch row work on fp32 logits z [C, V] (overwritten by dz = d loss / d z). `grads`:
    (d loss / d logp, d loss / d H) when given (gspo: from whole sequences), else from the spec."""
    logp, _ = log_softmax_rows_(z, y, 1.0 / opts.temperature)  # z := log-probs
    ent = entropy_rows(z) if (need_entropy or opts.entropy_coef != 0) else None
    g, g_ent = grads if grads is not None else token_grads(logp, t, opts, ent)
    if g_ent is not None:  # the entropy bonus acts on the whole row
        dz_with_entropy_(z, y, g, ent, -g_ent)
    else:
        z.exp_().mul_(g[:, None].neg()).scatter_add_(1, y[:, None], g[:, None])
    return logp, ent, z.mul_(1.0 / opts.temperature) if opts.temperature != 1.0 else z


def sequence_grads(logp, entropy, t: TokenInputs, opts: GRPOOptions):
    """gspo's middle phase: (d loss / d logp, d loss / d H) from every token's log-prob at once."""
    return token_grads(logp, t, opts, entropy if opts.entropy_coef != 0 else None)


class _LogitsRun:
    def __init__(self, targets, t, opts, backend, fused_adv, inplace):
        self.targets, self.t, self.opts, self.backend = targets, t, opts, backend
        self.fused_adv, self.inplace, self.out = fused_adv, inplace, {}

    def __call__(self, logits, need_grad: bool):
        opts, t, y = self.opts, self.t, self.targets
        g_all = None
        if need_grad and POLICY_LOSSES[opts.type].sequence_level:  # gspo: all logp first
            g_all = sequence_grads(*self._logp(logits), t, opts)
        dz = (logits if self.inplace else torch.empty_like(logits)) if need_grad else None
        if self.backend is Backend.TRITON:
            logp, ent, adv, _, tok = grpo_rows_triton(logits, y, t, opts, inv_temp=1.0 / opts.temperature,
                                                      need_grad=need_grad, g_given=None if g_all is None else g_all[0],
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
                given = None if g_all is None else tuple(None if g is None else g[s:s + c] for g in g_all)
                lp, en, dzc = _rows_torch_grad(z, y[s:s + c], given, tc, opts, opts.need_entropy)
                if dzc.data_ptr() != dz[s:s + c].data_ptr():
                    dz[s:s + c] = dzc
                parts.append((lp, en))
            logp = torch.cat([p[0] for p in parts])
            ent = torch.cat([p[1] for p in parts]) if parts and parts[0][1] is not None else None
        self.out = summarize(logp, ent, t, opts) | {"logp": logp, "entropy": ent}
        if self.backend is Backend.TRITON and not POLICY_LOSSES[opts.type].sequence_level:  # same pass
            self.out["loss"] = tok.sum()
        return dz

    def _logp(self, logits):
        """(logp [N], entropy [N] when the entropy bonus is on) without touching `logits`."""
        inv_t, ent = 1.0 / self.opts.temperature, self.opts.entropy_coef != 0
        if self.backend is Backend.TRITON:
            st = logprob_rows_triton(logits, self.targets, inv_t, entropy=ent)
            return st.logp, st.entropy
        c = chunk_rows(logits.shape[0], logits.shape[1], self.opts, logits.device)
        parts = [rows_torch(logits[s:s + c].to(torch.float32, copy=True), self.targets[s:s + c], inv_temp=inv_t,
                            entropy=ent) for s in range(0, logits.shape[0], c)]
        return torch.cat([p[0] for p in parts]), torch.cat([p[2] for p in parts]) if ent else None


class _LogitsGRPOFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, run: _LogitsRun):
        ctx.dz, ctx.dtype = run(logits, ctx.needs_input_grad[0]), logits.dtype
        return run.out["loss"]

    @staticmethod
    def backward(ctx, grad_out):
        dz, ctx.dz = ctx.dz, None
        if dz is not None and not is_one(grad_out):
            dz = dz.mul_(grad_out.to(dz.dtype))
        return dz, None


def grpo_loss_from_logits(logits: torch.Tensor, targets: torch.Tensor, old_logp: torch.Tensor,
                          advantages: torch.Tensor | None = None, token_weights: torch.Tensor | None = None, *,
                          ref_logp=None, is_weights=None, seq_ids=None, rewards=None, group_ids=None,
                          sampler_logp=None, num_seqs=None, options: GRPOOptions | None = None,
                          backend: str | None = None, inplace: bool = False, **knobs) -> GRPOLossOutput:
    """K2 on logits [N, V] (raw, any float dtype) for callers that hold them: one read for the
    log-sum-exp, one read + one write for d loss / d logits (computed in the forward pass).
    Same arguments and result as grpo_loss. `inplace=True` writes the gradient into `logits`
    (they are destroyed; only safe when nothing else saved them for backward, e.g. logits = h @ W.T)."""
    if Backend(backend or "torch") is Backend.REFERENCE:
        return grpo_loss_from_logits_ref(logits, targets, old_logp, advantages, token_weights, ref_logp=ref_logp,
                                         is_weights=is_weights, seq_ids=seq_ids, rewards=rewards,
                                         group_ids=group_ids, sampler_logp=sampler_logp, num_seqs=num_seqs,
                                         options=options, **knobs)
    opts = GRPOOptions.build(options, knobs)
    b = resolve_backend(backend, logits.device)
    if b is Backend.GEMM:  # the logits are given: no head GEMM to fuse into
        b = Backend.TRITON
    advantages, fused = fused_advantage_inputs(advantages, rewards, seq_ids, group_ids, logits,
                                               b is Backend.TRITON, opts)
    t = build_token_inputs(logits.shape[0], logits.device, torch.float32, old_logp, advantages, token_weights,
                           ref_logp, is_weights, seq_ids, rewards, group_ids, opts, sampler_logp, num_seqs)
    run = _LogitsRun(targets.long(), t, opts, b, fused, inplace)
    loss = _LogitsGRPOFunction.apply(logits, run)
    return make_output(loss, run.out["logp"], run.out["entropy"], t, run.out)
