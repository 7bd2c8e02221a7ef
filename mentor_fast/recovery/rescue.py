"""How rescued groups enter the batch (mentor.loss): assembly (algo/assemble.py, one registry entry
per loss mode) and the loss treatment of each inserted re-roll, as data on the rollout (the update
reads it and knows nothing of the method that made it). Any method with re-rolls under prompt +
hint can use it."""

from __future__ import annotations

import dataclasses

from mentor_fast.algo.assemble import LossMode, assemble_groups
from mentor_fast.config import MentorLossConfig
from mentor_fast.recovery.intervention import Intervention
from mentor_fast.types import ExtraTerm, Group, TokenWeighting


def assemble_rescues(groups: list[Group], ivs: list[Intervention], cfg: MentorLossConfig, seed: int) -> list[Group]:
    """The batch with each rescued group's successes in it (cfg.mode), each inserted re-roll
    marked with its loss treatment; `seed` picks the failures replaced."""
    cands = {iv.group.group_id: iv.candidates(cfg.mode) for iv in ivs if iv.rescued}
    out = assemble_groups(groups, cands, cfg.mode, cfg.max_replace, seed=seed)
    return [treat(g, cfg) if g.group_id in cands else g for g in out]


def treat(group: Group, cfg: MentorLossConfig) -> Group:
    """The loss treatment of cfg on each inserted re-roll: transfer and shaping weigh the policy
    term per token (algo/weights.py); distillation adds a term that pulls the bare prompt toward
    the hinted context along the re-roll (algo/terms.py)."""
    weighting = {"transfer": TokenWeighting("truncated_is", cfg.transfer_is_cap),
                 "shaping": TokenWeighting("shaping", cfg.shaping_gamma)}.get(cfg.mode)
    rollouts = []
    for r in group.rollouts:
        if r.origin != "initial":
            hinted = r.behaviour_prompt_ids or r.prompt_ids
            terms = ()
            if cfg.distill_coef > 0 and LossMode(cfg.mode) != LossMode.GROUP and hinted != group.prompt_ids:
                terms = (ExtraTerm("distill", cfg.distill_coef, tuple(group.prompt_ids)),)
            if weighting is not None or terms:
                r = dataclasses.replace(r, weighting=weighting, extra_terms=terms)
        rollouts.append(r)
    return Group(group.group_id, group.problem, group.prompt_ids, rollouts)
