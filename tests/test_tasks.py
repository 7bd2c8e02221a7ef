"""The task folders' contract (mentor_fast/tasks/): each data setting is read by exactly one task,
each problem is owned by exactly one, the config's `task` names exactly the registry's tasks, and a
task's worked solution is a completion its own verifier passes (the form the policy must write)."""

from __future__ import annotations

import dataclasses
import random
import typing

import pytest

from mentor_fast.config import RewardConfig, RunConfig, load_config
from mentor_fast.config.schema import CodeRewardConfig, DataConfig
from mentor_fast.data.code_ladder import LEVELS as CODE_LEVELS
from mentor_fast.data.code_ladder import make_code_problem
from mentor_fast.data.ladder import LEVELS, make_problem
from mentor_fast.mentor.guard import leak_gates
from mentor_fast.mentor.task import MentorTask, mentor_task
from mentor_fast.tasks import TASKS, TaskKind, task_of, task_reading


def test_the_task_key_names_the_registry_and_each_task_has_its_mentor_part():
    assert set(typing.get_args(typing.get_type_hints(RunConfig)["task"])) == {"auto", *TASKS}
    for kind in TASKS:
        part = mentor_task(kind)
        assert isinstance(part, MentorTask) and part.templates == f"mentor_fast.tasks.{kind}"
        assert set(part.gates) <= set(leak_gates()) and "other" not in part.failures


@pytest.mark.parametrize(("source", "fmt", "kind"), [
    ("ladder", "auto", "math"), ("jsonl", "auto", "math"), ("jsonl", "gsm8k", "math"), ("file", "math", "math"),
    ("dataset", "plain", "math"), ("code_ladder", "auto", "code"), ("humaneval", "auto", "code"),
    ("jsonl", "code", "code"),
])
def test_each_data_setting_is_read_by_one_task(source, fmt, kind):
    data = DataConfig(source=source, format=fmt)
    assert [t.kind for t in TASKS.values() if t.reads(data)] == [kind]
    assert task_reading(data).kind == kind


def _problems():
    rng = random.Random(0)
    math = [make_problem(level, rng, f"m{level}") for level in LEVELS]
    code = [make_code_problem(level, rng, f"c{level}") for level in CODE_LEVELS]
    return math, code


def test_each_problem_is_owned_by_one_task():
    math, code = _problems()
    for problems, kind in ((math, TaskKind.MATH), (code, TaskKind.CODE)):
        for p in problems:
            assert [t.kind for t in TASKS.values() if t.owns(p)] == [kind]
            assert task_of(p).kind == kind


def test_a_worked_solution_is_what_its_tasks_verifier_passes():
    """Every level's worked solution passes; the same text under the other task's verifier, or a
    solution of another problem, does not (so the form and the content both matter)."""
    math, code = _problems()
    cfg = RewardConfig(workers=1, code=CodeRewardConfig(timeout_s=5.0, workers=2))
    for problems, kind in ((math, TaskKind.MATH), (code, TaskKind.CODE)):
        task = TASKS[kind]
        texts = [task.worked_solution(p) for p in problems]
        # each problem given the solution of the next one with another gold
        shifted = [next(texts[j % len(problems)] for j in range(i + 1, i + len(problems))
                        if problems[j % len(problems)].gold != p.gold) for i, p in enumerate(problems)]
        verifier = task.verifier(cfg)
        try:
            assert [v.correct for v in verifier.check(texts, problems)] == [True] * len(problems)
            assert not any(v.correct for v in verifier.check(shifted, problems))
        finally:
            verifier.close()


def test_a_problem_without_a_worked_solution_has_none():
    math, code = _problems()
    bare = [dataclasses.replace(math[0], solution_steps=[]), dataclasses.replace(code[0], code=None)]
    assert TASKS[TaskKind.MATH].worked_solution(bare[0]) is None
    assert TASKS[TaskKind.CODE].worked_solution(bare[1]) is None
    no_reference = dataclasses.replace(code[0], code=dataclasses.replace(code[0].code, solution=""))
    assert TASKS[TaskKind.CODE].worked_solution(no_reference) is None


def test_the_system_prompt_follows_the_task():
    assert load_config([], []).data.system_prompt == TASKS[TaskKind.MATH].system_prompt
    assert load_config([], ["data.source=code_ladder"]).data.system_prompt == TASKS[TaskKind.CODE].system_prompt
    assert load_config([], ["data.source=code_ladder", "data.system_prompt=mine"]).data.system_prompt == "mine"
