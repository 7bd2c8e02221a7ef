"""When, for which groups and at which level the mentor intervenes (deterministic code, no LLM).

- Eligible: a group none of whose initial rollouts is correct (the verifier's flag, never the
  reward: a shaped or partial reward can be > 0 on a wrong answer).
- Budget: at most ceil(frac * B) groups per step, frac = max_groups_frac, or surge_groups_frac
  while a collapse surge is open; none before `exempt_steps` unless a surge is open. Over budget,
  longer collapse streaks go first, then a deterministic pseudo-random tie-break (a hash of seed,
  step and problem id). Nothing here reads a hint: any method that helps failed groups can take
  its budget and its memory.
- Collapse detector on z_t (the all-fail fraction): an event when z_t - EMA_{t-1} > delta or
  z_t > abs_threshold (for `patience` consecutive steps); an event opens (or re-arms) a surge of
  `surge_steps` steps.
- Memory per problem id: the level that last rescued it (the next start is one lower, min 1, a
  fading scaffold), the collapse streak, and graduations: problems rescued with a hint earlier and
  later solved without help, counted once per problem.
A static scheduler (`static=True`, Scaf-GRPO's) starts every group at cfg.start_level, with no
fading, and lets no surge into its exemption period.
All state is JSON-serialisable (`state_dict` / `load_state_dict`) for checkpoints.
"""

from __future__ import annotations

import hashlib
import math
import threading
from dataclasses import asdict, dataclass, field
from typing import Any

from mentor_fast.config import TriggerConfig
from mentor_fast.recovery.levels import MAX_LEVEL, MIN_LEVEL
from mentor_fast.types import Group, GroupSummary


class CollapseDetector:
    def __init__(
        self,
        decay: float = 0.8,
        delta: float = 0.2,
        abs_threshold: float = 0.6,
        surge_steps: int = 10,
        patience: int = 1,
    ) -> None:
        self.decay, self.delta, self.abs_threshold = decay, delta, abs_threshold
        self.surge_steps, self.patience = surge_steps, patience
        self.ema: float | None = None
        self.hits = 0  # consecutive steps meeting the event condition
        self.surge_until = -1  # surge is open for steps < surge_until
        self.events = 0

    def update(self, z: float, step: int) -> bool:
        """Observe step `step`'s all-fail fraction; True when it is a collapse event."""
        jump = self.ema is not None and z - self.ema > self.delta
        self.hits = self.hits + 1 if (jump or z > self.abs_threshold) else 0
        self.ema = z if self.ema is None else self.decay * self.ema + (1 - self.decay) * z
        event = self.hits >= self.patience
        if event:
            self.events += 1
            self.surge_until = step + self.surge_steps
        return event

    def surge_active(self, step: int) -> bool:
        return step < self.surge_until

    def state_dict(self) -> dict[str, Any]:
        return {"ema": self.ema, "hits": self.hits, "surge_until": self.surge_until, "events": self.events}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.ema, self.hits = state["ema"], state["hits"]
        self.surge_until, self.events = state["surge_until"], state["events"]


@dataclass
class ProblemRecord:
    streak: int = 0  # consecutive observed steps with the problem's group all-fail
    level: int | None = None  # the hint level that last rescued it
    rescued: bool = False  # ever rescued with a hint
    graduated: bool = False  # later solved without help (counted once)
    last_step: int = -1
    hints: list[str] = field(default_factory=list)  # the last few hints that reached the learner


@dataclass
class StepPlan:
    step: int
    num_groups: int
    all_fail_frac: float
    collapse_event: bool
    surge_active: bool
    cap: int  # max groups this step
    eligible: int
    selected: list[tuple[Group, int]]  # (group, starting level), in priority order
    latency_s: float = 0.0  # filled by the pipeline: time spent writing this step's hints
    reroll_s: float = 0.0  # filled by the pipeline: time spent generating and scoring re-rolls
    selected_total: int | None = None  # across ranks: selected on every rank (`selected` is this rank's)

    @property
    def over_budget(self) -> int:
        return self.eligible - (len(self.selected) if self.selected_total is None else self.selected_total)


def every_rank(groups: list[Group], dist) -> list[GroupSummary] | None:
    """Every rank's groups, in rank order, for `Scheduler.plan_held` (None on one rank)."""
    if not dist.enabled:
        return None
    return [s for part in dist.gather([GroupSummary.of(g) for g in groups]) for s in part]


