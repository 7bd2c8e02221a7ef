"""The built-in arithmetic ladder: generated problems with worked solutions, and a curriculum with a jump.

Levels (operands are positive integers; every intermediate result is >= 0; `*` binds tighter):

| lvl | shape                                  | operands                   | ops | example                  |
|-----|----------------------------------------|----------------------------|-----|--------------------------|
| 1   | a + b                                  | 1-2 digits                 | 1   | 7 + 42                   |
| 2   | a + b, a - b                           | 2 digits                   | 1   | 83 - 27                  |
| 3   | a + b - c, a - b + c                   | 2-3 digits                 | 2   | 47 + 385 - 129           |
| 4   | a * b + c, c + a * b                   | a 2 digits, b, c 1-2       | 2   | 23 * 7 + 15              |
| 5   | (a +- b) * c +- d, c * (a +- b) +- d   | a, b, d 2 digits, c 1      | 3   | (34 + 18) * 6 - 45       |
| 6   | a * b +- c +- d, (a +- b) * c +- d * e | 3 digits; b, c, e 1-2; d 2 | 3-4 | (512 - 138) * 7 + 46 * 9 |
| 7   | a # b, where a # b = 2 * a + b         | a 1 digit, b 1-2 digits    | 2   | 7 # 42                   |

Level 7 is not harder arithmetic but missing knowledge: the question never says what `#` means, so
a policy that has not been told can only guess, and GRPO has nothing to learn from (zero-reward
collapse by construction). The worked solution, and so the reference mentor's hints, spell the
definition out for the problem at hand ("2 * 7 = 14", "14 + 42 = 56"). It isolates the case MENTOR
is for: a failure a hint can fix and the policy could then learn.

`data.max_digits` caps every operand's digit count while keeping the shapes: with 2, level 3 asks
for the arithmetic of levels 1-2 in two steps, so a jump from levels 1-2 to it is a jump in the plan
alone (see experiments/collapse.py).

Each problem has the question "What is <expression>?", the gold answer (an integer, as text) and the
worked solution, one step per operation in evaluation order ("47 + 385 = 432", "432 - 129 = 303");
every step is a valid Python expression, and the last step's result is the gold.

Determinism: every random draw comes from `random.Random(<string>)`, which Python seeds from the
SHA-512 of the string (independent of PYTHONHASHSEED, platform and version since 3.2). Training item
g (= step * size + i) draws its level from "ladder:{seed}:level:{g}" and its content from
"ladder:{seed}:train:L{level}:{g}"; so `batch(step, size)` is a pure function of (seed, step, size)
and a resumed run sees the same problems without stored iterator state. Evaluation item j of a level
uses "ladder:{seed}:eval:L{level}:{j}", a different string, hence an unrelated stream. Unrelated
streams can still produce the same question by chance (level 1 has only 9,801 distinct questions),
so evaluation drops duplicates and any question that a training item g < data.eval_exclude_draws would be
at any level the curriculum uses or the evaluation asks for (levels share questions: "12 + 10" is a
level 1 and a level 2 question). This holds whatever the batch size; it costs ~0.3 s per level, once.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable

from mentor_fast.config import DataConfig
from mentor_fast.types import Problem

ARITHMETIC_LEVELS = (1, 2, 3, 4, 5, 6)  # levels whose question states every operation
LEVELS = (*ARITHMETIC_LEVELS, 7)

Expr = int | tuple[str, "Expr", "Expr"]  # a leaf, or (op, left, right)
_PREC = {"+": 1, "-": 1, "*": 2, "#": 3}


def _num(rng: random.Random, lo_digits: int, hi_digits: int) -> int:
    """A positive integer whose digit count is uniform in [lo_digits, hi_digits]."""
    d = rng.randint(lo_digits, hi_digits)
    return rng.randint(1 if d == 1 else 10 ** (d - 1), 10**d - 1)


def _pm(rng: random.Random) -> str:
    return rng.choice("+-")


Num = Callable[[int, int], int]  # (lo_digits, hi_digits) -> operand, drawn from the problem's rng


def _level1(rng: random.Random, num: Num) -> Expr:
    return ("+", num(1, 2), num(1, 2))


def _level2(rng: random.Random, num: Num) -> Expr:
    return (_pm(rng), num(2, 2), num(2, 2))


def _level3(rng: random.Random, num: Num) -> Expr:
    op1, op2 = rng.sample("+-", 2)  # one of each, in random order
    return (op2, (op1, num(2, 3), num(2, 3)), num(2, 3))


def _level4(rng: random.Random, num: Num) -> Expr:
    product = ("*", num(2, 2), num(1, 2))
    c = num(1, 2)
    return ("+", product, c) if rng.random() < 0.5 else ("+", c, product)


def _level5(rng: random.Random, num: Num) -> Expr:
    inner = (_pm(rng), num(2, 2), num(2, 2))
    c = num(1, 1)
    scaled = ("*", inner, c) if rng.random() < 0.5 else ("*", c, inner)
    return (_pm(rng), scaled, num(2, 2))


def _level6(rng: random.Random, num: Num) -> Expr:
    if rng.random() < 0.5:
        product = ("*", num(3, 3), num(1, 2))
        return (_pm(rng), (_pm(rng), product, num(3, 3)), num(3, 3))
    left = ("*", (_pm(rng), num(3, 3), num(3, 3)), num(1, 2))
    return (_pm(rng), left, ("*", num(2, 2), num(1, 2)))


def _level7(rng: random.Random, num: Num) -> Expr:
    return ("#", num(1, 1), num(1, 2))


_SHAPES: dict[int, Callable[[random.Random, Num], Expr]] = {
    1: _level1, 2: _level2, 3: _level3, 4: _level4, 5: _level5, 6: _level6, 7: _level7,
}


def render(e: Expr) -> str:
    """Infix text with only the parentheses precedence needs (a - (b + c) keeps its own)."""
    if isinstance(e, int):
        return str(e)
    op, left, right = e
    ltxt, rtxt = render(left), render(right)
    if not isinstance(left, int) and _PREC[left[0]] < _PREC[op]:
        ltxt = f"({ltxt})"
    if not isinstance(right, int) and (
        _PREC[right[0]] < _PREC[op] or (_PREC[right[0]] == _PREC[op] and op == "-")
    ):
        rtxt = f"({rtxt})"
    return f"{ltxt} {op} {rtxt}"


def solve(e: Expr) -> tuple[int, list[str]]:
    """Value and worked steps, post-order (left to right, products before the sums that use them)."""
    if isinstance(e, int):
        return e, []
    op, left, right = e
    lv, lsteps = solve(left)
    rv, rsteps = solve(right)
    if op == "#":  # a # b = 2 * a + b, worked out in the defined operations
        return 2 * lv + rv, [*lsteps, *rsteps, f"2 * {lv} = {2 * lv}", f"{2 * lv} + {rv} = {2 * lv + rv}"]
    value = lv + rv if op == "+" else lv - rv if op == "-" else lv * rv
    return value, [*lsteps, *rsteps, f"{lv} {op} {rv} = {value}"]


def make_problem(level: int, rng: random.Random, problem_id: str | None = None, max_digits: int = 0) -> Problem:
    """One ladder problem of `level` drawn from `rng` (resampled until no step goes below 0).
    `max_digits` > 0 caps every operand's digit count and keeps the level's shape; 0 draws from the
    level's own ranges."""
    if level not in _SHAPES:
        raise ValueError(f"ladder level must be one of {list(LEVELS)}, got {level}")
    if max_digits < 0:
        raise ValueError(f"data.max_digits must be >= 0 (0: no cap), got {max_digits}")

    def num(lo: int, hi: int) -> int:
        if max_digits:
            lo, hi = min(lo, max_digits), min(hi, max_digits)
        return _num(rng, lo, hi)

    for _ in range(1000):
        expr = _SHAPES[level](rng, num)
        value, steps = solve(expr)
        if all(int(s.rsplit("= ", 1)[1]) >= 0 for s in steps):
            break
    else:  # unreachable with the shapes above (a negative draw is rare); keeps the loop bounded
        raise RuntimeError(f"level {level}: no non-negative problem in 1000 draws")
    question = f"What is {render(expr)}?"
    if problem_id is None:
        problem_id = f"ladder-L{level}-" + hashlib.sha1(question.encode()).hexdigest()[:10]
    return Problem(problem_id, question, str(value), tuple(steps), level=level, source="ladder")


