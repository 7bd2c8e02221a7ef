"""The objective's settings, written once: `loss.*` and `advantage.*` of a run's config are these
classes, and the kernels take them as they are (`GRPOOptions` extends LossConfig with the knobs of
one call). A new loss setting is one field here, with its docstring and its range, plus its use.

`Range` is the set of values a number field accepts, declared in its annotation
(`Annotated[float, Range(ge=0)]`); the config loader checks it when a value arrives and names the
key, `check_ranges` checks a whole dataclass (GRPOOptions on construction). No torch here: the
config loads without it.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import typing
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from .enums import AdvEstimator, Aggregation, ISMode, KLEstimator, LossImpl, LossType


@dataclass(frozen=True)
class Range:
    """Numbers with ge <= x, gt < x, x <= le, x < lt (each bound optional), or one of `also`."""

    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    lt: float | None = None
    also: tuple[float, ...] = ()  # values allowed outside the bounds, e.g. 0 for "off"

    def accepts(self, x: Any) -> bool:
        if isinstance(x, bool) or not isinstance(x, (int, float)) or (isinstance(x, float) and math.isnan(x)):
            return False
        if x in self.also:
            return True
        return ((self.ge is None or x >= self.ge) and (self.gt is None or x > self.gt)
                and (self.le is None or x <= self.le) and (self.lt is None or x < self.lt))

    def __str__(self) -> str:
        low = f"[{self.ge:g}" if self.ge is not None else f"({self.gt:g}" if self.gt is not None else None
        high = f"{self.le:g}]" if self.le is not None else f"{self.lt:g})" if self.lt is not None else None
        if low and high:
            text = f"in {low}, {high}"
        elif low:
            text = (">= " if low[0] == "[" else "> ") + low[1:]
        elif high:
            text = ("<= " if high[-1] == "]" else "< ") + high[:-1]
        else:
            text = "any number"
        return " or ".join([*(f"{v:g}" for v in self.also), text])


def field_range(hint: Any) -> tuple[Any, Range | None]:
    """(the bare type, its Range or None) of a field's type hint (hints read with include_extras)."""
    if typing.get_origin(hint) is Annotated:
        base, *extras = typing.get_args(hint)
        return base, next((e for e in extras if isinstance(e, Range)), None)
    return hint, None


def range_error(key: str, value: Any, rng: Range) -> str:
    return f"{key}: {value!r} is out of range: it must be {rng}"


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls, include_extras=True)


def check_ranges(obj: Any, prefix: str = "") -> None:
    """ValueError naming the first field of the dataclass `obj` (and its nested dataclasses) whose
    value is outside its declared Range; list fields are checked item by item."""
    hints = _hints(type(obj))
    for f in dataclasses.fields(obj):
        value, key = getattr(obj, f.name), f"{prefix}{f.name}"
        if dataclasses.is_dataclass(value):
            check_ranges(value, key + ".")
            continue
        _, rng = field_range(hints[f.name])
        if rng is None:
            continue
        for i, v in enumerate(value if isinstance(value, (list, tuple)) else [value]):
            if not rng.accepts(v):
                raise ValueError(range_error(key if not isinstance(value, (list, tuple)) else f"{key}[{i}]", v, rng))


@dataclass
class AdvantageConfig:
    """Group-relative advantages from a group's rewards (kernels/advantages.py)."""

    estimator: AdvEstimator = AdvEstimator.GRPO
    """grpo: (r - mean)/(std + eps); dr_grpo: r - mean; batch: (r - group mean)/batch std; rloo:
    G/(G - 1) (r - mean)."""
    std_ddof: Literal[0, 1] = 1
    """1: unbiased std (verl); 0: population std."""
    eps: Annotated[float, Range(ge=0)] = 1e-6
    """Added to the std."""


