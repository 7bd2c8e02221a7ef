"""K2: the GRPO training op from hidden states - loss, log-probs, metrics, dH and dW in one chunked
pass, with the logits gradient formed in the forward pass (it depends on the token only).

Per chunk of C rows: z = h_c W^T (fp32) -> row work (lse, logp, A, loss, dz in place into z) ->
dH_c = dz W, dW += dz^T h_c. 6NHV FLOPs (no logits recompute; Liger/verl/CCE/TRL-chunked pay 8NHV),
memory: one [C, V] fp32 chunk + the fp32 dW. gspo (sequence-level ratio) needs every logp of a
sequence before any gradient: a K1 pass, a per-sequence reduction, then a recomputing grad pass (8NHV).
"""

from __future__ import annotations

import dataclasses

import torch

from .chunked import LMHead, dz_with_entropy_, entropy_rows, log_softmax_rows_
from .enums import Backend
from .gemm_head import bytes_per_logit, gemm_head_chunk, gemm_logprob_stats
from .grpo_logits import grpo_loss_from_logits_ref, grpo_rows_triton, sequence_grads
from .logprobs import token_logprob_stats
from .objective import (
    POLICY_LOSSES,
    TokenInputs,
    build_token_inputs,
    fused_advantage_inputs,
    make_output,
    summarize,
    token_grads,
)
from .options import GRPOLossOutput, GRPOOptions, chunk_rows, is_one, resolve_backend


def grpo_loss_ref(hidden, weight, targets, old_logp, advantages=None, token_weights=None, *,
                  logits_dtype: torch.dtype | None = None, **kwargs) -> GRPOLossOutput:
    """Spec and the vanilla baseline (loss.impl=reference): materialised logits, autograd for every
    gradient; same signature and result as grpo_loss (the math is in grpo_loss_from_logits_ref).

    hidden [N, H], weight [V, H] -> logits [N, V]: N*V*4 bytes, and autograd keeps ~3 such tensors;
    6NHV FLOPs. Computes in fp32 (fp64 for fp64 inputs); `logits_dtype=torch.bfloat16` rounds the
    logits GEMM output to bf16 first, as a model returning bf16 logits does (the tests' "torch at the
    same precision" baseline). A `compute_dtype` option rounds hidden and weight to it (the fused
    head's operands) with the gradients passed through unrounded, as the fused op returns them.
    """
    opts = GRPOOptions.build(kwargs.pop("options", None), {k: kwargs.pop(k) for k in list(kwargs) if k in _KNOBS})
    dt = torch.promote_types(hidden.dtype, torch.float32)
    ldt = logits_dtype or dt
    if opts.compute_dtype is not None:
        hidden, weight = _rounded(hidden, opts.compute_dtype), _rounded(weight, opts.compute_dtype)
    logits = (hidden.to(ldt) @ weight.to(ldt).T).to(dt)  # [N, V]
    return grpo_loss_from_logits_ref(logits, targets, old_logp, advantages, token_weights, options=opts, **kwargs)


_KNOBS = frozenset(f.name for f in dataclasses.fields(GRPOOptions))