def _check_levels(levels: list[int], key: str) -> list[int]:
    if not levels or any(lv not in _SHAPES for lv in levels):
        raise ValueError(f"data.{key} must be a non-empty list of ladder levels {list(LEVELS)}, got {levels}")
    return list(levels)


class Curriculum:
    """Ladder problems by step: uniform over `cfg.levels` before `cfg.jump_step`, `cfg.jump_levels` after."""

    def __init__(self, cfg: DataConfig, seed: int):
        self.seed = seed
        self.levels = _check_levels(cfg.levels, "levels")
        self.jump_levels = _check_levels(cfg.jump_levels, "jump_levels")
        self.jump_step = cfg.jump_step
        self.eval_size = cfg.eval_size
        if cfg.eval_exclude_draws < 0:
            raise ValueError(f"data.eval_exclude_draws must be >= 0, got {cfg.eval_exclude_draws}")
        self.eval_exclude_draws = cfg.eval_exclude_draws
        if cfg.max_digits < 0:
            raise ValueError(f"data.max_digits must be >= 0 (0: no cap), got {cfg.max_digits}")
        self.max_digits = cfg.max_digits
        self._excluded: dict[int, frozenset[str]] = {}  # level -> training questions eval avoids

    def used_levels(self) -> list[int]:
        """Every level the training stream can draw."""
        return sorted({*self.levels, *(self.jump_levels if self.jump_step >= 0 else ())})

    def levels_at(self, step: int) -> list[int]:
        jumped = 0 <= self.jump_step <= step
        return self.jump_levels if jumped else self.levels

    def train_problem(self, index: int | str, level: int) -> Problem:
        """Training item `index` (= step * size + i; "index.k" in dynamic sampling's round k) as it
        is drawn when its level is `level`."""
        rng = random.Random(f"ladder:{self.seed}:train:L{level}:{index}")
        return make_problem(level, rng, f"ladder-L{level}-{self.seed}-{index}", self.max_digits)

    def batch(self, step: int, size: int, round: int = 0) -> list[Problem]:
        levels = self.levels_at(step)
        out = []
        for i in range(step * size, (step + 1) * size):
            index = i if round == 0 else f"{i}.{round}"
            level = random.Random(f"ladder:{self.seed}:level:{index}").choice(levels)
            out.append(self.train_problem(index, level))
        return out

    def _train_questions(self, level: int) -> frozenset[str]:
        if level not in self._excluded:
            self._excluded[level] = frozenset(
                self.train_problem(g, level).question for g in range(self.eval_exclude_draws)
            )
        return self._excluded[level]

    def eval_problems(self, n: int | None = None, *, levels: list[int] | None = None) -> list[Problem]:
        """`n` held-out problems (default cfg.eval_size), round-robin over `levels` (default: every
        level the curriculum uses). A larger n extends a smaller one's list per level."""
        n = self.eval_size if n is None else n
        levels = _check_levels(self.used_levels() if levels is None else levels, "eval levels")
        counts = {lv: n // len(levels) + (k < n % len(levels)) for k, lv in enumerate(levels)}
        exclude = frozenset().union(*(self._train_questions(lv) for lv in {*self.used_levels(), *levels}))
        seen: set[str] = set()  # also unique across levels
        per_level = {lv: self._eval_level(lv, counts[lv], exclude, seen) for lv in levels}
        return [per_level[levels[k % len(levels)]][k // len(levels)] for k in range(n)]

    def _eval_level(self, level: int, count: int, exclude: frozenset[str], seen: set[str]) -> list[Problem]:
        out = []
        for j in range(100 * count + 100_000):
            if len(out) == count:
                break
            rng = random.Random(f"ladder:{self.seed}:eval:L{level}:{j}")
            p = make_problem(level, rng, f"ladder-eval-L{level}-{self.seed}-{j}", self.max_digits)
            if p.question not in exclude and p.question not in seen:
                seen.add(p.question)
                out.append(p)
        if len(out) < count:
            raise ValueError(f"level {level} cannot supply {count} distinct held-out problems")
        return out
