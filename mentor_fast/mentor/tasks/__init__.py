"""The tasks the mentor knows, a registry keyed by `TaskKind`: each entry (tasks/base.py `Task`)
holds the task's failure taxonomy, how an attempt of it ended, its leak gates, its deterministic
writer and its prompt templates. A problem's task is looked up once (`task_for`)."""

from __future__ import annotations

from mentor_fast.mentor.tasks.base import Task, TaskKind
from mentor_fast.mentor.tasks.code import CODE
from mentor_fast.mentor.tasks.math import MATH
from mentor_fast.types import CodeTask

TASKS: dict[TaskKind, Task] = {TaskKind.MATH: MATH, TaskKind.CODE: CODE}


def task_for(kind: TaskKind | str, code: CodeTask | None = None) -> Task:
    """The task of a problem: `kind` (the run's mentor.task), or code when the problem carries a
    CodeTask (its gold is a program, whatever the caller assumed)."""
    return TASKS[TaskKind.CODE if code is not None else TaskKind(kind)]


__all__ = ["TASKS", "Task", "TaskKind", "task_for"]
