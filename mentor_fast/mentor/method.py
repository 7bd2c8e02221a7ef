"""MENTOR as the trainer's method (mentor_fast/method.py): when the mentor's parts run, and the hints
in flight between them.

`recovery.reroll.schedule` picks an entry of SCHEDULES. in_step: after scoring, the step's all-fail
groups are diagnosed, hinted, re-rolled (escalating) and assembled into the step's own batch. The
others defer: the hints for step t's failures are written in a background thread while step t's
update runs. At step t+1 they are taken (`before_rollout`, waiting if need be) and their first
re-roll round rides in t+1's initial generate call, sampled by the next policy version, on top of
the step's rows (next_step_extra_rows) or in the rows of its last prompts (next_step_shared_rows),
cut at `recovery.reroll.horizon` if set; or the round was generated beside t's update, by the policy
before it (during_update). After scoring (`after_score`) later rounds run, the rescued groups are
assembled and join t+1's batch, and t+1's own failures go to the background. Hints whose failed
rollouts are more than `recovery.reroll.max_staleness` versions old are dropped
(mentor/stale_dropped). A checkpoint keeps the hints in flight (their step's plan included) and the
backend's counts, so a resumed run logs what the uninterrupted one would.

Across ranks (mentor_fast/dist.py) each rank writes the hints for, and re-rolls, the all-fail
groups it holds, with its own backend (worked_solutions needs nothing else; `self` writes with the
rank's own engine). What must agree is global: the scheduler sees every rank's groups
(summaries), so the collapse detector reads the step's all-fail fraction over all ranks and the
budget is a share of all the step's groups; the outcomes each rank records are exchanged, so the
scheduler's memory is the same everywhere; mentor.jsonl rows are gathered to rank 0.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mentor_fast.config.recovery import RerollSchedule
from mentor_fast.dist import Dist
from mentor_fast.mentor.backends import BackendKind
from mentor_fast.mentor.pipeline import HintedStep, Mentor, MentorOutcome
from mentor_fast.mentor.report import METRICS
from mentor_fast.method import MethodContext, RolloutPlan, Sampling
from mentor_fast.recovery.rerolls import RerollRequest, Scorer
from mentor_fast.recovery.scheduler import every_rank
from mentor_fast.rollout.base import RolloutEngine
from mentor_fast.types import Group, GroupSummary, Problem, Sample


@dataclass(frozen=True)
class Schedule:
    """When a step's hints and their first re-roll round are made (recovery.reroll.schedule)."""

    deferred: bool  # step t's hints are written beside t's update and used at t+1 (else: within t)
    background_round: bool  # the first round is generated beside t's update too (else: it rides in t+1's call)
    shared_rows: bool  # a riding round takes the rows of t+1's last prompts (else: rows of its own)


SCHEDULES: dict[RerollSchedule, Schedule] = {
    RerollSchedule.IN_STEP: Schedule(deferred=False, background_round=False, shared_rows=False),
    RerollSchedule.NEXT_STEP_EXTRA_ROWS: Schedule(deferred=True, background_round=False, shared_rows=False),
    RerollSchedule.NEXT_STEP_SHARED_ROWS: Schedule(deferred=True, background_round=False, shared_rows=True),
    RerollSchedule.DURING_UPDATE: Schedule(deferred=True, background_round=True, shared_rows=False),
}


@dataclass
class _Taken:
    """A step's hints taken at the next step, with their first round: its request and, when it was
    generated beside the last update, its samples (None: it rides in this step's call)."""

    hinted: HintedStep
    request: RerollRequest
    samples: list[list[Sample]] | None
    wait_s: float  # how long the trainer waited for the hints


