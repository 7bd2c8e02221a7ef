"""Problem sources (the built-in arithmetic and code ladders, JSONL files, HumanEval) and chat templating.

Every source has `batch(step, size, round=0) -> list[Problem]`, a pure function of (seed, step, size,
round), so a resumed run needs no iterator state (round k > 0: dynamic sampling's k-th extra draw in
the step, from a stream of its own), and `eval_problems(n=None) -> list[Problem]` (n defaults to
data.eval_size). HumanEval is the exception: evaluation only (all 164 by default; `batch` raises).
"""

from __future__ import annotations

from typing import Protocol

from mentor_fast.config import DataConfig
from mentor_fast.data.chat import HINT_HEADER, PromptBuilder, PromptTooLong
from mentor_fast.data.code_ladder import CodeLadder, make_code_problem
from mentor_fast.data.code_sources import (
    CodeJsonlSource,
    HumanEvalSource,
    humaneval_problems,
    load_code_jsonl,
)
from mentor_fast.data.jsonl import DataError, JsonlSource, LoadReport, load_jsonl
from mentor_fast.data.ladder import Curriculum, make_problem
from mentor_fast.data.sampler import Sampler
from mentor_fast.data.table import TableSource, dataset_rows, load_table
from mentor_fast.types import Problem


class ProblemSource(Protocol):
    def batch(self, step: int, size: int, round: int = 0) -> list[Problem]: ...

    def eval_problems(self, n: int | None = None) -> list[Problem]: ...


def build_source(cfg: DataConfig, seed: int, rows: list | None = None,
                 ) -> Curriculum | JsonlSource | HumanEvalSource:
    """`rows`: source=dataset's rows (what mentor_fast.GRPOTrainer was handed as train_dataset)."""
    if cfg.source == "ladder":
        return Curriculum(cfg, seed)
    if cfg.source == "code_ladder":
        return CodeLadder(cfg, seed)
    if cfg.source == "humaneval":
        return HumanEvalSource(cfg, seed)
    if cfg.source == "jsonl":
        if not cfg.path:
            raise DataError("data.path is required for data.source=jsonl")
        return CodeJsonlSource(cfg, seed) if cfg.format == "code" else JsonlSource(cfg, seed)
    if cfg.source in ("file", "dataset"):
        return TableSource(cfg, seed, rows)
    raise DataError(f"unknown data.source {cfg.source!r}; use ladder, code_ladder, jsonl, file, dataset or humaneval")


__all__ = [
    "HINT_HEADER",
    "CodeJsonlSource",
    "CodeLadder",
    "Curriculum",
    "DataError",
    "HumanEvalSource",
    "JsonlSource",
    "LoadReport",
    "ProblemSource",
    "PromptBuilder",
    "PromptTooLong",
    "Sampler",
    "TableSource",
    "build_source",
    "dataset_rows",
    "humaneval_problems",
    "load_code_jsonl",
    "load_jsonl",
    "load_table",
    "make_code_problem",
    "make_problem",
]
