"""The update's metrics: token-weighted sums per micro-batch, added up over micro-batches and ranks,
divided once at the end. Everything stays a device tensor until the trainer reads the row, so nothing
here waits for the device inside the micro-batch loop."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from mentor_fast.dist import Dist

# (loss output field, metric name); entries whose condition is off for the run are left out
_KERNEL_MEANS = [("clip_frac_low", "clip_frac_low"), ("clip_frac_high", "clip_frac_high"),
                 ("ratio_mean", "ratio_mean"), ("entropy_mean", "entropy"), ("kl_mean", "kl"),
                 ("is_weight_mean", "is/weight_mean"), ("is_masked_frac", "is/masked_frac")]


@dataclass
class UpdateTotals:
    """What the optimizer steps of one update add up: the policy loss's token-weighted sums, the
    extra terms' (sum, count) and each step's grad norm."""

    sums: dict[str, torch.Tensor] = field(default_factory=dict)
    terms: dict[str, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)
    grad_norms: list[torch.Tensor] = field(default_factory=list)

    def add_micro(self, metrics: dict[str, torch.Tensor]) -> None:
        add_sums(self.sums, metrics)

    def add_terms(self, terms: dict[str, tuple[torch.Tensor, torch.Tensor]]) -> None:
        add_term_sums(self.terms, terms)


def micro_metrics(out, w: torch.Tensor, sampler: torch.Tensor, *, with_ref: bool,
                  corrects: bool) -> dict[str, torch.Tensor]:
    """Token-weighted sums of the kernels' means (means over active tokens, NaN for none). Which
    metrics exist is known without looking at a value. corrects: the mismatch correction is on."""
    active = (w != 0).float()
    tokens = active.sum()
    m = {"tokens": tokens, "loss": out.loss.detach()}
    computed = {"kl_mean": with_ref, "entropy_mean": out.entropy is not None,
                "is_weight_mean": corrects, "is_masked_frac": corrects}
    for name, key in _KERNEL_MEANS:
        if computed.get(name, True):
            m[key] = torch.nan_to_num(getattr(out, name), nan=0.0) * tokens
    if "clip_frac_low" in m:
        m["clip_frac"] = m["clip_frac_low"] + m["clip_frac_high"]
    m["ratio_max"] = out.ratio_max
    m["rollout/logp_mismatch"] = ((out.logp - sampler).abs() * active).sum()
    return m


def add_sums(sums: dict[str, torch.Tensor], metrics: dict[str, torch.Tensor]) -> None:
    """Token-weighted sums add up across micro-batches; `*_max` entries keep the maximum."""
    for k, v in metrics.items():
        if k not in sums:
            sums[k] = v
        elif k.endswith("_max"):
            sums[k] = torch.maximum(sums[k], v)
        else:
            sums[k] = sums[k] + v


def add_term_sums(terms: dict[str, tuple[torch.Tensor, torch.Tensor]],
                  new: dict[str, tuple[torch.Tensor, torch.Tensor]]) -> None:
    for name, (s, c) in new.items():
        prev = terms.get(name)
        terms[name] = (s, c) if prev is None else (prev[0] + s, prev[1] + c)


def reduce_sums(dist: Dist, sums: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Token-weighted sums add up over ranks; `*_max` entries take the maximum."""
    if not dist.enabled:
        return sums
    merged: dict[str, torch.Tensor] = {}
    for part in dist.gather({k: v.detach().double().cpu() for k, v in sums.items()}):
        add_sums(merged, part)
    return {k: v.float() for k, v in merged.items()}


def reduce_terms(dist: Dist, terms: dict[str, tuple[torch.Tensor, torch.Tensor]]):
    if not dist.enabled:
        return terms
    merged: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    for part in dist.gather({k: (s.double().cpu(), c.double().cpu()) for k, (s, c) in terms.items()}):
        add_term_sums(merged, part)
    return {k: (s.float(), c.float()) for k, (s, c) in merged.items()}


def skipped_update_metrics(lr: float) -> dict[str, torch.Tensor]:
    """The row of an update that took no optimizer step (no signal anywhere in the batch)."""
    return {"loss": torch.zeros(()), "grad_norm": torch.zeros(()), "lr": torch.tensor(lr),
            "timing_s/old_logprob": 0.0, "update/skipped_token_frac": torch.tensor(1.0),
            "update/optimizer_skipped": torch.tensor(1.0)}


def update_metrics(dist: Dist, totals: UpdateTotals, lr: float, skipped: float,
                   total: float) -> dict[str, torch.Tensor]:
    """The update's row: per-token means of the sums, each term per token of its own, the loss and
    grad norm averaged over the optimizer steps. skipped/total: this rank's completion tokens left
    out of the forward (zero advantage) and in all."""
    sums = reduce_sums(dist, totals.sums)
    sums.setdefault("loss", torch.zeros(()))
    tokens = sums.pop("tokens", torch.zeros(())).clamp_min(1.0)
    loss = sums.pop("loss") / len(totals.grad_norms)  # the objective of each optimizer step, averaged
    out = {k: (v if k.endswith("_max") else v / tokens) for k, v in sums.items()}
    for name, (s, c) in reduce_terms(dist, totals.terms).items():
        out[name] = s / c.clamp_min(1.0)  # per token of the term
    skipped, total = (float(x) for x in dist.sum([skipped, total]))
    out["loss"] = loss
    out["grad_norm"] = torch.stack(totals.grad_norms).mean()
    out["lr"] = torch.tensor(lr)
    out["update/skipped_token_frac"] = torch.tensor(skipped / total if total else 0.0)
    out["update/optimizer_skipped"] = torch.tensor(0.0)
    return out