def _rounded(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """x's values rounded to `dtype`, in x's dtype, with the identity as its gradient."""
    if x.dtype == dtype or not x.is_floating_point():
        return x
    return x + (x.to(dtype).to(x.dtype) - x).detach()


class _Run:
    """Everything one fused K2 call needs besides hidden and weight; fills `out` in forward."""

    def __init__(self, targets, t: TokenInputs, opts: GRPOOptions, backend: Backend, fused_adv=None):
        self.targets, self.t, self.opts, self.backend, self.fused_adv = targets, t, opts, backend, fused_adv
        self.out: dict = {}
        self.dz_dtype = torch.float32

    def __call__(self, h, w, need_dh: bool, need_dw: bool):
        opts, t, n = self.opts, self.t, h.shape[0]
        lm = LMHead(w, opts.temperature, opts.compute_dtype)
        gemm = self.backend is Backend.GEMM
        per_logit = bytes_per_logit(lm, need_dh or need_dw) if gemm else 4.0
        c = chunk_rows(n, w.shape[0], opts, h.device, per_logit)
        g_all = self._sequence_grads(h, w, c) if ((need_dh or need_dw) and self._seq_level) else None
        dh = torch.empty(n, h.shape[1], dtype=torch.float32 if not lm.native else h.dtype,
                         device=h.device) if need_dh else None
        dw = torch.empty(w.shape, dtype=torch.float32, device=w.device) if need_dw else None  # 1st chunk: beta=0
        logps, ents, advs, self.token_losses = [], [], [], []
        for s in range(0, n, c):
            hs = lm.rows(h[s:s + c])
            if gemm:
                logp, ent, adv, dh_c = self._gemm_chunk(hs, s, lm, need_dh, dw, g_all)
            else:
                logp, ent, adv, dh_c = self._chunk(hs, lm.logits(hs), s, lm, need_dh, dw, g_all)
            logps.append(logp), ents.append(ent), advs.append(adv)
            if need_dh:
                dh[s:s + c] = dh_c
        if dw is not None and n == 0:
            dw.zero_()
        cat = lambda xs: None if (not xs or xs[0] is None) else torch.cat(xs)
        logp = cat(logps) if logps else h.new_zeros(0, dtype=torch.float32)
        if self.fused_adv is not None and advs and advs[0] is not None:
            t.advantages = torch.cat(advs)  # computed in-kernel (K0 fused into the row pass)
        self.out = summarize(logp, cat(ents), t, opts) | {"logp": logp, "entropy": cat(ents)}
        if self.token_losses and not self._seq_level:  # Triton: the loss comes from the same pass
            self.out["loss"] = torch.cat(self.token_losses).sum()
        return dh, dw

    @property
    def _seq_level(self) -> bool:
        return POLICY_LOSSES[self.opts.type].sequence_level

    def _sequence_grads(self, h, w, c):
        """gspo phase 1: all log-probs (K1), then d loss / d logp_t (and d / d H_t) from whole sequences."""
        opts = self.opts
        st = token_logprob_stats(h, w, self.targets, opts.temperature, entropy=opts.entropy_coef != 0,
                                 chunk_tokens=c, backend=self.backend, compute_dtype=opts.compute_dtype)
        return sequence_grads(st.logp, st.entropy, self.t, opts)

    def _chunk(self, hs, z, s, lm: LMHead, need_dh, dw, g_all):
        """One chunk: z [C, V] fp32 -> (logp, entropy, in-kernel advantages, dH_c); dw += dW_c."""
        opts, e = self.opts, s + hs.shape[0]
        t, y = self.t.rows(s, e), self.targets[s:e]
        need_grad = need_dh or dw is not None
        given = None if g_all is None else tuple(None if g is None else g[s:e] for g in g_all)
        if self.backend is Backend.TRITON:
            g_given = None if given is None else given[0]
            logp, ent, adv, dz, tok = grpo_rows_triton(z, y, t, opts, inv_temp=lm.inv_temp,
                                                     need_grad=need_grad, g_given=g_given, row0=s,
                                                     fused_adv=self.fused_adv, dz_dtype=self.dz_dtype)
            self.token_losses.append(tok)  # w_t l_t from the row kernel itself
            return logp, ent, adv, self._dz_gemms(lm, dz, hs, need_dh, dw, s == 0)
        logp, lse = log_softmax_rows_(z, y, lm.inv_temp)  # z := log-probs
        if not need_grad:
            return logp, entropy_rows(z) if opts.need_entropy else None, None, None
        if opts.entropy_coef != 0:  # the bonus needs p log p per logit: form dz explicitly
            ent = entropy_rows(z)
            g, g_ent = given if given is not None else token_grads(logp, t, opts, ent)
            dz = dz_with_entropy_(z, y, g, ent, -g_ent)
            if lm.inv_temp != 1.0:  # d/d(raw z) = d/d(z / tau) / tau
                dz.mul_(lm.inv_temp)
            return logp, ent, None, self._dz_gemms(lm, lm.grad_dtype(dz), hs, need_dh, dw, s == 0)
        g = given[0] if given is not None else token_grads(logp, t, opts)[0]
        p = z.exp_()  # z := softmax; dz = g (onehot - p) is never formed (chunked.py module doc)
        p.scatter_(1, y[:, None], 0.0)
        m = lm.probs_w(p) if (need_dh or opts.need_entropy) else None
        ent = None
        if opts.need_entropy:  # H = lse - sum_j p_j z_j / tau
            zy = logp + lse
            ent = lse - torch.linalg.vecdot(hs.to(torch.float32), m) * lm.inv_temp - torch.exp(logp) * zy
        q = -torch.expm1(logp)
        return logp, ent, None, lm.grads_from_probs(p, m, q, g, hs, y, dw, need_dh, first=s == 0)

    def _gemm_chunk(self, hs, s, lm: LMHead, need_dh, dw, g_all):
        """One chunk on the GEMM head (gemm_head.py): the logits never leave the GEMM's tiles."""
        e = s + hs.shape[0]
        t, y = self.t.rows(s, e), self.targets[s:e]
        ent_or_none = lambda ent: ent if self.opts.need_entropy else None
        if not (need_dh or dw is not None):
            logp, _, ent = gemm_logprob_stats(lm, hs, y)
            return logp, ent_or_none(ent), None, None
        given = None if g_all is None else g_all[0][s:e]
        grads_of = lambda logp, ent: given if given is not None else token_grads(logp, t, self.opts)[0]
        logp, ent, dh = gemm_head_chunk(lm, hs, y, grads_of, need_dh=need_dh, dw=dw, first=s == 0)
        return logp, ent_or_none(ent), None, dh

    @staticmethod
    def _dz_gemms(lm: LMHead, dz, hs, need_dh, dw, first):
        if dw is not None:
            lm.grad_weight_(dw, dz, hs, first=first)
        return lm.grad_hidden(dz) if need_dh else None


class _FusedGRPOFunction(torch.autograd.Function):
    """The gradient is computed in forward; backward only scales it by grad_output."""

    @staticmethod
    def forward(ctx, hidden, weight, run: _Run):
        need_dw = ctx.needs_input_grad[1] and run.opts.compute_weight_grad
        # triton: dz in the GEMM operand dtype, in place in the fp32 chunk; fp64 inputs compute in fp32
        # (LMHead), so their dz is fp32 too (an fp64 dz cannot live in an fp32 row)
        run.dz_dtype = run.opts.compute_dtype or min(hidden.dtype, torch.float32, key=lambda d: d.itemsize)
        dh, dw = run(hidden, weight, ctx.needs_input_grad[0], need_dw)
        # kept as attributes, not saved tensors, so backward can hand them over without a copy
        ctx.grads, ctx.dtypes = [dh, dw], (hidden.dtype, weight.dtype)
        return run.out["loss"]

    @staticmethod
    def backward(ctx, grad_out):
        dh, dw = ctx.grads
        ctx.grads = [None, None]
        one = is_one(grad_out)
        out = []
        for g, dt in zip((dh, dw), ctx.dtypes):
            if g is not None and not one:
                g = g.mul_(grad_out.to(g.dtype))
            out.append(None if g is None else g.to(dt))
        return out[0], out[1], None


def grpo_loss(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, old_logp: torch.Tensor,
              advantages: torch.Tensor | None = None, token_weights: torch.Tensor | None = None, *,
              ref_logp: torch.Tensor | None = None, is_weights: torch.Tensor | None = None,
              seq_ids: torch.Tensor | None = None, rewards: torch.Tensor | None = None,
              group_ids: torch.Tensor | None = None, sampler_logp: torch.Tensor | None = None,
              num_seqs: int | None = None, options: GRPOOptions | None = None,
              backend: str | None = None, **knobs) -> GRPOLossOutput:
    """K2: fused GRPO loss from hidden states. Returns a GRPOLossOutput (.loss differentiable).

    hidden [N, H] (packed completion tokens), weight [V, H] (lm_head.weight; tied embeddings work),
    targets [N], old_logp [N], advantages [N] - or rewards [S] + seq_ids [N] + group_ids [S] for K0
    inside the op (in-kernel on the Triton path; the estimator from `advantage`) -, token_weights [N]
    (the aggregation: loss = sum_t w_t l_t; None = 1/N), ref_logp [N] (for beta and the kl metric),
    is_weights [N] (a method's weights on the policy term, detached, used as given), sampler_logp [N]
    (the sampler's log-probs: with is_cap > 0 the mismatch correction of is_mode multiplies in,
    kernels/mismatch.py), seq_ids [N] (needed for gspo and the sequence modes; num_seqs, how many
    sequences they index, spares a read of max(seq_ids) from the device). Options: `options=GRPOOptions.of(cfg.loss, ...)`, or its fields as
    keyword arguments (type="clip" | "gspo" | "cispo" | "sapo", eps_low=0.2, eps_high=0.28,
    temperature=1.0, beta=0.0, kl_estimator="k3", dual_clip=0.0, entropy_coef=0.0, chunk_tokens,
    memory_budget_mb, compute_weight_grad, compute_dtype, ...).
    backend: None (CUDA -> triton, CPU -> torch), "triton", "gemm" (the GEMM head: kernels/gemm_head.py;
    the row kernels with the entropy bonus), "torch" or "reference".
    """
    if Backend(backend or "torch") is Backend.REFERENCE:
        return grpo_loss_ref(hidden, weight, targets, old_logp, advantages, token_weights, ref_logp=ref_logp,
                             is_weights=is_weights, seq_ids=seq_ids, rewards=rewards, group_ids=group_ids,
                             sampler_logp=sampler_logp, num_seqs=num_seqs, options=options, **knobs)
    opts = GRPOOptions.build(options, knobs)
    b = resolve_backend(backend, hidden.device)
    if b is Backend.GEMM and opts.entropy_coef != 0:
        b = Backend.TRITON  # the entropy bonus's logits gradient is not a row scale of P': the row kernels
    advantages, fused = fused_advantage_inputs(advantages, rewards, seq_ids, group_ids, hidden,
                                               b is Backend.TRITON, opts)
    t = build_token_inputs(hidden.shape[0], hidden.device, torch.float32, old_logp, advantages, token_weights,
                           ref_logp, is_weights, seq_ids, rewards, group_ids, opts, sampler_logp, num_seqs)
    run = _Run(targets.long(), t, opts, b, fused)
    loss = _FusedGRPOFunction.apply(hidden, weight, run)
    return make_output(loss, run.out["logp"], run.out["entropy"], t, run.out)
