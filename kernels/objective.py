"""The GRPO objective per token, in plain torch: the specification (docs/kernels.md, "The objective").

`token_objective` is the one expression of the per-token math in the project: the ratio and its
clamp, the policy term (a registry: clip with eps_low/eps_high and the dual clip, gspo's sequence
ratio, cispo, sapo), the IS weight, the KL estimators and the entropy bonus. Every path
computes its loss from it:
- the references (`grpo_loss_ref`, `grpo_loss_from_logits_ref`, `loss.impl=reference`) on
  log-probs from materialised logits, with autograd all the way;
- the chunked torch path on each chunk's log-probs: `token_grads` takes g_t = d loss / d logp_t
  (and d loss / d H_t) from autograd on the [C] vectors, and the row work turns them into the
  logits gradient, dz_t = g_t (onehot(y_t) - p_t) / tau, inside the forward pass.
The Triton row kernel (triton_rows.py) is the only other expression of this math; its tests
compare it with this function.

KL: k3 is exp(x) - x - 1 with x = ref - logp, as TRL and Liger write it, with no clamp on the value.
verl clamps it to +-10, which zeroes the penalty's gradient on exactly the tokens where the policy
has moved furthest from the reference; here x itself is clamped to +-20 (as the log-ratio is), which
only keeps the value finite in fp32 (exp(20) = 5e8).

Shape letters: N tokens, S sequences. O(N) work everywhere.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from .advantages import token_advantages
from .enums import KLEstimator, LossType
from .mismatch import LOG_RATIO_CLAMP, mismatch_weights
from .options import GRPOLossOutput, GRPOOptions


@dataclass
class TokenInputs:
    """Per-token tensors of one call (all [N], fp32 unless noted)."""

    old_logp: torch.Tensor
    advantages: torch.Tensor
    weights: torch.Tensor  # aggregation weights w_t (0 = not in the loss)
    ref_logp: torch.Tensor | None = None
    is_weights: torch.Tensor | None = None  # weights on the policy term, mismatch correction included
    seq_ids: torch.Tensor | None = None  # [N] int64, needed for gspo
    n_seqs: int = 0
    mismatch: torch.Tensor | None = None  # the mismatch correction's part of is_weights (for metrics)

    def rows(self, s: int, e: int) -> TokenInputs:
        cut = lambda t: None if t is None else t[s:e]
        return TokenInputs(self.old_logp[s:e], self.advantages[s:e], self.weights[s:e],
                           cut(self.ref_logp), cut(self.is_weights), cut(self.seq_ids), self.n_seqs,
                           cut(self.mismatch))


@dataclass
class TokenTerms:
    """The objective's parts for N tokens; `loss` is differentiable where logp (and entropy) are."""

    loss: torch.Tensor  # [] sum_t w_t (is_t pg_t + beta kl_t - entropy_coef H_t)
    pg_loss: torch.Tensor  # [] sum_t w_t is_t pg_t
    ratio: torch.Tensor  # [N] the ratio the policy term used (per token, or per sequence for gspo)
    kl: torch.Tensor | None  # [N] KL estimate when ref_logp is given
    clipped_low: torch.Tensor  # [N] bool: the lower clip removed this token's gradient
    clipped_high: torch.Tensor  # [N] bool: the upper clip (cispo: the ratio cap) did
    dual: torch.Tensor  # [N] bool: the dual clip set the loss


# ---------------------------------------------------------------- policy terms (registry)
# (ratio [N], logp [N], advantages [N], options) -> (pg [N], clipped_low, clipped_high, dual)

def _clip(ratio, logp, adv, opts: GRPOOptions):
    """PPO's clipped surrogate: max(-A r, -A clip(r, 1 - eps_low, 1 + eps_high)); with the dual
    clip c (A < 0), min(that, -c A)."""
    pg = torch.maximum(-adv * ratio, -adv * ratio.clamp(1.0 - opts.eps_low, 1.0 + opts.eps_high))
    dual = torch.zeros_like(pg, dtype=torch.bool)
    if opts.dual_clip > 0:
        cap = -opts.dual_clip * adv
        dual = (adv < 0) & (pg > cap)
        pg = torch.where(dual, cap, pg)
    low = (adv < 0) & (ratio < 1.0 - opts.eps_low)
    high = (adv > 0) & (ratio > 1.0 + opts.eps_high)
    return pg, low, high, dual


def _cispo(ratio, logp, adv, opts: GRPOOptions):
    """-sg(min(r, cispo_cap)) A logp: every token keeps a gradient, its weight capped from above."""
    none = torch.zeros_like(ratio, dtype=torch.bool)
    return -ratio.clamp(max=opts.cispo_cap).detach() * adv * logp, none, ratio > opts.cispo_cap, none


