"""K1: no-grad token log-probs (+ log-sum-exp, + entropy) from hidden states and the LM head.

Used for old/ref log-probs, sampler/trainer mismatch checks and GSPO's first phase. Chunked so no
[N, V] tensor exists: per chunk z = h_c W^T in fp32 (bf16 operands on CUDA), then one row pass.
Cost: 2NHV FLOPs for the GEMMs + one read of each fp32 chunk row (Triton: online max / sum-exp /
sum p*z in a single sweep) - the GEMM dominates (21 ns vs ~1 ns per logit on the CPU here).
"""

from typing import NamedTuple

import torch

from .chunked import LMHead, rows_torch
from .enums import Backend
from .gemm_head import bytes_per_logit, gemm_logprob_stats
from .options import GRPOOptions, chunk_rows, launch_device, resolve_backend, row_grid


class LogprobStats(NamedTuple):
    logp: torch.Tensor  # [N] fp32
    lse: torch.Tensor  # [N] fp32 log-sum-exp of logits / tau
    entropy: torch.Tensor | None  # [N] fp32


def logprob_rows_triton(z: torch.Tensor, targets: torch.Tensor, inv_temp: float = 1.0,
                        entropy: bool = True, block_v: int | None = None) -> LogprobStats:
    """Host launcher of the K1 row kernel. z [C, V] logits (any float dtype, row-contiguous)."""
    c, v = z.shape
    logp = torch.empty(c, dtype=torch.float32, device=z.device)
    lse = torch.empty_like(logp)
    ent = torch.empty_like(logp) if entropy else logp  # dummy pointer when unused
    bv = block_v or min(4096 if z.is_cuda else 2048, max(16, 1 << (v - 1).bit_length()))
    from .triton_rows import _logprob_rows_kernel

    with launch_device(z.device):
        _logprob_rows_kernel[row_grid(c, z.device)](z, z.stride(0), targets, logp, lse, ent, c, v, inv_temp,
                                                    BLOCK_V=bv, WITH_ENTROPY=entropy,
                                                    num_warps=8 if z.is_cuda else 1)
    return LogprobStats(logp, lse, ent if entropy else None)


def token_logprobs_ref(hidden, weight, targets, temperature: float = 1.0) -> LogprobStats:
    """Spec. hidden [N, H], weight [V, H], targets [N] -> logp, lse, entropy [N] (fp32, or fp64
    for fp64 inputs). Materialises the [N, V] logits: N*V*4 bytes, 2NHV FLOPs."""
    dt = torch.promote_types(hidden.dtype, torch.float32)
    logits = (hidden.to(dt) @ weight.to(dt).T) / temperature  # [N, V]
    logprobs = torch.log_softmax(logits, dim=-1)
    logp = logprobs.gather(-1, targets[:, None].long()).squeeze(-1)
    entropy = -(logprobs.exp() * logprobs).sum(-1)
    return LogprobStats(logp, torch.logsumexp(logits, -1), entropy)


@torch.no_grad()
def token_logprob_stats(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                        temperature: float = 1.0, *, entropy: bool = True, chunk_tokens: int | None = None,
                        memory_budget_mb: float | None = None, backend: str | None = None,
                        compute_dtype: torch.dtype | None = None) -> LogprobStats:
    """K1 with the log-sum-exp and (optionally) the entropy per token; see token_logprobs.
    compute_dtype: the GEMM operand dtype (GRPOOptions.compute_dtype)."""
    b = resolve_backend(backend, hidden.device)
    if b is Backend.REFERENCE:
        if compute_dtype is not None:  # the same rounded operands, fp32 logits
            hidden, weight = hidden.to(compute_dtype), weight.to(compute_dtype)
        return LogprobStats(*(None if x is None else x.to(torch.float32)
                              for x in token_logprobs_ref(hidden, weight, targets, temperature)))
    n, v = hidden.shape[0], weight.shape[0]
    opts = GRPOOptions(chunk_tokens=chunk_tokens, memory_budget_mb=memory_budget_mb)
    lm = LMHead(weight, temperature, compute_dtype)
    c = chunk_rows(n, v, opts, hidden.device, bytes_per_logit(lm, False) if b is Backend.GEMM else 4.0)
    targets = targets.long()
    outs = []
    for s in range(0, n, c):
        if b is Backend.GEMM:  # no logits written: the statistics come from the GEMM's epilogue
            logp, lse, ent = gemm_logprob_stats(lm, lm.rows(hidden[s:s + c]), targets[s:s + c])
            outs.append(LogprobStats(logp, lse, ent if entropy else None))
            continue
        z = lm.logits(lm.rows(hidden[s:s + c]))
        if b is Backend.TRITON:
            outs.append(logprob_rows_triton(z, targets[s:s + c], lm.inv_temp, entropy))
        else:
            outs.append(LogprobStats(*rows_torch(z, targets[s:s + c], inv_temp=lm.inv_temp, entropy=entropy)))
        del z
    if not outs:
        e = hidden.new_zeros(0, dtype=torch.float32)
        return LogprobStats(e, e, e if entropy else None)
    return LogprobStats(*(torch.cat(xs) if xs[0] is not None else None for xs in zip(*outs)))


def token_logprobs(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                   temperature: float = 1.0, **kwargs) -> torch.Tensor:
    """K1: log_softmax(hidden @ weight.T / temperature)[targets] as [N] fp32, without grad and
    without materialising [N, V]. kwargs: chunk_tokens, memory_budget_mb, backend, compute_dtype."""
    return token_logprob_stats(hidden, weight, targets, temperature, entropy=False, **kwargs).logp