@dataclass
class LossConfig:
    """The GRPO objective (kernels/objective.py) and how it is computed and aggregated."""

    impl: LossImpl = LossImpl.FUSED
    """reference: plain torch on materialised logits (the vanilla baseline, and the kernels'
    specification); fused: the chunked kernels in mentor_fast.kernels that never build [N, V] logits
    (Triton row kernels on CUDA, chunked torch on the CPU); fused_gemm: the fused op with the GEMM head,
    whose Triton GEMM takes the softmax statistics in its epilogue so the logits never leave the chip
    (CUDA, or the Triton interpreter; docs/kernels.md). All compute the same objective (kernels/objective.py)."""
    type: LossType = LossType.CLIP
    """The policy term per token: clip (PPO's clipped surrogate; TRL's grpo, dapo, bnpo and dr_grpo
    are clip with an aggregation), gspo (the clip on the length-normalised sequence ratio), cispo
    (REINFORCE with the ratio capped at cispo_cap and detached), sapo (a sigmoid gate on the ratio)."""
    aggregation: Aggregation = Aggregation.TOKEN_MEAN
    """How token losses are weighted (TRL's loss_type in brackets): token_mean over the optimizer
    step's whole batch [dapo]; token_mean_micro per micro-batch [bnpo]; seq_mean_token_mean
    (original GRPO) [grpo]; seq_mean_token_sum; constant = sum / (sequences * max_new_tokens)
    [dr_grpo]. Encoded as per-token weights (kernels/advantages.py AGGREGATIONS)."""
    eps_low: Annotated[float, Range(ge=0, lt=1)] = 0.2
    """Lower clip: ratio >= 1 - eps_low (clip, gspo)."""
    eps_high: Annotated[float, Range(ge=0)] = 0.28
    """Upper clip: ratio <= 1 + eps_high (DAPO clip-higher; clip, gspo)."""
    dual_clip: Annotated[float, Range(gt=1, also=(0,))] = 0.0
    """Dual-clip constant c (> 1) for A < 0: the token loss is min(pg, -c A), as verl writes it;
    0 disables (clip, gspo)."""
    cispo_cap: Annotated[float, Range(gt=0)] = 5.0
    """type=cispo: cap on the detached ratio (TRL's and Liger's epsilon_high for cispo)."""
    sapo_tau_pos: Annotated[float, Range(gt=0)] = 1.0
    """type=sapo: temperature of the gate for tokens with A > 0."""
    sapo_tau_neg: Annotated[float, Range(gt=0)] = 1.05
    """type=sapo: temperature of the gate for tokens with A <= 0."""
    beta: Annotated[float, Range(ge=0)] = 0.0
    """KL coefficient against the frozen reference model (needs model.ref_model)."""
    kl_estimator: KLEstimator = KLEstimator.K3
    """KL estimator for the penalty: k1 (logp - ref), k2 ((logp - ref)^2 / 2), k3 (exp(ref - logp) -
    (ref - logp) - 1, not clamped, as in TRL and Liger)."""
    entropy_coef: float = 0.0
    """Entropy bonus coefficient: loss -= entropy_coef * sum_t w_t H_t (the entropy is always
    logged)."""
    mask_truncated: bool = False
    """Leave completions cut at rollout.max_new_tokens out of the loss (DAPO's overlong filtering,
    TRL's mask_truncated_completions): their tokens get weight 0 and leave the aggregation's
    normaliser. Their rewards still count in their group's advantages."""
    is_mode: ISMode = ISMode.TOKEN_TRUNCATE
    """The sampler/trainer mismatch correction (TRL's names): each token's policy term is weighted
    by r = pi_old / mu, mu the sampler's probability, per token (token_*) or its sequence's product
    (sequence_*), kept in [is_floor, is_cap] by truncation (*_truncate) or by zeroing what falls
    outside (*_mask; with is_floor > 0 the two-sided mask of IcePop). It acts where pi_old is not
    the sampler's own log-prob: recomputed (ppo_epochs or mini_batches > 1), one version stale
    (re-rolls during the update), or another engine's. The default is token-level truncation:
    verl's decoupled token-TIS and Yao et al.'s TIS (cap 2) never drop a sequence, whereas a
    sequence's product of r (TRL's default, sequence_mask at 3) spreads as sqrt(length): on long
    bf16 completions it masks a growing share of the batch. A method's own weighting of a sequence
    (MENTOR's transfer and shaping modes, with their own caps) replaces it for that sequence."""
    is_cap: Annotated[float, Range(ge=1, also=(0,))] = 2.0
    """The upper bound C_max of the mismatch correction; 0 turns the correction off."""
    is_floor: Annotated[float, Range(ge=0, lt=1)] = 0.0
    """The lower bound C_min (0: none): *_truncate raise a weight to it, *_mask drop what is below."""

    def __post_init__(self) -> None:
        # YAML and keyword callers pass plain strings; the kernels dispatch on the enums
        for name, enum in (("impl", LossImpl), ("type", LossType), ("aggregation", Aggregation),
                           ("kl_estimator", KLEstimator), ("is_mode", ISMode)):
            value = getattr(self, name)
            if value not in {e.value for e in enum}:
                hint = (" (TRL's grpo/bnpo/dr_grpo/dapo are type='clip' with an aggregation)"
                        if name == "type" else "")
                raise ValueError(f"{name}={value!r} is not one of {[e.value for e in enum]}{hint}")
            object.__setattr__(self, name, enum(value))
        self.check()

    def check(self) -> None:
        """The rules between fields that a Range cannot state (ValueError naming the field). The config
        loader calls it after its overrides, GRPOOptions on construction: one definition for both."""
        if self.dual_clip and str(self.type) not in (LossType.CLIP, LossType.GSPO):
            raise ValueError(f"dual_clip applies to type clip and gspo, not {self.type}")
