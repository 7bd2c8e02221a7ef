"""Per-token GRPO math on [N] vectors: the policy term, the KL term and d loss / d logp.

This is the part of the loss that depends only on one token (or, for gspo, one sequence), which is
why the logits gradient can be formed in the forward pass: dz_t = g_t (onehot(y_t) - p_t) / tau
(+ the entropy-bonus term), with g_t = d loss / d logp_t computed here in closed form.
O(N) work; the autograd reference in grpo_loss.py checks every closed form below.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from .advantages import token_advantages
from .options import GRPOLossOutput, GRPOOptions, KLEstimator, LossType

LOG_RATIO_CLAMP = 20.0  # exp(20) ~ 5e8: keeps a stale old_logp from producing inf ratios


@dataclass
class TokenInputs:
    """Per-token tensors of one K2 call (all [N], fp32 unless noted)."""

    old_logp: torch.Tensor
    advantages: torch.Tensor
    weights: torch.Tensor  # aggregation weights w_t (0 = masked)
    ref_logp: torch.Tensor | None = None
    is_weights: torch.Tensor | None = None  # truncated IS weights, already capped, detached
    seq_ids: torch.Tensor | None = None  # [N] int64, needed for gspo
    n_seqs: int = 0

    def rows(self, s: int, e: int) -> TokenInputs:
        cut = lambda t: None if t is None else t[s:e]
        return TokenInputs(self.old_logp[s:e], self.advantages[s:e], self.weights[s:e],
                           cut(self.ref_logp), cut(self.is_weights), cut(self.seq_ids), self.n_seqs)


@dataclass
class PolicyTerms:
    pg: torch.Tensor  # [N] token policy loss (before w and IS weight)
    grad: torch.Tensor  # [N] d/d logp_t of sum_t w_t is_t pg_t
    ratio: torch.Tensor  # [N] ratio used (token ratio, or the sequence ratio for gspo)
    clipped_low: torch.Tensor  # [N] bool
    clipped_high: torch.Tensor  # [N] bool
    dual: torch.Tensor  # [N] bool: the dual clip set the loss


def _clip_objective(ratio, adv, opts: GRPOOptions):
    """pg = max(-A r, -A clip(r)); dual clip (A < 0): min(pg, -c A). `live`: d pg / d r = -A."""
    pg1 = -adv * ratio
    pg2 = -adv * ratio.clamp(1.0 - opts.eps_low, 1.0 + opts.eps_high)
    pg = torch.maximum(pg1, pg2)
    live = pg1 >= pg2  # inside the clip range pg1 == pg2 and both slopes are -A r
    dual = torch.zeros_like(live)
    if opts.dual_clip > 0:
        cap = -opts.dual_clip * adv
        dual = (adv < 0) & (pg > cap)
        pg = torch.where(dual, cap, pg)
        live = live & ~dual
    low = (adv < 0) & (ratio < 1.0 - opts.eps_low)
    high = (adv > 0) & (ratio > 1.0 + opts.eps_high)
    return pg, live, low, high, dual


def token_policy(logp: torch.Tensor, t: TokenInputs, opts: GRPOOptions) -> PolicyTerms:
    """Token-level ratio (grpo, bnpo, dr_grpo, dapo). Works on any slice of tokens."""
    log_ratio = logp - t.old_logp
    in_range = log_ratio.abs() <= LOG_RATIO_CLAMP  # clamp kills the gradient outside
    ratio = torch.exp(log_ratio.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
    pg, live, low, high, dual = _clip_objective(ratio, t.advantages, opts)
    wis = t.weights if t.is_weights is None else t.weights * t.is_weights
    grad = torch.where(live & in_range, -t.advantages * ratio, 0.0) * wis
    return PolicyTerms(pg, grad, ratio, low, high, dual)


def sequence_policy(logp: torch.Tensor, t: TokenInputs, opts: GRPOOptions) -> PolicyTerms:
    """GSPO: s_i = exp(mean over active tokens of sequence i of (logp - old)), shared by its tokens.
    Needs every token of a sequence, so K2 runs it between a log-prob pass and a gradient pass."""
    if t.seq_ids is None:
        raise ValueError("loss_type='gspo' needs seq_ids [N]")
    active = (t.weights != 0).to(logp.dtype)
    n = max(t.n_seqs, int(t.seq_ids.max()) + 1 if t.seq_ids.numel() else 0)
    zeros = torch.zeros(n, dtype=logp.dtype, device=logp.device)
    length = zeros.index_add(0, t.seq_ids, active).clamp_min(1.0)
    mean_lr = zeros.index_add(0, t.seq_ids, (logp - t.old_logp) * active) / length
    in_range = mean_lr.abs() <= LOG_RATIO_CLAMP
    s = torch.exp(mean_lr.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
    ratio = s[t.seq_ids]
    pg, live, low, high, dual = _clip_objective(ratio, t.advantages, opts)
    wis = t.weights if t.is_weights is None else t.weights * t.is_weights
    d_ratio = torch.where(live, -t.advantages, 0.0) * wis  # d (w is pg_t) / d s_i
    d_s = zeros.index_add(0, t.seq_ids, d_ratio) * torch.where(in_range, s / length, 0.0)
    grad = d_s[t.seq_ids] * active  # d s_i / d logp_t = s_i / L_i for the active tokens of i
    return PolicyTerms(pg, grad, ratio, low, high, dual)


@dataclass(frozen=True)
class PolicyLoss:
    fn: Callable[[torch.Tensor, TokenInputs, GRPOOptions], PolicyTerms]
    sequence_level: bool  # True: the gradient of a token needs its whole sequence (two phases)


POLICY_LOSSES: dict[LossType, PolicyLoss] = {
    LossType.GRPO: PolicyLoss(token_policy, False),
    LossType.BNPO: PolicyLoss(token_policy, False),
    LossType.DR_GRPO: PolicyLoss(token_policy, False),
    LossType.DAPO: PolicyLoss(token_policy, False),
    LossType.GSPO: PolicyLoss(sequence_policy, True),
}


def _k1(d):
    return d, torch.ones_like(d)


def _k2(d):
    return 0.5 * d * d, d


def _k3(d):
    x = -d  # ref - logp
    ex = torch.exp(x)
    return ex - x - 1.0, 1.0 - ex


# value and d/d logp of each estimator, as a function of d = logp - ref
KL_ESTIMATORS: dict[KLEstimator, Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]] = {
    KLEstimator.K1: _k1,
    KLEstimator.K2: _k2,
    KLEstimator.K3: _k3,
}


def loss_grad(logp: torch.Tensor, t: TokenInputs, opts: GRPOOptions) -> torch.Tensor:
    """g_t = d loss / d logp_t (policy term + KL; the entropy bonus acts on the whole softmax row
    and is handled by the row work). Token-level losses accept any slice of tokens; gspo needs all."""
    g = POLICY_LOSSES[opts.loss_type].fn(logp, t, opts).grad
    if opts.beta != 0 and t.ref_logp is not None:
        g = g + opts.beta * t.weights * KL_ESTIMATORS[opts.kl_estimator](logp - t.ref_logp)[1]
    return g


def _masked_mean(x, active, count):
    return torch.where(active, x, 0.0).sum() / count


def summarize(logp, entropy, t: TokenInputs, opts: GRPOOptions, terms: PolicyTerms | None = None) -> dict:
    """Loss value and metrics from the per-token vectors (O(N), once per call, no .item())."""
    terms = terms or POLICY_LOSSES[opts.loss_type].fn(logp, t, opts)
    w = t.weights
    isw = torch.ones_like(w) if t.is_weights is None else t.is_weights
    pg_loss = (w * isw * terms.pg).sum()
    loss = pg_loss
    active = w != 0
    count = active.sum().to(torch.float32)  # 0 -> metrics become NaN (0 / 0), by design
    nan = torch.full((), float("nan"), device=logp.device)
    kl_mean = nan
    if t.ref_logp is not None:
        kl = KL_ESTIMATORS[opts.kl_estimator](logp - t.ref_logp)[0]
        kl_mean = _masked_mean(kl, active, count)
        if opts.beta != 0:
            loss = loss + opts.beta * (w * kl).sum()
    entropy_mean = nan
    if entropy is not None:
        entropy_mean = _masked_mean(entropy, active, count)
        if opts.entropy_coef != 0:
            loss = loss - opts.entropy_coef * (w * entropy).sum()
    inf = torch.tensor(float("inf"), device=logp.device)
    r = terms.ratio
    return {
        "loss": loss, "pg_loss": pg_loss, "ratio": r,
        "clip_frac_low": _masked_mean(terms.clipped_low.float(), active, count),
        "clip_frac_high": _masked_mean(terms.clipped_high.float(), active, count),
        "clip_frac_dual": _masked_mean(terms.dual.float(), active, count),
        "kl_mean": kl_mean, "entropy_mean": entropy_mean,
        "ratio_mean": _masked_mean(r, active, count),
        "ratio_min": torch.where(count > 0, torch.where(active, r, inf).min(), nan) if r.numel() else nan,
        "ratio_max": torch.where(count > 0, torch.where(active, r, -inf).max(), nan) if r.numel() else nan,
    }


def check_rewards(rewards, seq_ids, group_ids) -> None:
    if rewards is None or seq_ids is None or group_ids is None:
        raise ValueError("pass advantages [N], or rewards [S] + seq_ids [N] + group_ids [S] for K0")


def build_token_inputs(n, device, dtype, old_logp, advantages, token_weights, ref_logp, is_weights, seq_ids,
                  rewards, group_ids, opts: GRPOOptions) -> TokenInputs:
    cast = lambda x: None if x is None else x.detach().to(device=device, dtype=dtype)
    if advantages is None:
        check_rewards(rewards, seq_ids, group_ids)
        advantages = token_advantages(rewards, seq_ids, group_ids, opts.adv_estimator, opts.adv_ddof,
                                      opts.adv_eps)
    w = torch.full((n,), 1.0 / max(n, 1)) if token_weights is None else token_weights
    isw = cast(is_weights)
    if isw is not None and opts.is_cap > 0:
        isw = isw.clamp(max=opts.is_cap)
    sid = None if seq_ids is None else seq_ids.to(device=device, dtype=torch.long)
    n_seqs = 0 if rewards is None else int(rewards.numel())
    return TokenInputs(cast(old_logp), cast(advantages), cast(w), cast(ref_logp), isw, sid, n_seqs)


def make_output(loss, logp, entropy, t: TokenInputs, m: dict) -> GRPOLossOutput:
    return GRPOLossOutput(
        loss=loss, logp=logp, entropy=None if entropy is None else entropy.detach(),
        advantages=t.advantages, ratio=m["ratio"].detach(), clip_frac_low=m["clip_frac_low"],
        clip_frac_high=m["clip_frac_high"], clip_frac_dual=m["clip_frac_dual"], kl_mean=m["kl_mean"],
        ratio_mean=m["ratio_mean"], ratio_min=m["ratio_min"], ratio_max=m["ratio_max"],
        entropy_mean=m["entropy_mean"], pg_loss=m["pg_loss"].detach())


def fused_advantage_inputs(advantages, rewards, seq_ids, group_ids, like: torch.Tensor, triton: bool,
                           opts: GRPOOptions):
    """On the Triton path with rewards instead of advantages, K0 runs inside the row kernel:
    returns (placeholder advantages [N], (rewards, group_ids, seq_ids)); otherwise (advantages, None)."""
    if advantages is not None or not triton or POLICY_LOSSES[opts.loss_type].sequence_level:
        return advantages, None
    check_rewards(rewards, seq_ids, group_ids)
    dev = like.device
    fused = (rewards.to(dev, torch.float32), group_ids.to(dev).long(), seq_ids.to(dev).long())
    return torch.zeros(like.shape[0], device=dev), fused
