"""The tasks a run can train on, one folder each: the system prompt, which data holds its problems,
its verifier, its worked solutions as completions, and the mentor's part (mentor.py's MENTOR:
failure taxonomy, leak gates, deterministic writer, prompt templates). Adding a task is adding a
folder and a line here (and its name in config/schema.py's `task`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from mentor_fast.tasks.base import Task, TaskKind
from mentor_fast.tasks.code import CODE
from mentor_fast.tasks.math import MATH
from mentor_fast.types import CodeTask, Problem

if TYPE_CHECKING:
    from mentor_fast.config.schema import DataConfig

TASKS: dict[TaskKind, Task] = {task.kind: task for task in (MATH, CODE)}


def task_for(kind: TaskKind | str, code: CodeTask | None = None) -> Task:
    """The task named `kind`, or code when a CodeTask is given (its gold is a program, whatever the
    caller assumed)."""
    return TASKS[TaskKind.CODE if code is not None else TaskKind(kind)]


def task_of(problem: Problem) -> Task:
    """The task a problem belongs to."""
    return next(task for task in TASKS.values() if task.owns(problem))


def task_reading(data: DataConfig) -> Task:
    """The task whose problems the data section describes (`task=auto`)."""
    return next(task for task in TASKS.values() if task.reads(data))


__all__ = ["TASKS", "Task", "TaskKind", "task_for", "task_of", "task_reading"]
