"""The built-in code ladder: generated function-writing problems (task=code) and its curriculum.

Levels 1-7 are the templates of data/code_tasks.py (its docstring has the table) and
data/code_tasks_jump.py (levels 5-7, and how the jump's natural attempts fail): levels 1-2 are
within reach of a 135M instruct model some of the time, levels 6-7 are the jump, where the natural
attempt fails a specific test, and the worked-solutions writer's steps say what it misses.

A problem is a Problem with `code` set: the question names the function and its exact signature;
`gold` and `code.solution` hold the solution program; `solution_steps` say its steps in words and
`code.step_markers` match an attempt's code that has each step; `code.tests` are asserts whose
expected values were computed at generation time.

Determinism is the arithmetic ladder's (data/ladder.py): training item g draws its level from the
same per-index stream and its content from "code_ladder:{seed}:train:L{level}:{g}", so `batch`
is a pure function of (seed, step, size). Held-out problems are kept apart by the question itself,
not by an exclusion list: a question whose SHA-1 falls in the held-out eighth is never a training
item (training redraws it), and evaluation draws only such questions ("code_ladder:{seed}:eval:...").
The split is exact and the same for every seed and batch size, which an exclusion list of training
draws cannot be when a level has a few thousand distinct questions; so `data.eval_exclude_draws`
and `data.max_digits` do not apply here.
"""

from __future__ import annotations

import hashlib
import random

from mentor_fast.data import code_tasks, code_tasks_jump
from mentor_fast.data.code_tasks import Task, Template
from mentor_fast.data.ladder import Curriculum
from mentor_fast.types import CodeTask, Problem

TEMPLATES: dict[int, tuple[Template, ...]] = {**code_tasks.TEMPLATES, **code_tasks_jump.TEMPLATES}
LEVELS = tuple(sorted(TEMPLATES))  # also the arithmetic ladder's: Curriculum checks levels against those
HELD_OUT_BUCKETS = 8  # one question in this many is held out for evaluation


def is_held_out(question: str) -> bool:
    """Whether `question` belongs to evaluation (never drawn for training)."""
    return int(hashlib.sha1(question.encode()).hexdigest()[:8], 16) % HELD_OUT_BUCKETS == 0


def draw_task(level: int, rng: random.Random, held_out: bool = False) -> Task:
    """A task of `level` from `rng` on the given side of the split whose tests no constant function
    passes (redrawn otherwise, so `return None` or `return 0` always fails)."""
    if level not in TEMPLATES:
        raise ValueError(f"code ladder level must be one of {list(LEVELS)}, got {level}")
    for _ in range(1000):
        task = rng.choice(TEMPLATES[level])(rng)
        if is_held_out(task.question) == held_out and len({repr(v) for v in task.expected()}) >= 2:
            return task
    raise RuntimeError(f"code ladder level {level}: no usable task in 1000 draws")  # a broken template


def make_code_problem(level: int, rng: random.Random, problem_id: str, held_out: bool = False) -> Problem:
    task = draw_task(level, rng, held_out)
    code = CodeTask(tests=task.tests(), entry_point=task.name, solution=task.solution, style="function",
                    step_markers=task.markers)
    return Problem(problem_id, task.question, task.solution, task.steps, level=level, source="code_ladder",
                   code=code)


class CodeLadder(Curriculum):
    """Code ladder problems by step, with the curriculum (levels, jump) of the arithmetic ladder; it
    overrides only how an item is drawn and how held-out items are kept apart."""

    def train_problem(self, index: int | str, level: int) -> Problem:
        rng = random.Random(f"code_ladder:{self.seed}:train:L{level}:{index}")
        return make_code_problem(level, rng, f"code-L{level}-{self.seed}-{index}")

    def _train_questions(self, level: int) -> frozenset[str]:
        return frozenset()  # nothing to exclude: the held-out split is by question (module docstring)

    def _eval_level(self, level: int, count: int, exclude: frozenset[str], seen: set[str]) -> list[Problem]:
        out = []
        for j in range(20 * count + 1000):
            if len(out) == count:
                break
            rng = random.Random(f"code_ladder:{self.seed}:eval:L{level}:{j}")
            p = make_code_problem(level, rng, f"code-eval-L{level}-{self.seed}-{j}", held_out=True)
            if p.question not in seen:
                seen.add(p.question)
                out.append(p)
        if len(out) < count:
            raise ValueError(f"code ladder level {level} cannot supply {count} distinct held-out problems")
        return out
