"""Loss terms beside the policy objective, on single sequences: a registry keyed by `TermKind`.

A rollout carries its extra terms as data (`Rollout.extra_terms`, each an `ExtraTerm(kind, coef,
context)`); the update calls the registry entry for each kind once per mini-batch, with the
sequences that carry it, and knows nothing else about them. Each entry backpropagates its own
term and returns its metrics as {name: (sum, count)}, reported as sum / count.

- distill (MENTOR's self-distillation, research/algorithm.md 2.9 mode D): a re-roll y sampled
  under the hinted prompt q + h pulls the bare prompt q (`context`) toward the hinted policy on
  y's prefixes, coef * sum_t KL(pi(.|q + h, y<t) || pi(.|q, y<t)) over the whole vocabulary, the
  teacher (q + h) detached, divided by the mini-batch's completion tokens like the policy loss.
  Forward KL (teacher first): its logits gradient is coef (p_student - p_teacher), which lifts a
  token the hint made likely even when the bare prompt gives it 1e-4; the reverse KL's gradient
  on such a token is proportional to its own tiny mass.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum

import torch

from mentor_fast.types import ExtraTerm


class TermKind(StrEnum):
    DISTILL = "distill"


@dataclass
class TermContext:
    """What a term may use: the policy and the temperature its log-probs are taken at."""

    model: torch.nn.Module
    temperature: float


# (context, batch, [(sequence index, its term)], normaliser) -> {metric: (sum, count)}
TermFn = Callable[[TermContext, object, list[tuple[int, ExtraTerm]], float], dict[str, tuple[torch.Tensor, torch.Tensor]]]


def distill_forward_kl(ctx: TermContext, batch, items: list[tuple[int, ExtraTerm]], norm: float):
    device = next(ctx.model.parameters()).device
    total, tokens = torch.zeros(()), 0
    for i, term in items:
        r = batch.rollouts[i]
        completion = list(r.completion_ids)
        logp = {}
        for name, prompt in (("teacher", r.behaviour_prompt_ids or r.prompt_ids), ("student", list(term.context))):
            with torch.set_grad_enabled(name == "student"):
                ids = torch.tensor([prompt + completion], device=device)
                logits = ctx.model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float()
                logp[name] = torch.log_softmax(logits / ctx.temperature, -1)
        kl = (logp["teacher"].exp() * (logp["teacher"] - logp["student"])).sum()
        (term.coef * kl / norm).backward()
        total = total + kl.detach().cpu()
        tokens += len(completion)
    return {"mentor/distill_kl": (total, torch.tensor(float(tokens)))}


EXTRA_TERMS: dict[TermKind, TermFn] = {TermKind.DISTILL: distill_forward_kl}


def apply_extra_terms(ctx: TermContext, batch, seqs: list[int], norm: float) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """Every extra term carried by the sequences `seqs` (in their order), kind by kind."""
    items = [(i, term) for i in seqs for term in batch.rollouts[i].extra_terms]
    out: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    for kind in dict.fromkeys(term.kind for _, term in items):
        for name, (s, c) in EXTRA_TERMS[TermKind(kind)](ctx, batch, [x for x in items if x[1].kind == kind], norm).items():
            prev = out.get(name)
            out[name] = (s, c) if prev is None else (prev[0] + s, prev[1] + c)
    return out
