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
from dataclasses import dataclass, field
from typing import Annotated

import torch

from .enums import Backend
from .settings import AdvantageConfig, LossConfig, Range, check_ranges

# The GEMM head's narrowest vocab tile (kernels/triton_gemm.py's autotuner configs): its statistics have a
# slot per BN_MIN columns. Here, not in gemm_head.py, so that the jit module and its launcher share it
# without importing each other.
BN_MIN = 64


@dataclass
class GRPOOptions(LossConfig):
    """What one kernel call computes: the run's loss settings (LossConfig, the config's `loss.*`:
    pass it as `GRPOOptions.of(cfg.loss, temperature=...)`, or the fields as keyword arguments)
    plus the knobs of the call below. The kernels read the objective's fields (type, eps_*, dual
    clip, cispo/sapo, beta, KL estimator, entropy bonus); impl, aggregation and is_cap are read
    where the inputs are made (the aggregation as `token_weights`, the IS weights as `is_weights`)."""

    temperature: Annotated[float, Range(gt=0)] = 1.0
    """Logits are divided by it before the log-softmax (equal to the sampling temperature)."""
    advantage: AdvantageConfig = field(default_factory=AdvantageConfig)
    """K0's estimator, when `rewards` are passed instead of `advantages`."""
    max_completion_len: int | None = None
    """The aggregation `constant`'s length L (rollout.max_new_tokens)."""
    chunk_tokens: int | None = None
    """Rows per chunk; None = from `memory_budget_mb`."""
    memory_budget_mb: float | None = None
    """MiB one chunk's [C, V] buffer may hold (fp32 logits; the GEMM head's bf16 scaled probabilities);
    None = 160 MiB on CPU, 640 MiB on CUDA."""
    compute_weight_grad: bool = True
    """False for a frozen LM head: skips the dW GEMM (4NHV instead of 6NHV)."""
    compute_entropy: bool = True
    """Entropy as a metric (forced on when entropy_coef != 0); costs ~2 cheap passes per row."""
    compute_dtype: torch.dtype | None = None
    """Operand dtype of the LM-head GEMMs (None: the weight's). torch.bfloat16 with an fp32 master
    weight: bf16 operands, fp32 accumulation and fp32 logits chunks; the gradients come back in each
    input's own dtype (an fp32 dW for the master weight, not a rounded one)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if isinstance(self.compute_dtype, str):  # "bfloat16", as a config spells it
            self.compute_dtype = getattr(torch, self.compute_dtype, None)
        if self.compute_dtype not in (None, torch.float32, torch.bfloat16, torch.float16):
            raise ValueError(f"compute_dtype must be None, float32, bfloat16 or float16, got {self.compute_dtype}")
        check_ranges(self)

    @classmethod
    def of(cls, loss: LossConfig, **knobs) -> GRPOOptions:
        """The run's loss settings with this call's knobs (temperature, compute_dtype, ...): every
        LossConfig field travels as it is, so a new setting needs no copying here."""
        return cls.build(None, {f.name: getattr(loss, f.name) for f in dataclasses.fields(LossConfig)} | knobs)

    @classmethod
    def build(cls, options: GRPOOptions | None, knobs: dict) -> GRPOOptions:
        """`options` overridden by keyword knobs; an unknown knob is an error that names it."""
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(knobs) - names)
        if unknown:
            raise TypeError(f"unknown grpo_loss option(s) {unknown}; known: {sorted(names)}")
        if options is not None and not knobs:
            return options
        return dataclasses.replace(options, **knobs) if options is not None else cls(**knobs)

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
    is_weight_mean: torch.Tensor  # the mismatch correction's mean weight (NaN without sampler_logp)
    is_masked_frac: torch.Tensor  # the share of tokens it zeroed (*_mask modes)


def resolve_backend(backend: str | None, device: torch.device) -> Backend:
    """CUDA -> triton (if installed), else torch. An explicit backend is honoured."""
    if backend is not None:
        b = Backend(backend)
        if b in (Backend.TRITON, Backend.GEMM):
            require_triton(device, b)
        return b
    if device.type == "cuda" and importlib.util.find_spec("triton") is not None:
        return Backend.TRITON
    return Backend.TORCH


def require_triton(device: torch.device, backend: Backend = Backend.TRITON) -> None:
    if importlib.util.find_spec("triton") is None:
        raise ImportError(f"backend='{backend}' needs the triton package (pip install triton)")
    if device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        raise RuntimeError(
            f"backend='{backend}' (loss.impl=fused_gemm for 'gemm') runs on CUDA; on a CPU tensor it needs "
            "TRITON_INTERPRET=1 set before triton is imported"
        )


def chunk_rows(n: int, vocab: int, opts: GRPOOptions, device: torch.device, bytes_per_logit: float = 4.0) -> int:
    """Rows per chunk: the chunk's [C, V] buffer (fp32 logits: 4 bytes a logit; the GEMM head's
    scaled probabilities in the operand dtype) fits the memory budget; chunks are balanced (2048 rows
    in 3 chunks of 704, not 832 + 832 + 384) and a multiple of 64 rows for the GEMMs."""
    if opts.chunk_tokens is not None:
        return max(1, int(opts.chunk_tokens))
    budget_mb = opts.memory_budget_mb or (640.0 if device.type == "cuda" else 160.0)
    c_max = max(1, int(budget_mb * 2**20 / (bytes_per_logit * vocab)))
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


def row_grid(n_rows: int, device: torch.device) -> tuple[int]:
    """1-D grid for the grid-stride row kernels: never more programs than rows, and on a GPU a few
    waves of SMs (a (B, L) grid fails at 65,536 rows, as Liger's does)."""
    if device.type != "cuda":  # the interpreter pays ~40 ms per program: few programs, many rows each
        return (max(1, min(n_rows, 4)),)
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    return (max(1, min(n_rows, 8 * sms)),)


def is_one(grad_out: torch.Tensor) -> bool:
    """Whether backward's incoming gradient is known to be 1 without waiting for the device: on the CPU
    it is read (skipping a multiply of dW, 100+ MB, is worth it there); on a GPU it is not (reading it
    would stall the host once per micro-batch), so the gradients are always scaled, a bandwidth-bound
    multiply well under a millisecond."""
    return not grad_out.is_cuda and bool(torch.equal(grad_out, torch.ones_like(grad_out)))