def _sapo(ratio, logp, adv, opts: GRPOOptions):
    """-(4 / tau) sigmoid(tau (r - 1)) A, tau = sapo_tau_pos for A > 0, else sapo_tau_neg: the gate's
    slope at r = 1 is 1, as the clipped surrogate's, and it fades smoothly away from r = 1."""
    tau = torch.full_like(ratio, opts.sapo_tau_neg).masked_fill(adv > 0, opts.sapo_tau_pos)
    none = torch.zeros_like(ratio, dtype=torch.bool)
    return -torch.sigmoid(tau * (ratio - 1.0)) * (4.0 / tau) * adv, none, none, none


@dataclass(frozen=True)
class PolicyLoss:
    fn: Callable
    sequence_level: bool  # the ratio is per sequence: a token's gradient needs its whole sequence


POLICY_LOSSES: dict[LossType, PolicyLoss] = {
    LossType.CLIP: PolicyLoss(_clip, False),
    LossType.GSPO: PolicyLoss(_clip, True),
    LossType.CISPO: PolicyLoss(_cispo, False),
    LossType.SAPO: PolicyLoss(_sapo, False),
}


def _k3(logp, ref):
    x = (ref - logp).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    return torch.exp(x) - x - 1.0


KL_ESTIMATORS: dict[KLEstimator, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    KLEstimator.K1: lambda logp, ref: logp - ref,
    KLEstimator.K2: lambda logp, ref: 0.5 * (logp - ref) ** 2,
    KLEstimator.K3: _k3,
}


def _log_ratio(logp: torch.Tensor, t: TokenInputs, sequence_level: bool) -> torch.Tensor:
    """logp - old per token; for gspo, the mean over each sequence's tokens in the loss."""
    lr = logp - t.old_logp
    if not sequence_level:
        return lr
    if t.seq_ids is None:
        raise ValueError("type='gspo' needs seq_ids [N]")
    active = (t.weights != 0).to(lr.dtype)
    n = t.n_seqs or (int(t.seq_ids.max()) + 1 if t.seq_ids.numel() else 0)
    zeros = torch.zeros(n, dtype=lr.dtype, device=lr.device)
    length = zeros.index_add(0, t.seq_ids, active).clamp_min(1.0)
    return (zeros.index_add(0, t.seq_ids, lr * active) / length)[t.seq_ids]