class Scheduler:
    def __init__(self, cfg: TriggerConfig, seed: int = 0, keep_hints: int = 3, static: bool = False) -> None:
        """cfg.exempt_steps: no interventions before this step unless a surge is open (about 10% of
        the run; 0 disables). cfg.collapse_patience: consecutive steps for a collapse event."""
        self.cfg, self.seed, self.keep_hints, self.exempt_steps = cfg, seed, keep_hints, cfg.exempt_steps
        self.static = static
        self.detector = CollapseDetector(
            cfg.ema, cfg.collapse_delta, cfg.collapse_abs, cfg.surge_steps, cfg.collapse_patience
        )
        self.memory: dict[str, ProblemRecord] = {}
        self.graduations = 0
        self.journal: list[tuple[str, bool, int | None, str]] = []  # records not yet exchanged
        self._lock = threading.Lock()  # plan() may run in the mentor thread while record() runs in the trainer's

    def plan(self, groups: list[Group | GroupSummary], step: int) -> StepPlan:
        """Observe a step's scored groups (call it every step) and pick the groups to help.
        Across ranks every rank passes every rank's groups (summaries), so the scheduler's state
        stays the same everywhere; each rank then takes the selected groups it holds."""
        with self._lock:
            z = sum(g.all_fail for g in groups) / len(groups) if groups else 0.0
            event = self.detector.update(z, step)
            surge = self.detector.surge_active(step)
            for g in groups:
                self._observe(g, step)
            eligible = [g for g in groups if g.size and g.all_fail]
            frac = self.cfg.surge_groups_frac if surge else self.cfg.max_groups_frac
            exempt = step < self.exempt_steps and (self.static or not surge)
            cap = 0 if exempt else math.ceil(frac * len(groups) - 1e-9)
            eligible.sort(key=lambda g: (-self.memory[g.problem_id].streak, self._tiebreak(step, g)))
            selected = [(g, self._start_level(g.problem_id)) for g in eligible[:cap]]
            return StepPlan(step, len(groups), z, event, surge, cap, len(eligible), selected)

    def plan_held(self, groups: list[Group], step: int, everyone: list[GroupSummary] | None = None) -> StepPlan:
        """`plan` on one rank of several: it observes `everyone` (every rank's groups, in rank order;
        None on one rank) and keeps the selected groups of this rank's `groups`."""
        if everyone is None:
            return self.plan(groups, step)
        plan = self.plan(everyone, step)
        mine = {g.group_id: g for g in groups}
        plan.selected_total = len(plan.selected)
        plan.selected = [(mine[s.group_id], level) for s, level in plan.selected if s.group_id in mine]
        return plan

    def _observe(self, g: Group | GroupSummary, step: int) -> None:
        rec = self.memory.get(g.problem_id)
        if g.all_fail:
            rec = rec or self.memory.setdefault(g.problem_id, ProblemRecord())
            if rec.last_step != step:  # the same problem twice in one batch is one observation
                rec.streak += 1
        elif rec is not None:
            rec.streak = 0
            if rec.rescued and not rec.graduated:
                rec.graduated = True
                self.graduations += 1
            rec.level = None  # solved unaided: the scaffold is gone, start from the bottom again
        if rec is not None:
            rec.last_step = step

    def _tiebreak(self, step: int, g: Group | GroupSummary) -> bytes:
        return hashlib.blake2b(
            f"{self.seed}:{step}:{g.problem_id}:{g.group_id}".encode(), digest_size=8
        ).digest()

    def _start_level(self, problem_id: str) -> int:
        rec = self.memory.get(problem_id)
        if self.static or rec is None or rec.level is None:
            return min(MAX_LEVEL, max(MIN_LEVEL, self.cfg.start_level))
        return max(MIN_LEVEL, rec.level - 1)

    def previous_hints(self, problem_id: str) -> list[str]:
        with self._lock:
            rec = self.memory.get(problem_id)
            return list(rec.hints) if rec else []

    def record(self, problem_id: str, *, rescued: bool, level: int | None, hint: str = "") -> None:
        """The outcome of an intervention: `level` is the level whose hint rescued the problem."""
        with self._lock:
            self._apply(problem_id, rescued, level, hint)
            self.journal.append((problem_id, rescued, level, hint))

    def _apply(self, problem_id: str, rescued: bool, level: int | None, hint: str) -> None:
        rec = self.memory.setdefault(problem_id, ProblemRecord())
        if rescued:
            rec.rescued, rec.level = True, level
        if hint:
            rec.hints = [*rec.hints, hint][-self.keep_hints :]

    def exchange(self, dist) -> None:
        """Apply the outcomes the other ranks recorded since the last exchange (in rank order), so
        every rank's memory is the one a single process would hold. Call before each `plan`."""
        with self._lock:
            mine, self.journal = self.journal, []
        if not dist.enabled:
            return
        for rank, records in enumerate(dist.gather(mine)):
            if rank != dist.rank:
                with self._lock:
                    for r in records:
                        self._apply(*r)

    def state_dict(self) -> dict[str, Any]:
        with self._lock:
            return {
                "detector": self.detector.state_dict(),
                "graduations": self.graduations,
                "memory": {pid: asdict(rec) for pid, rec in self.memory.items()},
            }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        with self._lock:
            self.detector.load_state_dict(state["detector"])
            self.graduations = state["graduations"]
            self.memory = {pid: ProblemRecord(**rec) for pid, rec in state["memory"].items()}
