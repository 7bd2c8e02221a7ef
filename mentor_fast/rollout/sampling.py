"""Each sequence's random stream and the sampler, shared by the decoders (hf.py's loop, static.py's
compiled step) and, for the stream's seed, by the vLLM engine.

A sequence draws one uniform per step from its own generator, seeded by `row_seed` from (seed, prompt
index, sample index), so its tokens do not depend on its batch neighbours; `sample_tokens` turns a
step's logits and uniforms into tokens by an inverse-CDF draw.
"""

from __future__ import annotations

import torch

from mentor_fast.rollout.base import SamplingParams

_MASK64 = (1 << 64) - 1


def row_seed(seed: int, prompt_index: int, sample_index: int) -> int:
    """Seed of one sequence's random stream (splitmix64 of the three indices; 63 bits)."""
    x = (seed * 0x9E3779B97F4A7C15 + prompt_index * 0xBF58476D1CE4E5B9 + sample_index + 1) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return (x ^ (x >> 31)) >> 1


def sample_tokens(
    logits: torch.Tensor, uniforms: torch.Tensor, params: SamplingParams
) -> tuple[torch.Tensor, torch.Tensor]:
    """logits [L, V] (any dtype), uniforms [L] in [0, 1) -> (tokens [L], sampler log-probs [L] fp32).

    The reported log-prob is log_softmax(logits / T)[token] on the raw logits in fp32, NOT the
    log-prob under the top-p-renormalised distribution the token was drawn from: it is what the
    trainer recomputes from its own forward, so sampler and trainer score the same tokens under
    the same function and the importance ratio is 1 when the weights agree. Greedy reports T = 1.
    """
    z = logits.float()
    if params.greedy:
        tokens = z.argmax(-1)
        return tokens, (z.gather(-1, tokens[:, None]).squeeze(-1) - torch.logsumexp(z, -1))
    z = z / params.temperature  # [L, V]
    lse = torch.logsumexp(z, -1, keepdim=True)  # [L, 1]
    probs = (z - lse).exp_()
    if params.top_p < 1.0:
        sorted_p, order = probs.sort(-1, descending=True)
        # Keep the smallest prefix whose mass reaches top_p (the top token always stays).
        sorted_p = sorted_p.masked_fill(sorted_p.cumsum(-1) - sorted_p > params.top_p, 0.0)
        probs = torch.zeros_like(probs).scatter_(-1, order, sorted_p)
    # Inverse-CDF draw: one uniform per row and step. fp64 cumsum so tail tokens keep their mass.
    cdf = probs.double().cumsum(-1)  # [L, V]
    target = uniforms.double()[:, None] * cdf[:, -1:]
    tokens = torch.searchsorted(cdf, target, right=True).squeeze(-1).clamp_(max=z.shape[-1] - 1)
    return tokens, (z.gather(-1, tokens[:, None]) - lse).squeeze(-1)
