"""Problem sources (the built-in ladder curriculum, JSONL files) and chat templating with hints.

Every source has `batch(step, size) -> list[Problem]`, a pure function of (seed, step, size), so a
resumed run needs no iterator state, and `eval_problems(n=None) -> list[Problem]` (n defaults to
data.eval_size).
"""

from __future__ import annotations

from typing import Protocol

from mentor_fast.config import DataConfig
from mentor_fast.data.chat import HINT_HEADER, PromptBuilder, PromptTooLong
from mentor_fast.data.jsonl import DataError, JsonlSource, LoadReport, load_jsonl
from mentor_fast.data.ladder import Curriculum, make_problem
from mentor_fast.types import Problem


class ProblemSource(Protocol):
    def batch(self, step: int, size: int) -> list[Problem]: ...

    def eval_problems(self, n: int | None = None) -> list[Problem]: ...


def build_source(cfg: DataConfig, seed: int) -> Curriculum | JsonlSource:
    if cfg.source == "ladder":
        return Curriculum(cfg, seed)
    if cfg.source == "jsonl":
        if not cfg.path:
            raise DataError("data.path is required for data.source=jsonl")
        return JsonlSource(cfg, seed)
    raise DataError(f"unknown data.source {cfg.source!r}; use 'ladder' or 'jsonl'")


__all__ = [
    "HINT_HEADER",
    "Curriculum",
    "DataError",
    "JsonlSource",
    "LoadReport",
    "ProblemSource",
    "PromptBuilder",
    "PromptTooLong",
    "build_source",
    "load_jsonl",
    "make_problem",
]
