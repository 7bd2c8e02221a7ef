"""method=luffy: LUFFY's off-policy guidance (Yan et al., arXiv 2504.14945), as a failed group's
rescue.

What the paper does, and what is done here:
- An expert's solution joins the group in place of one on-policy rollout, and the group's
  advantages are computed over the mix, as usual.
- The expert's tokens are trained under the bare prompt with the policy-shaping function
  f(p) = p / (p + gamma), gamma = 0.1 (luffy.gamma), and no importance-ratio denominator: each token's
  policy term is weighed by gamma p / (p + gamma)^2, p = pi_old(y_t | q), so that at ratio 1 its
  gradient is that of -A f(pi) (algo/weights.py: the `shaping` weighting). pi_old is recomputed
  under q for it, as for any sequence trained in a context it was not sampled in.
- The expert is the problem's worked solution, tokenized as the policy would write it: the same
  text the supervised warm-up teaches (its task's `worked_solution`, mentor_fast/tasks/: the steps
  and the boxed answer, or the reference program in one fenced block), then EOS. It is scored by
  the run's verifier like any rollout, and only a passing one is inserted (luffy/expert_wrong counts
  the others); one longer than rollout.max_new_tokens is left out too (luffy/too_long).

Where it departs, and why:
- Which groups. LUFFY puts one expert trace into every group (1 off-policy + 7 on-policy). Here it
  goes only into the all-fail groups that MENTOR's budget would take (recovery.trigger.*: the same
  scheduler, collapse surge included), so that the comparison is between kinds of help for the
  same failures, at the same number of groups.
- Clipping. LUFFY leaves the off-policy term unclipped. Here it passes through the run's clipped
  objective at ratio pi / pi_old, which is 1 at the first gradient step on a batch, so with one
  optimizer step per batch (the default) the gradient is LUFFY's exactly; with more the usual
  clip applies on top.
- The expert is the data's worked solution, not a stronger model's trace (the paper's came from
  DeepSeek-R1): what the ladders and the data carry.
"""

from __future__ import annotations

from typing import Any

from mentor_fast.algo.assemble import LossMode, assemble_groups
from mentor_fast.config import MentorLossConfig, TriggerConfig
from mentor_fast.config.baselines import LuffyConfig
from mentor_fast.dist import Dist
from mentor_fast.method import MethodContext, RolloutPlan
from mentor_fast.metrics import Reduce, Reduction
from mentor_fast.recovery.rerolls import Scorer
from mentor_fast.recovery.rescue import treat
from mentor_fast.recovery.scheduler import Scheduler, every_rank
from mentor_fast.tasks import task_of
from mentor_fast.types import Group, Problem, Rollout

# luffy/* are counts, summed over ranks, but for the scheduler's collapse event: its plan is global, so
# every rank reports the same flag
METRICS: dict[str, Reduction] = {"luffy/collapse_event": Reduction(Reduce.SHARED)}


class LuffyMethod:
    """A failed group selected by the scheduler gets the expert trace in place of one rollout."""

    metrics = METRICS

    def __init__(self, cfg: LuffyConfig, trigger: TriggerConfig, tokenizer: Any, score: Scorer, *, seed: int,
                 max_tokens: int, dist: Dist | None = None) -> None:
        """cfg: luffy.*; trigger: the run's recovery.trigger (which groups a step); max_tokens:
        rollout.max_new_tokens (a longer expert could not have been generated)."""
        self.tokenizer, self.score, self.seed, self.max_tokens = tokenizer, score, seed, max_tokens
        self.dist = dist or Dist()
        self.scheduler = Scheduler(trigger, seed=seed)
        self.loss = MentorLossConfig(mode="shaping", max_replace=1, shaping_gamma=cfg.gamma)

    def expert(self, group: Group, policy_version: int) -> Rollout | None:
        """The worked solution as a completion of the group's prompt (unscored); None when the
        problem has none or it is too long to have been generated."""
        text = task_of(group.problem).worked_solution(group.problem)
        if text is None:
            return None
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"] + [self.tokenizer.eos_token_id]
        if len(ids) > self.max_tokens:
            return None
        # The sampler's log-probs are unknown (log 1: the expert wrote it); the update recomputes
        # pi_old under the prompt, since the sequence was not sampled there (behaviour_prompt_ids).
        return Rollout(problem=group.problem, group_id=group.group_id, prompt_ids=list(group.prompt_ids),
                       completion_ids=ids, sampler_logprobs=[0.0] * len(ids), text=text,
                       finish_reason="stop", policy_version=policy_version, origin="expert")

    def before_rollout(self, step: int, problems: list[Problem], policy_version: int) -> RolloutPlan:
        return RolloutPlan(problems)

    def after_score(self, step: int, groups: list[Group], rider_samples, policy_version: int):
        plan = self._plan(groups, step)
        experts: dict[int, Rollout] = {}
        missing = 0
        for group, _ in plan.selected:
            r = self.expert(group, policy_version)
            if r is None:
                missing += 1
            else:
                experts[group.group_id] = r
        if experts:
            self.score(list(experts.values()))
        passing = {gid: [r] for gid, r in experts.items() if r.correct}
        out = assemble_groups(groups, passing, LossMode.SHAPING, self.loss.max_replace,
                              seed=self.seed * 1_000_003 + step)
        out = [treat(g, self.loss) if g.group_id in passing else g for g in out]
        for group, _ in plan.selected:
            self.scheduler.record(group.problem.id, rescued=group.group_id in passing, level=None)
        self.scheduler.exchange(self.dist)
        metrics = {
            "luffy/selected": float(len(plan.selected)),
            "luffy/inserted": float(len(passing)),
            "luffy/expert_wrong": float(len(experts) - len(passing)),
            "luffy/too_long": float(missing),
            "luffy/expert_tokens": float(sum(len(rs[0].completion_ids) for rs in passing.values())),
            "luffy/collapse_event": float(plan.collapse_event),
        }
        return out, metrics

    def _plan(self, groups: list[Group], step: int):
        """The scheduler's pick; across ranks it observes every rank's groups and this rank keeps
        the selected groups it holds (as MENTOR's does)."""
        return self.scheduler.plan_held(groups, step, every_rank(groups, self.dist))

    def state_dict(self) -> dict[str, Any]:
        return {"scheduler": self.scheduler.state_dict()}

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        if state is not None:
            self.scheduler.load_state_dict(state["scheduler"])

    def regroup(self, states: list[Any], holds) -> Any:
        return states[0]  # the scheduler's state is the same on every rank

    def close(self) -> None:
        pass


def build(ctx: MethodContext) -> LuffyMethod:
    cfg = ctx.cfg
    return LuffyMethod(cfg.luffy, cfg.recovery.trigger, ctx.tokenizer, ctx.score, seed=cfg.seed,
                       max_tokens=cfg.rollout.max_new_tokens, dist=ctx.dist)
