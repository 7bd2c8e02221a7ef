"""method=scaf: Scaf-GRPO's tiered hints (Zhang et al., arXiv 2510.19807), on MENTOR's machinery with
the diagnosis taken out.

What the paper does, and what is done here:
- A group whose rollouts all fail is re-tried under hints of increasing detail: knowledge, then
  planning, then a prefix of the solution, stopping at the first tier that gives a correct
  solution. Here each tier is one re-roll round of recovery.reroll.count samples (tier 1, then 2,
  then 3: recovery.reroll.max_rounds is 3 whatever it says).
- The successful trajectory replaces one failed rollout (the paper's replace_num=1;
  mentor.loss.max_replace) and is trained on-policy in the hinted context, with plain GRPO
  clipping: loss mode `replace`, no self-distillation.
- No hints in the first 15% of steps (scaf.exempt_frac of trainer.max_steps), the exemption
  period; no collapse surge opens it early.
- The hints do not depend on the attempts: every group of a problem gets the same tier-k hint.

Where it departs, and why:
- The hint library. The paper's hints were written per problem by DeepSeek-R1 from the ground-truth
  solution. Here they are cut from the worked solution the data carries, by the deterministic
  writer with the attempts hidden (mentor/writers/blind.py): knowledge is the level-1 pointer
  (which computation comes first, and which operation it is), planning the level-2 plan (every
  operation in order, results named, not stated), solution the level-3 first step with its
  result. They pass MENTOR's leak guard like any hint. The released code (dvlab-research/Scaf-GRPO)
  comments the planning tier out; the paper's three tiers are kept.
- Groups per step and when the re-rolls run are the shared budget (recovery.trigger.*,
  recovery.reroll.schedule and horizon), so both methods spend the same budget; the paper hints
  every failed group within its step. A tier never fades: each intervention starts at the
  knowledge tier (MENTOR starts a problem it rescued one level lower next time).
- Its metrics and intervention log are MENTOR's (mentor/*; scaf.jsonl).
"""

from __future__ import annotations

import copy
import dataclasses
import math

from mentor_fast.config import MentorConfig, RecoveryConfig, RunConfig
from mentor_fast.config.baselines import ScafConfig
from mentor_fast.config.mentor import BackendKind
from mentor_fast.mentor.method import MentorMethod
from mentor_fast.mentor.pipeline import Mentor
from mentor_fast.mentor.report import METRICS as MENTOR_METRICS
from mentor_fast.mentor.writers.solutions import WorkedSolutions
from mentor_fast.method import MethodContext
from mentor_fast.recovery.scheduler import Scheduler

TIERS = (1, 2, 3)  # knowledge, planning, solution: the writer's hint levels
METRICS = MENTOR_METRICS  # Scaf runs on MentorMethod: its metrics are MENTOR's


def scaf_config(cfg: ScafConfig, mentor: MentorConfig, recovery: RecoveryConfig,
                max_steps: int) -> tuple[MentorConfig, RecoveryConfig]:
    """MENTOR's config and the run's budget as Scaf runs them: the writer, tiers, exemption (a share
    of the run's max_steps) and loss Scaf's own, the rest of mentor.* and recovery.* as they are."""
    m = copy.deepcopy(mentor)
    m.agents = dataclasses.replace(m.agents, backend=BackendKind.WORKED_SOLUTIONS, blind=True)
    m.loss = dataclasses.replace(m.loss, mode="replace", distill_coef=0.0)
    exempt = math.ceil(cfg.exempt_frac * max_steps - 1e-9)  # steps 1 .. exempt
    budget = RecoveryConfig(
        trigger=dataclasses.replace(recovery.trigger, start_level=TIERS[0], exempt_steps=exempt + 1),
        reroll=dataclasses.replace(recovery.reroll, max_rounds=len(TIERS)))
    return m, budget


def scaf_mentor(cfg: RunConfig, builder) -> Mentor:
    """The mentor Scaf runs on: the worked-solutions writer, blind, under a static scheduler."""
    m, budget = scaf_config(cfg.scaf, cfg.mentor, cfg.recovery, cfg.trainer.max_steps)
    return Mentor(m, budget, WorkedSolutions(), builder, seed=cfg.seed,
                  scheduler=Scheduler(budget.trigger, seed=cfg.seed, static=True))


def build(ctx: MethodContext) -> MentorMethod:
    mentor = scaf_mentor(ctx.cfg, ctx.builder)
    return MentorMethod(mentor, ctx.engine, ctx.score, ctx.sampling, ctx.num_generations,
                        ctx.out / "scaf.jsonl", dist=ctx.dist)
