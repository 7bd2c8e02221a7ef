"""The MENTOR step: schedule -> diagnose -> instruct -> guard -> re-roll (escalating) -> assemble.

Synchronous: `intervene(...)`. Split (mentor/method.py runs the parts when its schedule says):
`write_hints` (no policy access unless backend=self, so it can run in a background thread) returns
the step's `HintedStep`, which the caller holds until `reroll` and `finish` on the trainer's thread.
The mentor keeps no per-step state of its own.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from mentor_fast.config import MentorConfig, RecoveryConfig
from mentor_fast.mentor.backends import as_agents, build_backend
from mentor_fast.mentor.cases import FailureCase
from mentor_fast.mentor.diagnosis import Diagnosis
from mentor_fast.mentor.guard import LeakGuard
from mentor_fast.mentor.report import dump_row, step_metrics
from mentor_fast.mentor.writers.base import Agents, Failed, MentorBackend
from mentor_fast.mentor.writers.blind import BlindAgents
from mentor_fast.mentor.writers.solutions import WorkedSolutions
from mentor_fast.recovery.intervention import Intervention
from mentor_fast.recovery.levels import MAX_LEVEL
from mentor_fast.recovery.plain import from_plain, to_plain
from mentor_fast.recovery.rerolls import GenerateFn, RerollRequest, Rerolls, Scorer
from mentor_fast.recovery.rescue import assemble_rescues
from mentor_fast.recovery.scheduler import Scheduler, StepPlan
from mentor_fast.types import Group, GroupSummary, Hint, Sample


@dataclass
class HintedStep:
    """A step's hints from `write_hints` to `finish`: the step's scored groups, the scheduler's plan
    (which `finish` reports, with the time spent writing and re-rolling added on the way) and one
    Intervention per selected all-fail group."""

    step: int
    groups: list[Group]
    plan: StepPlan
    interventions: list[Intervention]

    def state(self) -> dict[str, Any]:
        """Plain data (recovery/plain.py): the groups once, the plan and the interventions naming
        theirs by group id."""
        plan = to_plain(dataclasses.replace(self.plan, selected=[]))
        plan["selected"] = [[g.group_id, level] for g, level in self.plan.selected]
        ivs = []
        for iv in self.interventions:
            ivs.append({**to_plain(dataclasses.replace(iv, group=None)), "group": iv.group.group_id})
        return {"step": self.step, "groups": to_plain(self.groups), "plan": plan, "interventions": ivs}

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> HintedStep:
        groups = from_plain(list[Group], state["groups"])
        held = {g.group_id: g for g in groups}
        # resumed on other ranks, the plan is rank 0's: it keeps the selected groups this rank holds
        selected = [(held[gid], level) for gid, level in state["plan"]["selected"] if gid in held]
        plan = from_plain(StepPlan, state["plan"], selected=selected)
        ns = {"FailureCase": FailureCase, "Diagnosis": Diagnosis}  # intervention.py's, for type checking only
        ivs = [from_plain(Intervention, d, ns, group=held[d["group"]]) for d in state["interventions"]]
        return cls(state["step"], groups, plan, ivs)


@dataclass
class MentorOutcome:
    groups: list[Group]  # the batch after assembly
    metrics: dict[str, float]
    dump_rows: list[dict[str, Any]]
    interventions: list[Intervention]


def _tokenizer_decode(builder: Any) -> Callable[[list[int]], str]:
    tok = getattr(builder, "tokenizer", None)
    if tok is None:
        raise ValueError("Mentor needs `decode=` when the prompt builder has no `.tokenizer`")
    return lambda ids: tok.decode(ids, skip_special_tokens=True)


class Mentor:
    """MENTOR wired together: scheduler, agents (backend), leak guard, re-rolls, assembly.

    cfg: the mentor section (each problem's task is its own: mentor_fast/tasks/). budget: the run's recovery section (which
    groups a step, budget.trigger; how it re-rolls them, budget.reroll). backend: a text backend
    (self/local/openai, wrapped in LLMAgents), `WorkedSolutions`, or ready agents (blind to the
    attempts with cfg.agents.blind). scheduler: default, one of budget.trigger. builder:
    `encode(problem, hint) -> ids` (the PromptBuilder contract, see `Rerolls`). decode: completion
    ids -> text (default: builder.tokenizer.decode). Not thread-safe against itself except for the
    documented split: `write_hints` (any thread) then `reroll` + `finish` (the trainer's).
    """

    def __init__(
        self,
        cfg: MentorConfig,
        budget: RecoveryConfig,
        backend: MentorBackend | WorkedSolutions | Agents,
        builder: Any,
        *,
        decode: Callable[[list[int]], str] | None = None,
        guard: LeakGuard | None = None,
        scheduler: Scheduler | None = None,
        seed: int = 0,
    ) -> None:
        a = cfg.agents
        self.cfg, self.budget, self.builder, self.seed = cfg, budget, builder, seed
        self.backend = backend
        self.agents = as_agents(
            backend, fused=a.fused_call, temperature=a.temperature, attempt_chars=a.attempt_chars,
            max_tokens=a.max_tokens, hint_max_tokens=a.hint_max_tokens,
        )
        if a.blind:
            self.agents = BlindAgents(self.agents)
        self.decode = decode or _tokenizer_decode(builder)
        self.guard = guard or LeakGuard()
        self.scheduler = scheduler or Scheduler(budget.trigger, seed=seed)
        self.rerolls = Rerolls(budget.reroll, cfg.loss.mode, builder, self.decode)

    @classmethod
    def from_config(cls, cfg: MentorConfig, budget: RecoveryConfig, builder: Any, *, engine: Any = None,
                    tokenizer: Any = None, seed: int = 0, device: str = "cpu", **kwargs: Any) -> Mentor:
        backend = build_backend(cfg.agents, engine=engine, tokenizer=tokenizer, seed=seed, device=device)
        return cls(cfg, budget, backend, builder, seed=seed, **kwargs)

    # ------------------------------------------------------------ hints
    def plan(self, groups: list[Group], step: int, everyone: list[GroupSummary] | None = None) -> StepPlan:
        """The scheduler's pick among the step's groups. Across ranks `everyone` is every rank's
        groups (the scheduler observes them all, the same way on every rank) and the plan keeps
        the selected groups of this rank's `groups`."""
        return self.scheduler.plan_held(groups, step, everyone)

    def write_hints(self, groups: list[Group], step: int, plan: StepPlan | None = None) -> HintedStep:
        """Pass every scored group of the step (the scheduler observes them all), or the step's
        `plan` made already; one Intervention per selected all-fail group, with a guarded hint or
        a reason for none."""
        t0 = time.monotonic()
        plan = plan if plan is not None else self.scheduler.plan(groups, step)
        k = self.cfg.agents.attempts
        ivs = [
            Intervention(g, step, level, FailureCase.from_group(
                g, k, self.scheduler.previous_hints(g.problem.id)))
            for g, level in plan.selected
        ]
        if ivs:
            for iv, d in zip(ivs, self.agents.diagnose([iv.case for iv in ivs])):
                if isinstance(d, Failed):
                    iv.fail(d.reason)
                else:
                    iv.diagnosis = d
            self._write([iv for iv in ivs if iv.diagnosis is not None], t0 + self.cfg.agents.timeout_s,
                        allow_lower=True)
        plan.latency_s = time.monotonic() - t0
        for iv in ivs:
            iv.latency_s = plan.latency_s
        return HintedStep(step, groups, plan, ivs)

    def _write(self, ivs: list[Intervention], deadline: float, allow_lower: bool) -> None:
        """Instruct at each iv.level and guard. On a reject: regenerate once with the reason (LLM
        agents), then one level lower (if allowed), then no hint."""
        todo = [(iv, iv.level, None, 0) for iv in ivs]  # (intervention, level, feedback, stage)
        while todo:
            if time.monotonic() > deadline:
                for iv, *_ in todo:
                    iv.fail("deadline")
                return
            texts = self.agents.instruct([t[0].case for t in todo], [t[0].diagnosis for t in todo],
                                         [t[1] for t in todo], [t[2] for t in todo])
            retry = []
            for (iv, level, _, stage), text in zip(todo, texts):
                if isinstance(text, Failed):
                    iv.fail(text.reason)
                elif self._guarded(iv, level, text):
                    continue
                elif stage == 0 and self.agents.regenerates:
                    retry.append((iv, level, iv.verdicts[-1]["detail"], 1))
                elif stage < 2 and allow_lower and level > 1:
                    retry.append((iv, level - 1, None, 2))
                else:
                    iv.fail("guard")
            todo = retry

    def _guarded(self, iv: Intervention, level: int, text: str) -> bool:
        """Guard `text` as iv's hint at `level`; True (and the hint set) when it passes."""
        p = iv.group.problem
        v = self.guard.check(text, p.gold, p.solution_steps, iv.case.kind, level, p.code, question=p.question)
        iv.verdicts.append({"level": level, "hint": text, "ok": v.ok, "gate": v.gate, "detail": v.detail})
        if v.ok:
            iv.hint = Hint(text, level, iv.diagnosis.to_dict(), self.agents.name)
            iv.level, iv.no_hint_reason = level, None
        return v.ok

    def _escalate(self, ivs: list[Intervention]) -> list[Intervention]:
        up = [iv for iv in ivs if iv.level < MAX_LEVEL]
        for iv in up:
            iv.case.previous_hints.append(iv.hint.text)
            iv.level += 1
            iv.hint = None
        self._write(up, time.monotonic() + self.cfg.agents.timeout_s, allow_lower=False)
        return [iv for iv in up if iv.hint is not None]

    # ------------------------------------------------------------ re-rolls
    def first_round(self, hinted: HintedStep, params: Any) -> RerollRequest:
        """Round 0 of the step's hints, for a caller that generates it with other work."""
        return self.rerolls.first_round(hinted.interventions, params)

    def reroll(self, hinted: HintedStep, generate_fn: GenerateFn, score_fn: Scorer, params: Any,
               policy_version: int | None = None,
               first: tuple[RerollRequest, list[list[Sample]]] | None = None) -> None:
        """Re-roll the step's hinted groups (recovery/rerolls.py; a group with no success gets the next
        level's hint), and record each outcome in the scheduler's memory. `first`: round 0
        generated elsewhere (see `first_round`)."""
        t0 = time.monotonic()
        esc_s = self.rerolls.run(hinted.interventions, generate_fn, score_fn, params, self._escalate,
                                 policy_version, first)
        for iv in hinted.interventions:
            if iv.hints:
                used = next((h for h in iv.hints if h.level == iv.rescue_level), iv.hints[-1])
                self.scheduler.record(iv.group.problem.id, rescued=iv.rescued, level=iv.rescue_level, hint=used.text)
        hinted.plan.latency_s += esc_s
        hinted.plan.reroll_s = time.monotonic() - t0 - esc_s

    # ------------------------------------------------------------ assembly, metrics, dumps
    def finish(self, hinted: HintedStep) -> MentorOutcome:
        """Assemble the batch (mentor.loss.mode, each inserted re-roll marked with its loss
        treatment), and report the step's metrics and dump rows."""
        ivs = hinted.interventions
        out = assemble_rescues(hinted.groups, ivs, self.cfg.loss, seed=self.seed * 1_000_003 + hinted.step)
        rows = [dump_row(iv) for iv in ivs] if self.cfg.dump else []
        metrics = step_metrics(hinted.plan, ivs, out, self.scheduler.graduations, self.backend_counts)
        return MentorOutcome(out, metrics, rows, ivs)

    def intervene(self, groups: list[Group], step: int, generate_fn: GenerateFn, score_fn: Scorer, params: Any,
                  policy_version: int | None = None, everyone: list[GroupSummary] | None = None) -> MentorOutcome:
        """The synchronous MENTOR step: plan + write_hints + reroll + finish."""
        hinted = self.write_hints(groups, step, self.plan(groups, step, everyone))
        self.reroll(hinted, generate_fn, score_fn, params, policy_version)
        return self.finish(hinted)

    # ------------------------------------------------------------ checkpoints
    @property
    def backend_counts(self):
        """The text backend's counts (requests, retries, errors), drained into each step's metrics."""
        return getattr(getattr(self.agents, "backend", self.agents), "counts", None)

    def state_dict(self) -> dict[str, Any]:
        return {"scheduler": self.scheduler.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.scheduler.load_state_dict(state["scheduler"])
