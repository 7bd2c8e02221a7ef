"""Leak guard: does a hint give the final answer away?

Deterministic gates run first, cheapest first; an optional LLM judge runs last:
- `empty`, and `boxed`: any `\\boxed` (the learner's answer format) is a reject.
- the task's own gates (mentor_fast/tasks/): math's keep the gold answer in any form, the worked
  solution's last result and its closing words out of a hint (tasks/math/gates.py); code's keep
  code, the reference program and the hidden tests' expected outputs out (tasks/code/gates.py).
- `too_long`: more words than the level's cap (only when a level is given).
- `judge`: an optional callable `judge(hint, gold) -> bool` (True = leaks).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache

from mentor_fast.mentor.counts import Counts
from mentor_fast.mentor.levels import MAX_WORDS
from mentor_fast.mentor.task import mentor_task
from mentor_fast.tasks import TASKS, TaskKind, task_for
from mentor_fast.types import CodeTask


@cache
def leak_gates() -> tuple[str, ...]:
    """The gates that reject a hint for giving the answer away (every task's, and the judge)."""
    return ("boxed", *(gate for kind in TASKS for gate in mentor_task(kind).gates), "judge")


@dataclass(frozen=True)
class GuardVerdict:
    ok: bool
    gate: str | None = None  # the gate that rejected, None when ok
    detail: str = ""  # why (shown to an LLM instructor on regeneration)


class LeakGuard:
    """Runs the gates in order and counts rejects per gate (`counts[gate]`)."""

    def __init__(
        self,
        judge: Callable[[str, str], bool] | None = None,
        max_words: dict[int, int] | None = None,
        counts: Counts | None = None,
    ) -> None:
        self.judge = judge
        self.max_words = MAX_WORDS if max_words is None else max_words
        self.counts = counts if counts is not None else Counts()

    def check(
        self,
        hint: str,
        gold: str,
        reference_steps: Sequence[str] = (),
        task: TaskKind | str = TaskKind.MATH,
        level: int | None = None,
        code: CodeTask | None = None,
        *,
        question: str = "",
    ) -> GuardVerdict:
        """`reference_steps`: the worked solution; `code`: the problem's CodeTask (its tests and
        reference; a problem with one is a code problem); `question`: what the learner sees, so
        that the code gates never count what it shows."""
        verdict = self._check(hint, gold, tuple(reference_steps), task, level, code, question)
        self.counts.add("checked")
        if not verdict.ok:
            self.counts.add(verdict.gate or "unknown")
        return verdict

    def _check(self, hint: str, gold: str, steps: tuple[str, ...], task: TaskKind | str, level: int | None,
               code: CodeTask | None, question: str) -> GuardVerdict:
        if not hint.strip():
            return GuardVerdict(False, "empty", "the hint is empty")
        if "\\boxed" in hint:
            return GuardVerdict(False, "boxed", "the hint contains \\boxed")
        leak = mentor_task(task_for(task, code).kind).leak(hint, gold, steps, code, question)
        if leak:
            return GuardVerdict(False, *leak)
        if level is not None and len(hint.split()) > self.max_words.get(level, 10**9):
            return GuardVerdict(
                False, "too_long", f"{len(hint.split())} words > {self.max_words[level]} for level {level}"
            )
        if self.judge is not None and self.judge(hint, gold):
            return GuardVerdict(
                False, "judge", "the judge says a student could state the answer from the hint"
            )
        return GuardVerdict(True)


def check_hint(
    hint: str,
    gold: str,
    reference_steps: Sequence[str] = (),
    task: TaskKind | str = TaskKind.MATH,
    level: int | None = None,
    judge: Callable[[str, str], bool] | None = None,
    code: CodeTask | None = None,
    *,
    question: str = "",
) -> GuardVerdict:
    """One-off check with the default gates (see `LeakGuard` to keep counts)."""
    return LeakGuard(judge=judge).check(hint, gold, reference_steps, task, level, code, question=question)


def leaks_answer(
    hint: str,
    gold: str,
    reference_steps: Sequence[str] = (),
    task: TaskKind | str = TaskKind.MATH,
    code: CodeTask | None = None,
    *,
    question: str = "",
) -> bool:
    """True when the hint gives the answer away (any leak gate rejects it)."""
    verdict = check_hint(hint, gold, reference_steps, task, code=code, question=question)
    return not verdict.ok and verdict.gate in leak_gates()
