"""The MENTOR step: schedule -> diagnose -> instruct -> guard -> re-roll (escalating) -> assemble.

Synchronous: `intervene(...)`. Async split: `write_hints` (no policy access unless backend=self, so
it can run in a background thread) then `reroll` and `finish` on the trainer's thread.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from mentor_fast.algo.assemble import LossMode, assemble_groups
from mentor_fast.config import MentorConfig
from mentor_fast.mentor.agents import Agents, Failed, MentorBackend
from mentor_fast.mentor.backends import as_agents, build_backend
from mentor_fast.mentor.diagnosis import Diagnosis, FailureCase
from mentor_fast.mentor.guard import LeakGuard
from mentor_fast.mentor.reference import ReferenceMentor
from mentor_fast.mentor.report import dump_row, step_metrics
from mentor_fast.mentor.scheduler import MAX_LEVEL, Scheduler, StepPlan
from mentor_fast.types import ExtraTerm, Group, GroupSummary, Hint, Rollout, Sample, TokenWeighting

GenerateFn = Callable[[list[list[int]], Any], list[list[Sample]]]  # (prompts, SamplingParams) -> [B][n]
ScoreFn = Callable[[list[Rollout]], Any]  # fills reward / correct / verifier_note in place


@dataclass
class Intervention:
    """One all-fail group the mentor took on, and everything that happened to it."""

    group: Group
    step: int
    level: int  # the current hint level (starting level, then escalations)
    case: FailureCase
    diagnosis: Diagnosis | None = None
    hint: Hint | None = None  # the current hint; None: no (further) hint for this group
    hints: list[Hint] = field(default_factory=list)  # hints that reached the learner, one per round
    verdicts: list[dict[str, Any]] = field(
        default_factory=list
    )  # every guarded hint: level, hint, ok, gate, detail
    rounds: list[list[Rollout]] = field(default_factory=list)  # re-rolls per round
    rescued: bool = False
    rescue_level: int | None = None
    no_hint_reason: str | None = None  # garbage, error, guard, deadline, too_long
    cut: int = 0  # re-rolls cut by mentor.reroll.horizon: dropped unscored, in no round
    garbage: int = 0
    latency_s: float = 0.0
    policy_version: int | None = None

    @property
    def rerolls(self) -> list[Rollout]:
        return [r for rs in self.rounds for r in rs]

    def candidates(self, mode: LossMode | str) -> list[Rollout]:
        """What assembly gets: replace -> every re-roll; group -> the first round with a success."""
        if LossMode(mode) == LossMode.GROUP:
            return next((rs for rs in self.rounds if any(r.correct for r in rs)), [])
        return self.rerolls


@dataclass
class RerollRequest:
    """One round of re-rolls: the interventions whose q + hint prompts are `prompts`, and the
    sampling parameters (n = re-rolls per group, the round's seed)."""

    active: list[Intervention]
    prompts: list[list[int]]
    params: Any


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

    backend: a text backend (self/local/openai, wrapped in LLMAgents), `ReferenceMentor`, or ready
    agents. builder: `encode(problem, hint) -> ids` (the PromptBuilder contract; a ValueError or a
    prompt over `builder.max_prompt_tokens` means no re-roll for that hint, counted as too_long).
    decode: completion ids -> text (default: builder.tokenizer.decode). Sampling, attempt and
    scheduling knobs come from `cfg` (MentorConfig). Not thread-safe against itself except for
    the documented split: `write_hints` (any thread) then `reroll` + `finish` (the trainer's).
    """

    def __init__(
        self,
        cfg: MentorConfig,
        backend: MentorBackend | ReferenceMentor | Agents,
        builder: Any,
        *,
        decode: Callable[[list[int]], str] | None = None,
        guard: LeakGuard | None = None,
        seed: int = 0,
    ) -> None:
        a = cfg.agents
        self.cfg, self.builder, self.seed, self.task, self.attempts_k = cfg, builder, seed, cfg.task, a.attempts
        self.backend = backend
        self.agents = as_agents(
            backend, fused=a.fused_call, temperature=a.temperature, attempt_chars=a.attempt_chars,
            max_tokens=a.max_tokens, hint_max_tokens=a.hint_max_tokens,
        )
        self.decode = decode or _tokenizer_decode(builder)
        self.guard = guard or LeakGuard()
        self.scheduler = Scheduler(cfg.trigger, seed=seed)
        self._plans: dict[int, StepPlan] = {}
        self._lock = threading.Lock()

    @classmethod
    def from_config(
        cls,
        cfg: MentorConfig,
        builder: Any,
        *,
        engine: Any = None,
        tokenizer: Any = None,
        seed: int = 0,
        device: str = "cpu",
        **kwargs: Any,
    ) -> Mentor:
        backend = build_backend(cfg.agents, engine=engine, tokenizer=tokenizer, seed=seed, device=device)
        return cls(cfg, backend, builder, seed=seed, **kwargs)

    # ------------------------------------------------------------ hints
    def plan(self, groups: list[Group], step: int, everyone: list[GroupSummary] | None = None) -> StepPlan:
        """The scheduler's pick among the step's groups. Across ranks `everyone` is every rank's
        groups (the scheduler observes them all, the same way on every rank) and the plan keeps
        the selected groups of this rank's `groups`."""
        if everyone is None:
            return self.scheduler.plan(groups, step)
        plan = self.scheduler.plan(everyone, step)
        mine = {g.group_id: g for g in groups}
        plan.selected_total = len(plan.selected)
        plan.selected = [(mine[s.group_id], level) for s, level in plan.selected if s.group_id in mine]
        return plan

    def write_hints(self, groups: list[Group], step: int, plan: StepPlan | None = None) -> list[Intervention]:
        """Pass every scored group of the step (the scheduler observes them all), or the step's
        `plan` made already; returns one Intervention per selected all-fail group, with a guarded
        hint or a reason for none."""
        t0 = time.monotonic()
        plan = plan if plan is not None else self.scheduler.plan(groups, step)
        ivs = [
            Intervention(
                g,
                step,
                level,
                FailureCase.from_group(
                    g, self.attempts_k, self.scheduler.previous_hints(g.problem.id), self.task
                ),
            )
            for g, level in plan.selected
        ]
        if ivs:
            for iv, d in zip(ivs, self.agents.diagnose([iv.case for iv in ivs])):
                if isinstance(d, Failed):
                    self._fail(iv, d.reason)
                else:
                    iv.diagnosis = d
            self._write(
                [iv for iv in ivs if iv.diagnosis is not None], t0 + self.cfg.agents.timeout_s, allow_lower=True
            )
        plan.latency_s = time.monotonic() - t0
        for iv in ivs:
            iv.latency_s = plan.latency_s
        with self._lock:
            self._plans[step] = plan
        return ivs

    def _fail(self, iv: Intervention, reason: str) -> None:
        iv.hint = None
        iv.no_hint_reason = reason
        iv.garbage += reason == "garbage"

    def _write(self, ivs: list[Intervention], deadline: float, allow_lower: bool) -> None:
        """Instruct at each iv.level and guard. On a reject: regenerate once with the reason (LLM
        agents), then one level lower (if allowed), then no hint."""
        todo = [(iv, iv.level, None, 0) for iv in ivs]  # (intervention, level, feedback, stage)
        while todo:
            if time.monotonic() > deadline:
                for iv, *_ in todo:
                    self._fail(iv, "deadline")
                return
            texts = self.agents.instruct(
                [t[0].case for t in todo],
                [t[0].diagnosis for t in todo],
                [t[1] for t in todo],
                [t[2] for t in todo],
            )
            retry = []
            for (iv, level, _, stage), text in zip(todo, texts):
                if isinstance(text, Failed):
                    self._fail(iv, text.reason)
                    continue
                p = iv.group.problem
                v = self.guard.check(
                    text, p.gold, p.solution_steps, self.task, level, p.code, question=p.question
                )
                iv.verdicts.append(
                    {"level": level, "hint": text, "ok": v.ok, "gate": v.gate, "detail": v.detail}
                )
                if v.ok:
                    iv.hint = Hint(text, level, iv.diagnosis.to_dict(), self.agents.name)
                    iv.level, iv.no_hint_reason = level, None
                elif stage == 0 and self.agents.regenerates:
                    retry.append((iv, level, v.detail, 1))
                elif stage < 2 and allow_lower and level > 1:
                    retry.append((iv, level - 1, None, 2))
                else:
                    self._fail(iv, "guard")
            todo = retry

    def _escalate(self, ivs: list[Intervention]) -> list[Intervention]:
        up = [iv for iv in ivs if iv.level < MAX_LEVEL]
        for iv in up:
            iv.case.previous_hints.append(iv.hint.text)
            iv.level += 1
            iv.hint = None
        self._write(up, time.monotonic() + self.cfg.agents.timeout_s, allow_lower=False)
        return [iv for iv in up if iv.hint is not None]

    # ------------------------------------------------------------ re-rolls
    def _rerolls_per_round(self, ivs: list[Intervention]) -> int:
        if LossMode(self.cfg.loss.mode) != LossMode.GROUP:
            return self.cfg.reroll.count
        sizes = {len(iv.group.rollouts) for iv in ivs}
        if len(sizes) > 1:
            raise ValueError(
                f"loss_mode=group re-rolls G per group, but the groups have sizes {sorted(sizes)}"
            )
        return sizes.pop() if sizes else self.cfg.reroll.count

    def _encode(self, iv: Intervention) -> list[int] | None:
        try:
            ids = self.builder.encode(iv.group.problem, iv.hint.text)
        except ValueError:  # the builder refuses prompts over its limit
            ids = None
        limit = getattr(self.builder, "max_prompt_tokens", None)
        if ids is None or (limit is not None and len(ids) > limit):
            self._fail(iv, "too_long")
            return None
        return ids

    def first_round(self, interventions: list[Intervention], params: Any) -> RerollRequest:
        """Round 0's prompts and sampling parameters, for a caller that generates them together with
        other work (the async trainer merges them into the next step's initial generate call).
        Pass the request and its samples to `reroll(..., first=(request, samples))`."""
        return self._request([iv for iv in interventions if iv.hint is not None], params, 0)

    def _request(self, active: list[Intervention], params: Any, rnd: int) -> RerollRequest:
        prompts = {id(iv): self._encode(iv) for iv in active}
        active = [iv for iv in active if prompts[id(iv)] is not None]
        # streams keyed by group id: a group re-rolls the same on whichever rank holds it
        round_params = dataclasses.replace(
            params, n=self._rerolls_per_round(active), seed=params.seed + 10_007 * (rnd + 1),
            keys=tuple(iv.group.group_id for iv in active),
        )
        return RerollRequest(active, [prompts[id(iv)] for iv in active], round_params)

    def reroll(
        self,
        interventions: list[Intervention],
        generate_fn: GenerateFn,
        score_fn: ScoreFn,
        params: Any,
        policy_version: int | None = None,
        first: tuple[RerollRequest, list[list[Sample]]] | None = None,
    ) -> list[Intervention]:
        """Re-roll every hinted group under q + hint (one batched generate call per round), score,
        and escalate the level of groups with no success, for up to `max_rounds` rounds. `first`:
        round 0 already generated elsewhere (see `first_round`)."""
        t0, esc_s = time.monotonic(), 0.0
        active = [iv for iv in interventions if iv.hint is not None]
        for rnd in range(self.cfg.reroll.max_rounds):
            if rnd > 0:
                t_esc = time.monotonic()
                active = self._escalate([iv for iv in active if not iv.rescued])
                esc_s += time.monotonic() - t_esc
            if rnd == 0 and first is not None:
                request, samples = first
            else:
                request = self._request(active, params, rnd)
                samples = generate_fn(request.prompts, request.params) if request.active else []
            active, m = request.active, request.params.n
            if not active:
                break
            if len(samples) != len(active) or any(len(ss) != m for ss in samples):
                raise ValueError(
                    f"generate_fn returned {[len(ss) for ss in samples]} samples for "
                    f"{len(active)} prompts x n={m}"
                )
            new: list[Rollout] = []
            for iv, ids, ss in zip(active, request.prompts, samples):
                # A re-roll cut by the horizon has no answer yet: it is neither a failure nor trained on.
                iv.cut += sum(s.finish_reason == "cut" for s in ss)
                iv.rounds.append([self._rollout(iv, ids, s) for s in ss if s.finish_reason != "cut"])
                iv.hints.append(iv.hint)
                iv.policy_version = policy_version
                new.extend(iv.rounds[-1])
            score_fn(new)
            for iv in active:
                if any(r.correct for r in iv.rounds[-1]):
                    iv.rescued, iv.rescue_level = True, iv.hint.level
            active = [iv for iv in active if not iv.rescued]
        for iv in interventions:
            if iv.hints:
                used = next((h for h in iv.hints if h.level == iv.rescue_level), iv.hints[-1])
                self.scheduler.record(
                    iv.group.problem.id, rescued=iv.rescued, level=iv.rescue_level, hint=used.text
                )
        with self._lock:
            plan = self._plans.get(interventions[0].step) if interventions else None
        if plan is not None:
            plan.latency_s += esc_s
            plan.reroll_s = time.monotonic() - t0 - esc_s
        return interventions

    def _rollout(self, iv: Intervention, prompt_ids: list[int], s: Sample) -> Rollout:
        return Rollout(
            problem=iv.group.problem,
            group_id=iv.group.group_id,
            prompt_ids=list(prompt_ids),
            completion_ids=list(s.token_ids),
            sampler_logprobs=list(s.logprobs),
            text=self.decode(s.token_ids),
            finish_reason=s.finish_reason,
            policy_version=s.policy_version,
            origin="mentor",
            hint=iv.hint,
        )

    # ------------------------------------------------------------ assembly, metrics, dumps
    def finish(
        self, groups: list[Group], interventions: list[Intervention], step: int | None = None
    ) -> MentorOutcome:
        """Assemble the batch (mentor.loss.mode), mark the inserted re-rolls with their loss treatment,
        and report the step's metrics and dump rows."""
        if step is None:
            step = interventions[0].step if interventions else -1
        with self._lock:
            plan = self._plans.pop(step, None)
        lc = self.cfg.loss
        cands = {iv.group.group_id: iv.candidates(lc.mode) for iv in interventions if iv.rescued}
        out = assemble_groups(groups, cands, lc.mode, lc.max_replace, seed=self.seed * 1_000_003 + step)
        out = [self._treat(g) if g.group_id in cands else g for g in out]
        rows = [dump_row(iv) for iv in interventions] if self.cfg.dump else []
        metrics = step_metrics(plan, interventions, out, self.scheduler.graduations, self._backend_counts())
        return MentorOutcome(out, metrics, rows, interventions)

    def _treat(self, group: Group) -> Group:
        """The loss treatment of mentor.loss, as data on each inserted re-roll (the update reads it and
        knows nothing of MENTOR): transfer and shaping weigh the policy term per token
        (algo/weights.py); distillation adds a term that pulls the bare prompt toward the hinted
        context along the re-roll (algo/terms.py)."""
        lc = self.cfg.loss
        weighting = {"transfer": TokenWeighting("truncated_is", lc.transfer_is_cap),
                     "shaping": TokenWeighting("shaping", lc.shaping_gamma)}.get(lc.mode)
        rollouts = []
        for r in group.rollouts:
            if r.origin == "mentor":
                hinted = r.behaviour_prompt_ids or r.prompt_ids
                terms = ()
                if lc.distill_coef > 0 and LossMode(lc.mode) != LossMode.GROUP and hinted != group.prompt_ids:
                    terms = (ExtraTerm("distill", lc.distill_coef, tuple(group.prompt_ids)),)
                if weighting is not None or terms:
                    r = dataclasses.replace(r, weighting=weighting, extra_terms=terms)
            rollouts.append(r)
        return Group(group.group_id, group.problem, group.prompt_ids, rollouts)

    def intervene(
        self,
        groups: list[Group],
        step: int,
        generate_fn: GenerateFn,
        score_fn: ScoreFn,
        params: Any,
        policy_version: int | None = None,
        everyone: list[GroupSummary] | None = None,
    ) -> MentorOutcome:
        """The synchronous MENTOR step: plan + write_hints + reroll + finish."""
        ivs = self.write_hints(groups, step, self.plan(groups, step, everyone))
        self.reroll(ivs, generate_fn, score_fn, params, policy_version)
        return self.finish(groups, ivs, step)

    # ------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict[str, Any]:
        return {"scheduler": self.scheduler.state_dict()}

    def pending_state(self, step: int) -> dict[str, Any]:
        """What `finish` of a step whose hints are written but not yet used will read: the step's
        plan (its all-fail fraction, collapse and surge flags) and the text backend's counts."""
        with self._lock:
            plan = self._plans.get(step)
        counts = self._backend_counts()
        return {"plan": plan, "counts": counts.snapshot() if counts is not None else None}

    def restore_pending(self, step: int, state: dict[str, Any]) -> None:
        if state.get("plan") is not None:
            with self._lock:
                self._plans[step] = state["plan"]
        counts = self._backend_counts()
        if counts is not None and state.get("counts") is not None:
            counts.restore(state["counts"])

    def drop_pending(self, step: int) -> None:
        """Forget a step whose hints will not be used (too stale)."""
        with self._lock:
            self._plans.pop(step, None)

    def _backend_counts(self):
        return getattr(getattr(self.agents, "backend", self.agents), "counts", None)  # the text backend's

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.scheduler.load_state_dict(state["scheduler"])
