"""What the mentor asks of a task: its failure taxonomy, how an attempt of it ended, its leak gates,
its deterministic writer and its prompt templates. Each task folder provides one `MentorTask`, named
MENTOR in its mentor.py (mentor_fast/tasks/<task>/mentor.py), so the rest of the mentor never asks
which task it is."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING, Any

from mentor_fast.mentor.diagnosis import Diagnosis, closed_label
from mentor_fast.types import CodeTask, Rollout

if TYPE_CHECKING:
    from mentor_fast.mentor.cases import FailureCase

# (hint, gold, the worked solution's steps, the problem's CodeTask, the question) -> (gate, why) | None
LeakGates = Callable[[str, str, tuple[str, ...], "CodeTask | None", str], "tuple[str, str] | None"]


@dataclass(frozen=True)
class MentorTask:
    failures: tuple[str, ...]
    """The closed failure taxonomy a diagnosis picks from ("other" catches the rest)."""
    aliases: Mapping[str, str]
    """Labels a model tends to write for those of the taxonomy."""
    attempt_key: Callable[[Rollout], str]
    """How an attempt ended (math: its boxed answer; code: how it failed): attempts are told apart,
    counted and shown to the diagnoser by it."""
    failure_of: Callable[[Rollout], str] | None
    """The taxonomy's label of each failed attempt, where the verifier's result tells (code)."""
    attempt_detail: Callable[[Rollout], str]
    """What the diagnoser reads under an attempt beside the verifier's note (code: the sandbox's)."""
    gates: tuple[str, ...]
    """The names of the task's leak gates, in order."""
    leak: LeakGates
    """The task's leak gates (run after the guard's shared ones)."""
    diagnose: Callable[[FailureCase], Diagnosis]
    """The deterministic writer's diagnosis (mentor.agents.backend=worked_solutions)."""
    hint: Callable[[FailureCase, Diagnosis, int], str]
    """The deterministic writer's hint at a level."""
    templates: str
    """The package whose prompts/ folder holds the task's LLM prompt templates (diagnose, fused,
    instruct, levels)."""
    prompt_values: Callable[[FailureCase], dict[str, Any]]
    """What the task's templates hold beyond the values every template has."""

    def label(self, label: Any) -> str:
        """A model's failure label as one of the taxonomy's, or "other"."""
        return closed_label(label, self.failures, self.aliases)


@cache
def mentor_task(kind: str) -> MentorTask:
    """The mentor's part of the task `kind` (a TaskKind): MENTOR in its folder's mentor.py, loaded on
    first use (the task registry, mentor_fast/tasks/, knows nothing of the mentor)."""
    return importlib.import_module(f"mentor_fast.tasks.{kind}.mentor").MENTOR