class MentorMethod:
    """The plug-in: `mentor` writes hints and re-rolls; this decides when, and holds what is in flight:
    at most one step's hints being written (`_pending`, a future of (HintedStep, request, samples))
    and, within a step, the hints taken for it (`_taken`).

    engine: the rollout engine (`generate_many`); score: fills reward/correct of rollouts in place;
    sampling(step, stream): the step's sampling parameters (stream 1: re-rolls);
    num_generations: G (shared rows skip whole prompts of G rows); dump_path: mentor.jsonl
    (written by rank 0); dist: the ranks.
    """

    metrics = METRICS

    def __init__(self, mentor: Mentor, engine: RolloutEngine, score: Scorer, sampling: Sampling,
                 num_generations: int, dump_path: Path | None = None, dist: Dist | None = None):
        self.mentor, self.engine, self.score, self.sampling = mentor, engine, score, sampling
        self.cfg, self.reroll = mentor.cfg, mentor.budget.reroll
        self.num_generations, self.dump_path = num_generations, dump_path
        self.dist = dist or Dist()
        self.schedule = SCHEDULES[RerollSchedule(self.reroll.schedule)]
        self._rows: list[dict] = []  # this step's mentor.jsonl rows
        # backend=self writes hints with the policy itself, so it cannot run beside the update; a
        # background round can (the engine then has GPUs of its own).
        self._writes_with_policy = BackendKind(self.cfg.agents.backend) == BackendKind.SELF
        beside = self.schedule.deferred and (not self._writes_with_policy or self.schedule.background_round)
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="mentor") if beside else None
        self._pending: Future | None = None
        self._taken: _Taken | None = None

    # ---------------------------------------------------------------- the step
    def before_rollout(self, step: int, problems: list[Problem], policy_version: int) -> RolloutPlan:
        metrics: dict[str, float] = {}
        taken = self._take(policy_version, metrics) if self.schedule.deferred else None
        if taken is None:
            return RolloutPlan(problems, metrics=metrics)
        self._taken = taken
        request = taken.request
        rows = len(request.prompts) * request.params.n
        if taken.samples is not None:  # generated beside the last update: nothing rides
            metrics["mentor/background_rerolls"] = float(rows)
            return RolloutPlan(problems, metrics=metrics)
        metrics["mentor/merged_rerolls"] = float(rows)
        if self.schedule.shared_rows:  # the re-rolls take the rows of the last prompts
            skip = min(math.ceil(rows / self.num_generations), len(problems) - 1)
            problems = problems[: len(problems) - skip]
            metrics["mentor/prompts_skipped"] = float(skip)
        rider = dataclasses.replace(request.params, horizon=self.reroll.horizon)
        return RolloutPlan(problems, riders=[(request.prompts, rider)], metrics=metrics)

    def after_score(self, step: int, groups: list[Group], rider_samples: list[list[list[Sample]]],
                    policy_version: int) -> tuple[list[Group], dict[str, float]]:
        if not self.schedule.deferred:
            return self._in_step(step, groups, policy_version)
        metrics: dict[str, float] = {}
        carried: list[Group] = []
        if self._taken is not None:
            carried = self._finish_taken(rider_samples, policy_version, metrics)
        metrics["off_policy/max_lag"] = float(max(
            (policy_version - ro.policy_version for g in carried for ro in g.rollouts), default=0))
        self.mentor.scheduler.exchange(self.dist)  # every rank's outcomes before the next plan
        self._flush_rows()
        self._defer(groups, step)
        return groups + carried, metrics

    def _in_step(self, step: int, groups: list[Group], policy_version: int) -> tuple[list[Group], dict[str, float]]:
        metrics: dict[str, float] = {}
        out = self.mentor.intervene(groups, step, self._generate, self.score, self.sampling(step, 1), policy_version,
                                    everyone=self._everyone(groups))
        self._record(out, metrics)
        self.mentor.scheduler.exchange(self.dist)
        self._flush_rows()
        metrics["mentor/hinted_step"] = float(step)
        return out.groups, metrics

    def _finish_taken(self, rider_samples: list[list[list[Sample]]], policy_version: int,
                      metrics: dict[str, float]) -> list[Group]:
        """The taken hints' later rounds and assembly; returns their rescued groups."""
        t, self._taken = self._taken, None
        first = t.samples if t.samples is not None else rider_samples[0]
        hinted = t.hinted
        self.mentor.reroll(hinted, self._generate, self.score, self.sampling(hinted.step, 1), policy_version,
                           first=(t.request, first))
        out = self.mentor.finish(hinted)
        rescued = {iv.group.group_id for iv in hinted.interventions if iv.rescued}
        self._record(out, metrics)
        metrics["mentor/hinted_step"] = float(hinted.step)  # the step whose failed groups these helped
        latency = metrics.get("mentor/latency_s", 0.0)
        metrics["mentor/overlap_frac"] = max(0.0, 1.0 - t.wait_s / latency) if latency > 0 else 1.0
        return [g for g in out.groups if g.group_id in rescued]

    def _defer(self, groups: list[Group], step: int) -> None:
        """Hand the step's failures to the background (or, with backend=self, write their hints now)."""
        plan = self.mentor.plan(groups, step, self._everyone(groups))  # here: it may gather across ranks
        if self._writes_with_policy:  # written now, on the trainer's thread
            written = self.mentor.write_hints(groups, step, plan)
            hints = lambda: written
        else:  # written in the pool, beside the update
            hints = functools.partial(self.mentor.write_hints, groups, step, plan)
        if self._pool is not None:
            self._pending = self._pool.submit(self._background, hints, step)
        else:
            self._pending = Future()
            self._pending.set_result((hints(), None, None))

    def _background(self, hints: Callable[[], HintedStep], step: int):
        """The pool's job: the hints, and with a background round their first round, sampled by the
        policy of this step (the engine serves it until the update's sync, which waits for this
        call: the engine runs one call at a time)."""
        hinted = hints()
        if not self.schedule.background_round:
            return hinted, None, None
        request = self.mentor.first_round(hinted, self.sampling(step, 1))
        samples = self.engine.generate_many([(request.prompts, request.params)], tag="reroll")[0]
        return hinted, request, samples

    def _everyone(self, groups: list[Group]) -> list[GroupSummary] | None:
        return every_rank(groups, self.dist)

    def _take(self, policy_version: int, metrics: dict) -> _Taken | None:
        """The hints written for the last step's failures (waiting for them if need be), with their
        first round's request; None when there are none, or when they are too stale to re-roll
        on-policy."""
        if self._pending is None:
            return None
        pending, self._pending = self._pending, None
        t0 = time.perf_counter()
        hinted, request, samples = pending.result(timeout=self.cfg.agents.timeout_s)
        wait_s = time.perf_counter() - t0
        lag = policy_version - min((r.policy_version for g in hinted.groups for r in g.rollouts), default=policy_version)
        if lag > self.reroll.max_staleness:  # too old to learn from on-policy: drop, and say so
            metrics["mentor/stale_dropped"] = float(len(hinted.interventions))
            return None
        if request is None:
            request = self.mentor.first_round(hinted, self.sampling(hinted.step, 1))
        return _Taken(hinted, request, samples, wait_s)

    def _generate(self, prompts: list[list[int]], params) -> list[list[Sample]]:
        """Later re-roll rounds (and every round in_step): an engine call of their own."""
        return self.engine.generate_many([(prompts, params)], tag="reroll")[0]

    def _record(self, out: MentorOutcome, metrics: dict) -> None:
        metrics.update(out.metrics)
        self._rows.extend(out.dump_rows)

    def _flush_rows(self) -> None:
        """Append the step's mentor.jsonl rows (every rank's, on rank 0; every rank calls this)."""
        rows, self._rows = self._rows, []
        if self.dist.enabled:
            rows = [r for part in self.dist.gather(rows) for r in part]
        if rows and self.dump_path is not None and self.dist.is_main:
            with self.dump_path.open("a") as f:
                for row in rows:
                    f.write(json.dumps(row, default=str) + "\n")

    # ---------------------------------------------------------------- checkpoints
    def state_dict(self) -> dict[str, Any]:
        pending = None
        if self._pending is not None:  # the hints written for the last step's failures
            hinted: HintedStep = self._pending.result()[0]
            counts = self.mentor.backend_counts
            # a background round's samples are not kept: a resumed run re-rolls in the next call
            pending = {**hinted.state(), "counts": counts.snapshot() if counts is not None else None}
        return {"mentor": self.mentor.state_dict(), "pending": pending}

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        if state is None:
            return
        self.mentor.load_state_dict(state["mentor"])
        pending = state.get("pending")
        if pending is not None:
            hinted = HintedStep.from_state(pending)
            self._pending = Future()
            self._pending.set_result((hinted, None, None))
            counts = self.mentor.backend_counts
            if counts is not None and pending.get("counts") is not None:
                counts.restore(pending["counts"])

    def regroup(self, states: list[dict[str, Any] | None], holds: Callable[[int], bool]) -> dict[str, Any] | None:
        """Every rank's saved state -> this rank's on another number of ranks: the scheduler's
        (the same on every rank) and the hints in flight for the groups this rank now holds. The
        pending step's plan is rank 0's (its global fields are the same on every rank)."""
        states = [s for s in states if s is not None]
        if not states:
            return None
        pending = [s["pending"] for s in states if s.get("pending") is not None]
        merged = None
        if pending:
            merged = {**pending[0],
                      "interventions": [iv for p in pending for iv in p["interventions"] if holds(iv["group"])],
                      "groups": [g for p in pending for g in p["groups"] if holds(g["group_id"])]}
        return {"mentor": states[0]["mentor"], "pending": merged}

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)


def build(ctx: MethodContext) -> MentorMethod:
    """method=mentor: the mentor of `mentor.*`, its intervention log in mentor.jsonl."""
    cfg = ctx.cfg
    mentor = Mentor.from_config(cfg.mentor, cfg.recovery, ctx.builder, engine=ctx.engine, tokenizer=ctx.tokenizer,
                                seed=cfg.seed, device=ctx.device)
    return MentorMethod(mentor, ctx.engine, ctx.score, ctx.sampling, ctx.num_generations,
                        ctx.out / "mentor.jsonl", dist=ctx.dist)
