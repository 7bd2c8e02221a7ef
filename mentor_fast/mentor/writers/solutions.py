"""The deterministic writer (mentor.agents.backend=worked_solutions): no LLM. Each task's registry
entry writes its diagnosis and hints from the verifier's signals and the data's worked solution
(math: tasks/math/steps.py; code: the sandbox results and the reference's steps in words,
tasks/code/steps.py). Its hints pass the leak guard like any other."""

from __future__ import annotations

from mentor_fast.mentor.cases import FailureCase
from mentor_fast.mentor.counts import Counts
from mentor_fast.mentor.diagnosis import Diagnosis
from mentor_fast.mentor.writers.base import Failed
from mentor_fast.tasks import task_of
from mentor_fast.types import Problem


class WorkedSolutions:
    """Deterministic diagnose/instruct from verifier signals and the worked solution."""

    name = "worked_solutions"
    regenerates = False  # asking again gives the same hint; the pipeline goes a level lower instead

    def __init__(self) -> None:
        self.counts = Counts()

    def diagnose(self, cases: list[FailureCase]) -> list[Diagnosis | Failed]:
        return [case.task.diagnose(case) for case in cases]

    def instruct(
        self,
        cases: list[FailureCase],
        diagnoses: list[Diagnosis],
        levels: list[int],
        feedback: list[str | None],
    ) -> list[str | Failed]:
        return [self.hint(case, d, level) for case, d, level in zip(cases, diagnoses, levels)]

    def hint(self, case: FailureCase, diagnosis: Diagnosis, level: int) -> str:
        return case.task.hint(case, diagnosis, level)


def cold_hint(problem: Problem, level: int) -> str:
    """The worked-solutions writer's level-`level` hint for `problem` before any attempt was seen
    (what it writes blind, mentor/writers/blind.py): the first solution step is the one pointed at.
    Used to teach hint-following and to measure how much a level helps."""
    kind = task_of(problem).kind
    case = FailureCase(problem=problem, attempts=[], group_size=1, answers={}, kind=kind)
    return case.task.hint(case, case.task.diagnose(case), level)
