"""Agents blind to the attempts (mentor.agents.blind): any writer, shown each failed group as it
would see the problem before any attempt was made. No attempt, no count of final answers and no
failure label reaches it; the problem, its worked solution and the hints it wrote earlier do. What
it writes is then a hint of the problem's own, the same whatever the policy got wrong: the ablation
that measures what MENTOR's diagnosis of the failures adds, and the static hints of Scaf-GRPO
(baselines/scaf.py)."""

from __future__ import annotations

import dataclasses

from mentor_fast.mentor.cases import FailureCase
from mentor_fast.mentor.diagnosis import Diagnosis
from mentor_fast.mentor.writers.base import Agents, Failed


def unseen(case: FailureCase) -> FailureCase:
    """`case` with everything the attempts told removed (earlier hints and the fused call's hint
    cache are shared with it, so escalation and the fused call work as with sighted agents)."""
    return dataclasses.replace(case, attempts=[], answers={}, kinds={})


class BlindAgents:
    """Wraps agents; each call passes them the blind view of the cases (one view per case, kept
    while the case is in flight, so a writer's per-case cache survives between its calls)."""

    def __init__(self, agents: Agents) -> None:
        self.agents = agents
        self.name = f"{agents.name}+blind"
        self.regenerates = agents.regenerates
        self._views: dict[int, tuple[FailureCase, FailureCase]] = {}

    def _view(self, case: FailureCase) -> FailureCase:
        held = self._views.get(id(case))
        if held is None or held[0] is not case:
            held = self._views[id(case)] = (case, unseen(case))
        return held[1]

    def diagnose(self, cases: list[FailureCase]) -> list[Diagnosis | Failed]:
        self._views = {}  # a new step's cases: the last step's views are done with
        return self.agents.diagnose([self._view(c) for c in cases])

    def instruct(self, cases: list[FailureCase], diagnoses: list[Diagnosis], levels: list[int],
                 feedback: list[str | None]) -> list[str | Failed]:
        return self.agents.instruct([self._view(c) for c in cases], diagnoses, levels, feedback)

    @property
    def backend(self):  # the text backend's counts reach the step's metrics (Mentor.backend_counts)
        return getattr(self.agents, "backend", self.agents)
