"""Knobs, result types and dispatch shared by the GRPO kernels (K0 advantages, K1 log-probs, K2 loss).

Shape letters: N packed completion tokens, S sequences, H hidden, V vocab, C rows in one chunk.
Nothing here imports triton: `import mentor_fast.kernels` must work on a machine without it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import math
import os
from dataclasses import dataclass

import torch

from .enums import AdvEstimator, Backend, KLEstimator, LossType


@dataclass(frozen=True)
class GRPOOptions:
    """Scalar knobs of `grpo_loss` (pass them as keyword arguments, or as `options=`)."""

    loss_type: LossType = LossType.CLIP
    """The policy term (objective.POLICY_LOSSES): clip, gspo, cispo or sapo. The aggregation is in
    `token_weights` (see `aggregation_weights`)."""
    eps_low: float = 0.2
    """Lower clip: ratio >= 1 - eps_low."""
    eps_high: float = 0.28
    """Upper clip: ratio <= 1 + eps_high."""
    dual_clip: float = 0.0
    """Dual-clip constant c > 1 (verl form: for A < 0 the token loss is min(pg, -c * A)); 0 = off.
    clip and gspo only."""
    cispo_cap: float = 5.0
    """cispo: the cap on the detached ratio (TRL and Liger pass it as epsilon_high)."""
    sapo_tau_pos: float = 1.0
    """sapo: the gate's temperature for tokens with A > 0."""
    sapo_tau_neg: float = 1.05
    """sapo: the gate's temperature for tokens with A <= 0."""
    temperature: float = 1.0
    """Logits are divided by it before the log-softmax (equal to the sampling temperature)."""
    beta: float = 0.0
    """KL coefficient against `ref_logp`."""
    kl_estimator: KLEstimator = KLEstimator.K3
    """k1 / k2 / k3 estimator of KL(pi || ref) per token."""
    entropy_coef: float = 0.0
    """Differentiable entropy bonus: loss -= entropy_coef * sum_t w_t H_t."""
    is_cap: float = 0.0
    """If > 0, `is_weights` are truncated at this value (truncated IS); 0 = use them as given."""
    adv_estimator: AdvEstimator = AdvEstimator.GRPO
    """K0 estimator used when `rewards` are passed instead of `advantages`."""
    adv_ddof: int = 1
    """Std degrees of freedom for K0 (1 = unbiased)."""
    adv_eps: float = 1e-6
    """Added to the std in K0."""
    chunk_tokens: int | None = None
    """Rows per chunk; None = from `memory_budget_mb`."""
    memory_budget_mb: float | None = None
    """Bytes of fp32 logits one chunk may hold; None = 160 MiB on CPU, 640 MiB on CUDA."""
    compute_weight_grad: bool = True
    """False for a frozen LM head: skips the dW GEMM (4NHV instead of 6NHV)."""
    compute_entropy: bool = True
    """Entropy as a metric (forced on when entropy_coef != 0); costs ~2 cheap passes per row."""
    compute_dtype: torch.dtype | None = None
    """Operand dtype of the LM-head GEMMs (None: the weight's). torch.bfloat16 with an fp32 master
    weight: bf16 operands, fp32 accumulation and fp32 logits chunks; the gradients come back in each
    input's own dtype (an fp32 dW for the master weight, not a rounded one)."""

    def __post_init__(self) -> None:
        for name, enum in (("loss_type", LossType), ("kl_estimator", KLEstimator), ("adv_estimator", AdvEstimator)):
            value = getattr(self, name)
            if value not in {e.value for e in enum}:
                hint = " (TRL's grpo/bnpo/dr_grpo/dapo are loss_type='clip' with an aggregation in token_weights)" \
                    if name == "loss_type" else ""
                raise ValueError(f"{name}={value!r} is not one of {[e.value for e in enum]}{hint}")
            object.__setattr__(self, name, enum(value))
        if isinstance(self.compute_dtype, str):  # "bfloat16", as a config spells it
            object.__setattr__(self, "compute_dtype", getattr(torch, self.compute_dtype, None))
        if self.compute_dtype not in (None, torch.float32, torch.bfloat16, torch.float16):
            raise ValueError(f"compute_dtype must be None, float32, bfloat16 or float16, got {self.compute_dtype}")
        if not (self.dual_clip == 0 or self.dual_clip > 1):
            raise ValueError(f"dual_clip must be 0 or > 1, got {self.dual_clip}")
        if self.temperature <= 0:
            raise ValueError(f"temperature must be > 0, got {self.temperature}")
        if self.eps_low < 0 or self.eps_high < 0:
            raise ValueError("eps_low and eps_high must be >= 0")
        if self.dual_clip and self.loss_type not in (LossType.CLIP, LossType.GSPO):
            raise ValueError(f"dual_clip applies to loss_type clip and gspo, not {self.loss_type}")
        if self.cispo_cap <= 0 or self.sapo_tau_pos <= 0 or self.sapo_tau_neg <= 0:
            raise ValueError("cispo_cap, sapo_tau_pos and sapo_tau_neg must be > 0")

    @classmethod
    def build(cls, options: GRPOOptions | None, knobs: dict) -> GRPOOptions:
        """`options` overridden by keyword knobs; an unknown knob is an error that names it."""
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(knobs) - names)
        if unknown:
            raise TypeError(f"unknown grpo_loss option(s) {unknown}; known: {sorted(names)}")
        return dataclasses.replace(options or cls(), **knobs)

    @property
    def need_entropy(self) -> bool:
        return self.compute_entropy or self.entropy_coef != 0


