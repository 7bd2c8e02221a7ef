"""The sampler/trainer mismatch correction: importance weights from pi_old and the sampler's mu.

A token sampled by an engine whose probabilities mu differ from the trainer's pi_old (bf16 vLLM
against an fp32 trainer, or a re-roll one policy version stale) is weighed by r = pi_old / mu, per
token or as its sequence's product, then kept inside [floor, cap]: truncated into it, or masked to
0 outside it (TRL's vllm_importance_sampling_mode; with a floor, a two-sided mask as in IcePop).
Every loss path (the fused kernels, the logits-level op and the torch reference) computes these
weights here, from the same tensors, so they cannot differ. O(N) work.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from .enums import ISMode

LOG_RATIO_CLAMP = 20.0  # exp(20) ~ 5e8: a stale old_logp, a far reference or one wild token give no inf


@dataclass(frozen=True)
class MismatchRule:
    sequence_level: bool  # the ratio is the product over the sequence's tokens in the call
    bound: Callable[[torch.Tensor, float, float], torch.Tensor]  # (ratio, floor, cap) -> weight


def _truncate(r: torch.Tensor, floor: float, cap: float) -> torch.Tensor:
    return r.clamp(min=floor if floor > 0 else None, max=cap)


def _mask(r: torch.Tensor, floor: float, cap: float) -> torch.Tensor:
    return torch.where((r >= floor) & (r <= cap), r, torch.zeros_like(r))


MISMATCH_RULES: dict[ISMode, MismatchRule] = {
    ISMode.TOKEN_TRUNCATE: MismatchRule(False, _truncate),
    ISMode.TOKEN_MASK: MismatchRule(False, _mask),
    ISMode.SEQUENCE_TRUNCATE: MismatchRule(True, _truncate),
    ISMode.SEQUENCE_MASK: MismatchRule(True, _mask),
}


def mismatch_weights(old_logp: torch.Tensor, sampler_logp: torch.Tensor, mode: ISMode | str, cap: float,
                     floor: float = 0.0, seq_ids: torch.Tensor | None = None, num_seqs: int | None = None) -> torch.Tensor:
    """[N] weights for tokens with trainer log-probs old_logp [N] and sampler log-probs sampler_logp
    [N]. Sequence modes need seq_ids [N] (num_seqs: how many they index, else read from the device)
    and every token of each sequence they touch; a token whose two log-probs are equal (no mismatch)
    contributes a factor of exactly 1."""
    rule = MISMATCH_RULES[ISMode(mode)]
    d = (old_logp.double() - sampler_logp.double()).nan_to_num(0.0)  # NaN: the sampler gave none
    if rule.sequence_level:
        if seq_ids is None:
            raise ValueError(f"is_mode={ISMode(mode)} needs seq_ids [N]")
        n = num_seqs or (int(seq_ids.max()) + 1 if seq_ids.numel() else 0)
        d = torch.zeros(n, dtype=d.dtype, device=d.device).index_add(0, seq_ids, d)[seq_ids]
    ratio = torch.exp(d.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
    return rule.bound(ratio, floor, cap).to(old_logp.dtype)
