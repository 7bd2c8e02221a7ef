"""What the mentor looks at: a `FailureCase`, one all-fail group with its task (mentor_fast/tasks/), the
failed attempts chosen to show, and how every attempt of the group ended."""

from __future__ import annotations

from dataclasses import dataclass, field

from mentor_fast.mentor.task import MentorTask, mentor_task
from mentor_fast.tasks import TaskKind, task_of
from mentor_fast.types import Group, Problem, Rollout

NO_ANSWER = ("<no answer>", "<truncated>", "<no code>")  # attempt keys of attempts with no answer at all


def choose_attempts(rollouts: list[Rollout], task: MentorTask, k: int = 3) -> list[Rollout]:
    """Up to k failed attempts covering distinct final answers (at least 2 when there are 2)."""
    failed = [r for r in rollouts if not r.correct]
    chosen, seen = [], set()
    for r in failed:
        key = task.attempt_key(r)
        if key not in seen and len(chosen) < k:
            chosen.append(r)
            seen.add(key)
    for r in failed:  # answer-concentrated groups: still show two attempts
        if len(chosen) >= min(2, k):
            break
        if all(r is not c for c in chosen):
            chosen.append(r)
    return chosen


def truncate_middle(text: str, head: int = 600, tail: int = 600) -> str:
    """Keep the start (the approach) and the end (the answer) of a long attempt."""
    if len(text) <= head + tail + 40:
        return text
    return f"{text[:head]}\n[... {len(text) - head - tail} characters omitted ...]\n{text[-tail:]}"


@dataclass
class FailureCase:
    """One all-fail group as the mentor sees it."""

    problem: Problem
    attempts: list[Rollout]  # the chosen failed attempts
    group_size: int
    answers: dict[str, int]  # attempt key -> how many of the group's attempts ended there
    kind: TaskKind  # the problem's task
    previous_hints: list[str] = field(default_factory=list)  # earlier hints for this problem
    hint_cache: dict[int, str] = field(default_factory=dict)  # fused call: level -> hint
    kinds: dict[str, int] = field(default_factory=dict)  # code: failure label -> failed attempts of the group

    @classmethod
    def from_group(cls, group: Group, k: int = 3, previous_hints: list[str] | None = None) -> FailureCase:
        kind = task_of(group.problem).kind
        spec = mentor_task(kind)
        answers: dict[str, int] = {}
        kinds: dict[str, int] = {}
        for r in group.rollouts:
            key = spec.attempt_key(r)
            answers[key] = answers.get(key, 0) + 1
            if not r.correct and spec.failure_of is not None:
                label = spec.failure_of(r)
                kinds[label] = kinds.get(label, 0) + 1
        return cls(group.problem, choose_attempts(group.rollouts, spec, k), len(group.rollouts), answers,
                   kind, list(previous_hints or []), kinds=kinds)

    @property
    def task(self) -> MentorTask:
        return mentor_task(self.kind)

    @property
    def all_truncated(self) -> bool:
        return bool(self.attempts) and all(r.truncated for r in self.attempts)

    @property
    def no_answer_share(self) -> float:
        n = sum(v for key, v in self.answers.items() if key in NO_ANSWER)
        return n / max(1, self.group_size)

    def render_attempts(self, head: int = 600, tail: int = 600) -> str:
        parts = []
        for i, r in enumerate(self.attempts, 1):
            note = r.verifier_note or ("stopped at the length limit" if r.truncated else "wrong final answer")
            detail = self.task.attempt_detail(r)
            parts.append(f"Attempt {i}:\n{truncate_middle(r.text, head, tail)}{detail}\nVerifier: {note}")
        return "\n\n".join(parts) if parts else "(none)"

    def render_answers(self) -> str:
        return ", ".join(f"{key} x{n}" for key, n in sorted(self.answers.items(), key=lambda kv: -kv[1]))
