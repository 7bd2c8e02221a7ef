"""A task: what differs between kinds of problems (math answers, code tests) from the data file to
the mentor. One `Task` per folder of mentor_fast/tasks/; the registry (tasks/__init__.py) is keyed by
`TaskKind`, and the run's `task` key picks the entry (auto: the one whose data the run reads).
The mentor's part of a task is its folder's mentor.py, which the mentor loads itself
(mentor/task.py `mentor_task`): this registry stays below the mentor and the config loader."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from mentor_fast.compat import StrEnum
from mentor_fast.types import Problem

if TYPE_CHECKING:
    from mentor_fast.config.schema import DataConfig, RewardConfig
    from mentor_fast.rewards.verdict import Verifier


class TaskKind(StrEnum):
    MATH = "math"
    CODE = "code"


@dataclass(frozen=True)
class Task:
    kind: TaskKind
    system_prompt: str
    """The chat template's system message (data.system_prompt's default)."""
    reads: Callable[[DataConfig], bool]
    """Whether the data section describes problems of this task (what `task=auto` follows)."""
    ladder: str
    """The built-in source of generated problems of this task, by level (a data.source)."""
    data_help: str
    """The data settings that hold this task's problems, for the error when they do not."""
    owns: Callable[[Problem], bool]
    """Whether a problem is of this task, whatever the run says (a problem with a CodeTask is code)."""
    verifier: Callable[[RewardConfig], Verifier]
    """The built-in checker the reward section configures (rewards/: imported when a run builds it)."""
    worked_solution: Callable[[Problem], str | None]
    """The problem's worked solution as a completion, in the form the verifier reads (None: the
    problem has none). What the supervised warm-up teaches and LUFFY's off-policy expert writes."""