def token_objective(logp: torch.Tensor, t: TokenInputs, opts: GRPOOptions,
                    entropy: torch.Tensor | None = None) -> TokenTerms:
    """The specification: sum_t w_t (is_t pg_t + beta kl_t - entropy_coef H_t) and its parts.

    logp [N] (the policy's log-prob of each target at the temperature), entropy [N] (needed when
    entropy_coef != 0). Differentiable in both, so autograd gives every gradient."""
    policy = POLICY_LOSSES[opts.type]
    ratio = torch.exp(_log_ratio(logp, t, policy.sequence_level).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
    pg, low, high, dual = policy.fn(ratio, logp, t.advantages, opts)
    if t.is_weights is not None:
        pg = pg * t.is_weights
    per_token = pg
    kl = None
    if t.ref_logp is not None:
        kl = KL_ESTIMATORS[opts.kl_estimator](logp, t.ref_logp)
        if opts.beta != 0:
            per_token = per_token + opts.beta * kl
    elif opts.beta != 0:
        raise ValueError("beta != 0 needs ref_logp [N]")
    if opts.entropy_coef != 0:
        if entropy is None:
            raise ValueError("entropy_coef != 0 needs the entropy [N]")
        per_token = per_token - opts.entropy_coef * entropy
    w = t.weights
    return TokenTerms(loss=(w * per_token).sum(), pg_loss=(w * pg).sum(), ratio=ratio, kl=kl,
                      clipped_low=low, clipped_high=high, dual=dual)


def token_grads(logp: torch.Tensor, t: TokenInputs, opts: GRPOOptions,
                entropy: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(d loss / d logp [N], d loss / d H [N] or None) of `token_objective`, by autograd on the
    token vectors alone: O(N), whatever the vocabulary. Token-level losses accept any slice of
    tokens; gspo needs every token of each sequence it touches."""
    with torch.enable_grad():
        lp = logp.detach().requires_grad_(True)
        ent = None
        if entropy is not None:
            ent = entropy.detach().requires_grad_(opts.entropy_coef != 0)
        inputs = [lp] + ([ent] if ent is not None and ent.requires_grad else [])
        grads = torch.autograd.grad(token_objective(lp, t, opts, ent).loss, inputs, allow_unused=True)
    grads = [torch.zeros_like(x) if g is None else g for g, x in zip(grads, inputs)]
    return grads[0], grads[1] if len(grads) > 1 else None


# ---------------------------------------------------------------- metrics and results

def _masked_mean(x, active, count):
    return torch.where(active, x, 0.0).sum() / count


def summarize(logp, entropy, t: TokenInputs, opts: GRPOOptions) -> dict:
    """Loss value and metrics from the per-token vectors (O(N), once per call, no .item()).
    Metrics are means over the tokens in the loss (w != 0); NaN when there is none."""
    with torch.no_grad():
        terms = token_objective(logp.detach(), t, opts, None if entropy is None else entropy.detach())
    active = t.weights != 0
    count = active.sum().to(torch.float32)  # 0 -> metrics become NaN (0 / 0), by design
    nan = torch.full((), float("nan"), device=logp.device)
    inf = torch.tensor(float("inf"), device=logp.device)
    r = terms.ratio
    some = r.numel() > 0
    return {
        "loss": terms.loss, "pg_loss": terms.pg_loss, "ratio": r,
        "clip_frac_low": _masked_mean(terms.clipped_low.float(), active, count),
        "clip_frac_high": _masked_mean(terms.clipped_high.float(), active, count),
        "clip_frac_dual": _masked_mean(terms.dual.float(), active, count),
        "kl_mean": _masked_mean(terms.kl, active, count) if terms.kl is not None else nan,
        "entropy_mean": _masked_mean(entropy, active, count) if entropy is not None else nan,
        "ratio_mean": _masked_mean(r, active, count),
        "ratio_min": torch.where(count > 0, torch.where(active, r, inf).min(), nan) if some else nan,
        "ratio_max": torch.where(count > 0, torch.where(active, r, -inf).max(), nan) if some else nan,
        "is_weight_mean": _masked_mean(t.mismatch, active, count) if t.mismatch is not None else nan,
        "is_masked_frac": _masked_mean((t.mismatch == 0).float(), active, count) if t.mismatch is not None else nan,
    }


def check_rewards(rewards, seq_ids, group_ids) -> None:
    if rewards is None or seq_ids is None or group_ids is None:
        raise ValueError("pass advantages [N], or rewards [S] + seq_ids [N] + group_ids [S] for K0")


def build_token_inputs(n, device, dtype, old_logp, advantages, token_weights, ref_logp, is_weights, seq_ids,
                       rewards, group_ids, opts: GRPOOptions, sampler_logp=None, num_seqs=None) -> TokenInputs:
    """The call's per-token inputs. With sampler_logp [N] and is_cap > 0 the mismatch correction
    (kernels/mismatch.py, opts.is_mode) joins is_weights: the same weights on every loss path.
    num_seqs: how many sequences seq_ids index (the rewards' count when they are given); without it a
    sequence-level term reads max(seq_ids) back from the device."""
    cast = lambda x: None if x is None else x.detach().to(device=device, dtype=dtype)
    if advantages is None:
        check_rewards(rewards, seq_ids, group_ids)
        advantages = token_advantages(rewards, seq_ids, group_ids, opts.advantage.estimator, opts.advantage.std_ddof,
                                      opts.advantage.eps)
    w = torch.full((n,), 1.0 / max(n, 1)) if token_weights is None else token_weights
    sid = None if seq_ids is None else seq_ids.to(device=device, dtype=torch.long)
    n_seqs = int(rewards.numel()) if rewards is not None else (num_seqs or 0)
    old, is_w, mismatch = cast(old_logp), cast(is_weights), None
    if sampler_logp is not None and opts.is_cap > 0:
        mismatch = mismatch_weights(old, cast(sampler_logp), opts.is_mode, opts.is_cap, opts.is_floor, sid,
                                    n_seqs or None)
        is_w = mismatch if is_w is None else is_w * mismatch
    return TokenInputs(old, cast(advantages), cast(w), cast(ref_logp), is_w, sid, n_seqs, mismatch)


def make_output(loss, logp, entropy, t: TokenInputs, m: dict) -> GRPOLossOutput:
    return GRPOLossOutput(
        loss=loss, logp=logp, entropy=None if entropy is None else entropy.detach(),
        advantages=t.advantages, ratio=m["ratio"].detach(), clip_frac_low=m["clip_frac_low"],
        clip_frac_high=m["clip_frac_high"], clip_frac_dual=m["clip_frac_dual"], kl_mean=m["kl_mean"],
        ratio_mean=m["ratio_mean"], ratio_min=m["ratio_min"], ratio_max=m["ratio_max"],
        entropy_mean=m["entropy_mean"], pg_loss=m["pg_loss"].detach(), is_weight_mean=m["is_weight_mean"],
        is_masked_frac=m["is_masked_frac"])


def fused_advantage_inputs(advantages, rewards, seq_ids, group_ids, like: torch.Tensor, triton: bool,
                           opts: GRPOOptions):
    """On the Triton path with rewards instead of advantages, K0 runs inside the row kernel:
    returns (placeholder advantages [N], (rewards, group_ids, seq_ids)); otherwise (advantages, None)."""
    if advantages is not None or not triton or POLICY_LOSSES[opts.type].sequence_level:
        return advantages, None
    check_rewards(rewards, seq_ids, group_ids)
    dev = like.device
    fused = (rewards.to(dev, torch.float32), group_ids.to(dev).long(), seq_ids.to(dev).long())
    return torch.zeros(like.shape[0], device=dev), fused
