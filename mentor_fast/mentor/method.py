"""MENTOR as the trainer's method (mentor_fast/method.py): everything about hints in flight.

Synchronous (`mentor.async=false`): after scoring, the step's all-fail groups are diagnosed,
hinted, re-rolled (escalating) and assembled into the step's own batch.

Async (the default, DESIGN.md section 5): the hints for step t's failures are written in a
background thread while step t's update runs. At step t+1 they are taken (`before_rollout`,
waiting if need be), and their first re-roll round rides in t+1's initial generate call, sampled
by the next policy version: on top of the step's rows (`mentor.reroll.budget=extra`) or in the
rows of its last prompts (`shared`), cut at `mentor.reroll.horizon` if set. After scoring
(`after_score`) later rounds run, the rescued groups are assembled and join t+1's batch, and
t+1's own failures go to the background. Hints whose failed rollouts are more than
`mentor.reroll.max_staleness` versions old are dropped (mentor/stale_dropped). A checkpoint
keeps the hints in flight, their step's plan and the backend's counts, so a resumed run logs
what the uninterrupted one would.

Across ranks (mentor_fast/dist.py) each rank writes the hints for, and re-rolls, the all-fail
groups it holds, with its own backend (the reference backend needs nothing else; `self` writes
with the rank's own engine). What must agree is global: the scheduler sees every rank's groups
(summaries), so the collapse detector reads the step's all-fail fraction over all ranks and the
budget is a share of all the step's groups; the outcomes each rank records are exchanged, so the
scheduler's memory is the same everywhere; mentor.jsonl rows are gathered to rank 0.
"""

from __future__ import annotations

import functools
import json
import math
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mentor_fast.config import MentorConfig
from mentor_fast.dist import Dist
from mentor_fast.mentor.pipeline import Intervention, Mentor, MentorOutcome, RerollRequest
from mentor_fast.method import RolloutPlan
from mentor_fast.types import Group, GroupSummary, Problem, Rollout, Sample


@dataclass
class _Pending:
    """Hints being written (or written) in the background for step `step`'s all-fail groups; with
    reroll.when=during_update, their first round generated there too. The future's result is
    (interventions, request, samples), the last two None when the round rides in the next call."""

    future: Future
    groups: list[Group]
    step: int


@dataclass
class _Riding:
    """Hints taken at this step, whose first re-roll round rides in this step's generate call."""

    interventions: list[Intervention]
    groups: list[Group]
    step: int
    wait_s: float  # how long the trainer waited for them
    request: RerollRequest
    samples: list[list[Sample]] | None = None  # generated during the last update (None: riding)


