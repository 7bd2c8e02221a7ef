"""Which problems a step draws from a loaded list: the sampler every file-backed source holds."""

from __future__ import annotations

import random
from typing import Any

from mentor_fast.types import Problem


class Sampler:
    """A seeded permutation of the problems per epoch; the step's item p = step * size + i. Dynamic
    sampling's round k > 0 reads the same positions in permutations of its own, so each round's
    stream also visits every problem once per epoch. A pure function of (seed, step, size, round):
    a resumed run needs no state. eval_size: the default count of `eval_problems`."""

    def __init__(self, problems: list[Problem], seed: int, eval_size: int = 0):
        self.problems, self.seed, self.eval_size = problems, seed, eval_size
        self._perms: dict[Any, list[int]] = {}

    def _perm(self, key: Any) -> list[int]:
        if key not in self._perms:
            if len(self._perms) > 16:  # per stream, only the current (and maybe next) epoch is hot
                self._perms.pop(next(iter(self._perms)))
            order = list(range(len(self.problems)))
            random.Random(f"jsonl:{self.seed}:{key}").shuffle(order)  # the streams' name: part of every draw
            self._perms[key] = order
        return self._perms[key]

    def batch(self, step: int, size: int, round: int = 0) -> list[Problem]:
        n = len(self.problems)
        stream = ("epoch",) if round == 0 else ("round", round)
        return [self.problems[self._perm((*stream, p // n))[p % n]] for p in range(step * size, (step + 1) * size)]

    def eval_problems(self, n: int | None = None) -> list[Problem]:
        """The first n problems of a separate permutation (default eval_size); n <= 0: all of them in
        their loaded order. They are the training problems: point data.path at a held-out split."""
        n = self.eval_size if n is None else n
        if n <= 0:
            return list(self.problems)
        return [self.problems[i] for i in self._perm("eval")[:n]]