@dataclass
class GRPOLossOutput:
    """Result of `grpo_loss`. Everything except `loss` is detached.

    Metrics are means over the *active* tokens (token_weights != 0), each token counted once
    (not weighted by w); they are NaN when no token is active. Clip fractions count tokens whose
    gradient the clip removed: low = A < 0 and ratio < 1 - eps_low; high = A > 0 and ratio > 1 + eps_high.
    """

    loss: torch.Tensor  # [] differentiable w.r.t. hidden and weight
    logp: torch.Tensor  # [N] fp32 token log-probs at the given temperature
    entropy: torch.Tensor | None  # [N] fp32 (None when not computed)
    advantages: torch.Tensor  # [N] fp32, the per-token advantages used
    ratio: torch.Tensor  # [N] fp32 importance ratio (per token, or the sequence ratio for gspo)
    clip_frac_low: torch.Tensor
    clip_frac_high: torch.Tensor
    clip_frac_dual: torch.Tensor
    kl_mean: torch.Tensor  # NaN when no ref_logp was given
    ratio_mean: torch.Tensor
    ratio_min: torch.Tensor
    ratio_max: torch.Tensor
    entropy_mean: torch.Tensor  # NaN when entropy was not computed
    pg_loss: torch.Tensor  # sum_t w_t * is_t * pg_t (the policy-gradient part of `loss`)

    def metrics(self, prefix: str = "loss/") -> dict[str, torch.Tensor]:
        names = ("clip_frac_low", "clip_frac_high", "clip_frac_dual", "kl_mean", "ratio_mean",
                 "ratio_min", "ratio_max", "entropy_mean", "pg_loss")
        return {prefix + n: getattr(self, n).detach() for n in names}


def resolve_backend(backend: str | None, device: torch.device) -> Backend:
    """CUDA -> triton (if installed), else torch. An explicit backend is honoured."""
    if backend is not None:
        b = Backend(backend)
        if b is Backend.TRITON:
            require_triton(device)
        return b
    if device.type == "cuda" and importlib.util.find_spec("triton") is not None:
        return Backend.TRITON
    return Backend.TORCH


def require_triton(device: torch.device) -> None:
    if importlib.util.find_spec("triton") is None:
        raise ImportError("backend='triton' needs the triton package (pip install triton)")
    if device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        raise RuntimeError(
            "backend='triton' on a CPU tensor needs TRITON_INTERPRET=1 set before triton is imported"
        )


def chunk_rows(n: int, vocab: int, opts: GRPOOptions, device: torch.device) -> int:
    """Rows per chunk: the fp32 [C, V] logits buffer fits the memory budget; chunks are balanced
    (2048 rows in 3 chunks of 704, not 832 + 832 + 384) and a multiple of 64 rows for the GEMMs."""
    if opts.chunk_tokens is not None:
        return max(1, int(opts.chunk_tokens))
    budget_mb = opts.memory_budget_mb or (640.0 if device.type == "cuda" else 160.0)
    c_max = max(1, int(budget_mb * 2**20) // (4 * vocab))
    if c_max >= 64:
        c_max -= c_max % 64
    if n <= 0:
        return c_max
    n_chunks = math.ceil(n / c_max)
    c = math.ceil(n / n_chunks)
    return min(c_max, math.ceil(c / 64) * 64) if c_max >= 64 else c


def launch_device(device: torch.device):
    """Context for a kernel launch: Triton launches on the current CUDA device, so a tensor on
    cuda:1 needs cuda:1 made current for the launch (a no-op on the CPU interpreter)."""
    return torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()


def nan_scalar(device: torch.device) -> torch.Tensor:
    return torch.full((), float("nan"), device=device)


def row_grid(n_rows: int, device: torch.device) -> tuple[int]:
    """1-D grid for the grid-stride row kernels: never more programs than rows, and on a GPU a few
    waves of SMs (a (B, L) grid fails at 65,536 rows, as Liger's does)."""
    if device.type != "cuda":  # the interpreter pays ~40 ms per program: few programs, many rows each
        return (max(1, min(n_rows, 4)),)
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    return (max(1, min(n_rows, 8 * sms)),)
