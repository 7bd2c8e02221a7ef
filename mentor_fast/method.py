"""The trainer's extension points: a method (MENTOR, or none) is called at fixed points of a step.

    plan = method.before_rollout(step, problems, policy_version)  # which prompts, and rows that ride along
    ...  rollout (one engine call for plan.problems and plan.riders), score
    groups, metrics = method.after_score(step, groups, rider_samples, policy_version)
    ...  advantages, update, weight sync
    method.state_dict() / load_state_dict(state)            # at checkpoint time
    method.regroup(states, holds)                           # every rank's saved state -> this rank's

The trainer knows nothing else of a method: its state, its budget and its loss treatment live with
it, and what it wants done differently to a sequence reaches the update as data on the rollout
(`Rollout.weighting`, `Rollout.extra_terms`). `NoMethod` is vanilla GRPO.

The config key `method` picks one from METHODS (grpo, mentor, scaf, luffy), built from a
`MethodContext`: a new method is a module with a `build(ctx)` and one line here, not a change to
the trainer.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from mentor_fast.config import RunConfig
from mentor_fast.config.baselines import MethodKind
from mentor_fast.data.chat import PromptBuilder
from mentor_fast.dist import Dist
from mentor_fast.metrics import Reduction
from mentor_fast.recovery.rerolls import Scorer
from mentor_fast.rollout.base import Request, RolloutEngine, SamplingParams
from mentor_fast.types import Group, Problem, Sample

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


@dataclass
class RolloutPlan:
    """What the step generates: G samples of each of `problems`, and `riders` in the same call."""

    problems: list[Problem]
    riders: list[Request] = field(default_factory=list)
    """Extra requests served by the same engine call, unscored, their samples handed back to
    `after_score` (e.g. re-rolls of an earlier step; a rider's `SamplingParams.horizon` may cut it)."""
    metrics: dict[str, float] = field(default_factory=dict)


class Method(Protocol):
    metrics: Mapping[str, Reduction]
    """How the method's own metrics reduce over ranks where their names would not say (the rest:
    metrics.reduce_metrics's rules); its module's METRICS, for `timing_metrics`."""

    def before_rollout(self, step: int, problems: list[Problem], policy_version: int) -> RolloutPlan: ...

    def after_score(self, step: int, groups: list[Group], rider_samples: list[list[list[Sample]]],
                    policy_version: int) -> tuple[list[Group], dict[str, float]]:
        """The scored groups of the step -> the groups to train on, and the method's metrics."""
        ...

    def state_dict(self) -> dict[str, Any] | None:
        """Plain data (dicts with string keys, lists, numbers, strings, None; recovery/plain.py for
        records): a checkpoint pickles no class of the method's, so a rename does not break resume."""
        ...

    def load_state_dict(self, state: dict[str, Any] | None) -> None: ...

    def regroup(self, states: list[Any], holds: Callable[[int], bool]) -> Any:
        """Resuming on another number of ranks: the states every rank saved -> this rank's, keeping
        what belongs to the groups it now holds (holds(group_id))."""
        ...

    def close(self) -> None: ...


class NoMethod:
    """Vanilla GRPO: the step's prompts as drawn, its scored groups as they are."""

    metrics: Mapping[str, Reduction] = {}

    def before_rollout(self, step: int, problems: list[Problem], policy_version: int) -> RolloutPlan:
        return RolloutPlan(problems)

    def after_score(self, step, groups, rider_samples, policy_version):
        return groups, {}

    def state_dict(self) -> None:
        return None

    def load_state_dict(self, state) -> None:
        pass

    def regroup(self, states, holds) -> None:
        return None

    def close(self) -> None:
        pass


class Sampling(Protocol):
    def __call__(self, step: int, stream: int = 0) -> SamplingParams:
        """The step's sampling parameters; stream 0: its rollouts, 1: a method's own (re-rolls)."""
        ...


@dataclass(frozen=True)
class MethodContext:
    """What the trainer lends a method."""

    cfg: RunConfig  # the resolved run config (auto resolved: the method is named)
    engine: RolloutEngine  # the policy's rollout engine (a method's own rollouts: `generate_many`)
    tokenizer: PreTrainedTokenizerBase
    builder: PromptBuilder  # problem (+ hint) -> prompt ids
    score: Scorer  # fills reward / correct of rollouts in place, as the trainer's own are scored
    sampling: Sampling
    num_generations: int  # G
    out: Path  # the run folder
    dist: Dist  # the ranks
    device: str = "cpu"  # the torch device's name


def _no_method(ctx: MethodContext) -> NoMethod:
    return NoMethod()


# method -> "module:function" building it from a MethodContext (imported only when chosen)
METHODS: dict[MethodKind, str] = {
    MethodKind.GRPO: f"{__name__}:_no_method",
    MethodKind.MENTOR: "mentor_fast.mentor.method:build",
    MethodKind.SCAF: "mentor_fast.baselines.scaf:build",
    MethodKind.LUFFY: "mentor_fast.baselines.luffy:build",
}


def timing_metrics() -> tuple[str, ...]:
    """Every method's metrics that depend on wall-clock time or the machine (a check that two runs
    are the same run leaves them out)."""
    names = set()
    for target in METHODS.values():
        module = importlib.import_module(target.split(":")[0])
        names |= {k for k, r in getattr(module, "METRICS", {}).items() if r.timing}
    return tuple(sorted(names))


def build_method(ctx: MethodContext) -> Method:
    """The method `ctx.cfg.method` names (resolved: auto is mentor or grpo by then)."""
    module, name = METHODS[MethodKind(ctx.cfg.method)].split(":")
    return getattr(importlib.import_module(module), name)(ctx)
