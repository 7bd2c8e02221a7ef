"""Loss terms beside the policy objective, on single sequences: a registry keyed by `TermKind`.

A rollout carries its extra terms as data (`Rollout.extra_terms`, each an `ExtraTerm(kind, coef,
context)`); the update calls the registry entry for each kind once per mini-batch, with the
sequences that carry it, and knows nothing else about them. Each entry backpropagates its own
term and returns its metrics as {name: (sum, count)}, reported as sum / count.

- distill (MENTOR's self-distillation, `mentor.loss.distill_coef`): a re-roll y sampled
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

import torch

from mentor_fast.compat import StrEnum
from mentor_fast.types import ExtraTerm


class TermKind(StrEnum):
    DISTILL = "distill"


@dataclass
class TermContext:
    """What a term may use: the policy and the temperature its log-probs are taken at.

    forward(fn, *args) runs fn(model, *args) as the policy's forward (under FSDP2 that gathers the
    parameters; the default calls fn directly). idle(grad) is one empty pass for a rank that has
    fewer term items than another, so every rank makes the same collectives (update.py)."""

    model: torch.nn.Module
    temperature: float
    forward: Callable[..., object] | None = None
    idle: Callable[[bool], None] | None = None
    count: Callable[[int], int] | None = None  # local item count -> the most any rank has

    def run(self, fn, *args):
        return self.forward(fn, *args) if self.forward is not None else fn(self.model, *args)


def _logits(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    return model(input_ids=ids).logits


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
                logits = ctx.run(_logits, ids)[0, len(prompt) - 1 : -1].float()
                logp[name] = torch.log_softmax(logits / ctx.temperature, -1)
        kl = (logp["teacher"].exp() * (logp["teacher"] - logp["student"])).sum()
        (term.coef * kl / norm).backward()
        total = total + kl.detach().cpu()
        tokens += len(completion)
    return {"mentor/distill_kl": (total, torch.tensor(float(tokens)))}


@dataclass(frozen=True)
class Term:
    fn: TermFn
    passes: tuple[bool, ...]  # the policy passes one item makes, in order (True: with gradient)


EXTRA_TERMS: dict[TermKind, Term] = {TermKind.DISTILL: Term(distill_forward_kl, passes=(False, True))}


def apply_extra_terms(ctx: TermContext, batch, seqs: list[int], norm: float) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """Every extra term carried by the sequences `seqs` (in their order), kind by kind in registry
    order. With other ranks (`ctx.count`), a rank with fewer items of a kind makes the passes of
    the missing ones empty (`ctx.idle`)."""
    items = [(i, term) for i in seqs for term in batch.rollouts[i].extra_terms]
    out: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    for kind, entry in EXTRA_TERMS.items():
        mine = [x for x in items if x[1].kind == kind]
        most = ctx.count(len(mine)) if ctx.count is not None else len(mine)
        if mine:
            for name, (s, c) in entry.fn(ctx, batch, mine, norm).items():
                prev = out.get(name)
                out[name] = (s, c) if prev is None else (prev[0] + s, prev[1] + c)
        for _ in range(most - len(mine)):
            for grad in entry.passes:
                ctx.idle(grad)
    return out
