"""One all-fail group a method took on, and everything that happened to it: its hints, the guard's
verdicts, its re-roll rounds and whether one rescued it. MENTOR fills in the diagnosis side
(`case`, `diagnosis`, `verdicts`); a method with hints of another origin (the data's) leaves it
empty and uses the rest as is (rerolls.py, rescue.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from mentor_fast.algo.assemble import LossMode
from mentor_fast.types import Group, Hint, Rollout

if TYPE_CHECKING:  # MENTOR's side of an intervention; nothing here reads it
    from mentor_fast.mentor.cases import FailureCase
    from mentor_fast.mentor.diagnosis import Diagnosis


@dataclass
class Intervention:
    group: Group
    step: int
    level: int  # the current hint level (starting level, then escalations)
    case: FailureCase | None = None  # what the diagnoser saw (None: hints not written from the failures)
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
    cut: int = 0  # re-rolls cut by the rider horizon: dropped unscored, in no round
    cut_tokens: int = 0  # the tokens the cut re-rolls had decoded
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

    def fail(self, reason: str) -> None:
        """No (further) hint for this group, and why."""
        self.hint = None
        self.no_hint_reason = reason
        self.garbage += reason == "garbage"