class MentorMethod:
    """The plug-in: `mentor` writes hints and re-rolls; this decides when, and carries the state.

    engine: the rollout engine (`generate_many`); score: fills reward/correct of rollouts in place;
    sampling(step, stream): the step's sampling parameters (stream 1: re-rolls);
    num_generations: G (the shared budget skips whole prompts of G rows); dump_path: mentor.jsonl
    (written by rank 0); dist: the ranks.
    """

    def __init__(self, cfg: MentorConfig, mentor: Mentor, engine, score: Callable[[list[Rollout]], Any],
                 sampling: Callable[[int, int], Any], num_generations: int, dump_path: Path | None = None,
                 dist: Dist | None = None):
        self.cfg, self.mentor, self.engine, self.score, self.sampling = cfg, mentor, engine, score, sampling
        self.num_generations, self.dump_path = num_generations, dump_path
        self.dist = dist or Dist()
        self._rows: list[dict] = []  # this step's mentor.jsonl rows
        # backend=self writes hints with the policy itself, so it cannot run beside the update; the
        # re-rolls of reroll.when=during_update can (the engine then has GPUs of its own).
        self._during_update = cfg.async_ and cfg.reroll.when == "during_update"
        self._pool = (ThreadPoolExecutor(1, thread_name_prefix="mentor")
                      if cfg.async_ and (cfg.agents.backend != "self" or self._during_update) else None)
        self._pending: _Pending | None = None
        self._riding: _Riding | None = None

    # ---------------------------------------------------------------- the step
    def before_rollout(self, step: int, problems: list[Problem], version: int) -> RolloutPlan:
        metrics: dict[str, float] = {}
        riding = self._take(version, metrics) if self.cfg.async_ else None
        if riding is None:
            return RolloutPlan(problems, metrics=metrics)
        request = riding.request
        rows = len(request.prompts) * request.params.n
        self._riding = riding
        if riding.samples is not None:  # generated during the last update: nothing rides
            metrics["mentor/background_rerolls"] = float(rows)
            return RolloutPlan(problems, metrics=metrics)
        metrics["mentor/merged_rerolls"] = float(rows)
        if self.cfg.reroll.budget == "shared":  # the re-rolls take the rows of the last prompts
            skip = min(math.ceil(rows / self.num_generations), len(problems) - 1)
            problems = problems[: len(problems) - skip]
            metrics["mentor/prompts_skipped"] = float(skip)
        return RolloutPlan(problems, riders=[(request.prompts, request.params)], horizon=self.cfg.reroll.horizon,
                           metrics=metrics)

    def after_score(self, step: int, groups: list[Group], rider_samples: list[list[list[Sample]]],
                    version: int) -> tuple[list[Group], dict[str, float]]:
        metrics: dict[str, float] = {}
        if not self.cfg.async_:
            out = self.mentor.intervene(groups, step, self._generate, self.score, self.sampling(step, 1), version,
                                        everyone=self._everyone(groups))
            self._record(out, metrics)
            self.mentor.scheduler.exchange(self.dist)
            self._flush_rows()
            metrics["mentor/hinted_step"] = float(step)
            return out.groups, metrics
        carried: list[Group] = []
        if self._riding is not None:
            r, self._riding = self._riding, None
            first = r.samples if r.samples is not None else rider_samples[0]
            self.mentor.reroll(r.interventions, self._generate, self.score, self.sampling(r.step, 1), version,
                               first=(r.request, first))
            out = self.mentor.finish(r.groups, r.interventions, r.step)
            rescued = {iv.group.group_id for iv in r.interventions if iv.rescued}
            carried = [g for g in out.groups if g.group_id in rescued]
            self._record(out, metrics)
            metrics["mentor/hinted_step"] = float(r.step)  # the step whose failed groups these helped
            latency = metrics.get("mentor/latency_s", 0.0)
            metrics["mentor/overlap_frac"] = max(0.0, 1.0 - r.wait_s / latency) if latency > 0 else 1.0
        metrics["off_policy/max_lag"] = float(max(
            (version - ro.policy_version for g in carried for ro in g.rollouts), default=0))
        self.mentor.scheduler.exchange(self.dist)  # every rank's outcomes before the next plan
        self._flush_rows()
        plan = self.mentor.plan(groups, step, self._everyone(groups))  # here: it may gather across ranks
        if self.cfg.agents.backend == "self":  # written now, on the trainer's thread
            written = self.mentor.write_hints(groups, step, plan)
            hints = lambda: written
        else:  # written in the pool, beside the update
            hints = functools.partial(self.mentor.write_hints, groups, step, plan)
        if self._pool is not None:
            future = self._pool.submit(self._background, hints, step)
        else:
            future = Future()
            future.set_result((hints(), None, None))
        self._pending = _Pending(future, groups, step)
        return groups + carried, metrics

    def _background(self, hints: Callable[[], list[Intervention]], step: int):
        """The pool's job: the hints, and with reroll.when=during_update their first round, sampled
        by the policy of this step (the engine serves it until the update's sync, which waits for
        this call: the engine runs one call at a time)."""
        interventions = hints()
        if not self._during_update:
            return interventions, None, None
        request = self.mentor.first_round(interventions, self.sampling(step, 1))
        samples = self.engine.generate_many([(request.prompts, request.params)], tag="reroll")[0]
        return interventions, request, samples

    def _everyone(self, groups: list[Group]) -> list[GroupSummary] | None:
        """Every rank's groups, in rank order, for the scheduler (None on one rank)."""
        if not self.dist.enabled:
            return None
        return [s for part in self.dist.gather([GroupSummary.of(g) for g in groups]) for s in part]

    def _take(self, version: int, metrics: dict) -> _Riding | None:
        """The hints written for the last step's failures (waiting for them if need be), with their
        first round's request; None when there are none, or when they are too stale to re-roll
        on-policy."""
        if self._pending is None:
            return None
        p, self._pending = self._pending, None
        t0 = time.perf_counter()
        interventions, request, samples = p.future.result(timeout=self.cfg.agents.timeout_s)
        wait_s = time.perf_counter() - t0
        lag = version - min((r.policy_version for g in p.groups for r in g.rollouts), default=version)
        if lag > self.cfg.reroll.max_staleness:  # too old to learn from on-policy: drop, and say so
            metrics["mentor/stale_dropped"] = float(len(interventions))
            self.mentor.drop_pending(p.step)
            return None
        if request is None:
            request = self.mentor.first_round(interventions, self.sampling(p.step, 1))
        return _Riding(interventions, p.groups, p.step, wait_s, request, samples)

    def _generate(self, prompts: list[list[int]], params) -> list[list[Sample]]:
        """Later re-roll rounds (and every round when sync): an engine call of their own."""
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
        if self._pending is not None:  # the mentor queue: hints written for the last step's failures
            p = self._pending
            # a background round's samples are not kept: a resumed run re-rolls in the next call
            pending = {"interventions": p.future.result()[0], "groups": p.groups, "step": p.step,
                       **self.mentor.pending_state(p.step)}
        return {"mentor": self.mentor.state_dict(), "pending": pending}

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        if state is None:
            return
        self.mentor.load_state_dict(state["mentor"])
        pending = state.get("pending")
        if pending is not None:
            done: Future = Future()
            done.set_result((pending["interventions"], None, None))
            self._pending = _Pending(done, pending["groups"], pending["step"])
            self.mentor.restore_pending(pending["step"], pending)

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
                      "interventions": [iv for p in pending for iv in p["interventions"] if holds(iv.group.group_id)],
                      "groups": [g for p in pending for g in p["groups"] if holds(g.group_id)]}
        return {"mentor": states[0]["mentor"], "pending": merged}

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
