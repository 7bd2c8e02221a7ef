"""JSONL datasets: GSM8K (`#### answer`), MATH (`\\boxed{}` in the solution) and plain answers.

The file is read as bytes and decoded line by line, so a bad row is reported as
"path:line: reason" (a DataError) instead of a deep UnicodeDecodeError or JSONDecodeError; with
on_bad_row="skip" it is counted in the LoadReport instead. Blank lines are ignored.
Problem.id = "<file stem>-<line>", Problem.source = "<path>:<line>", other columns -> Problem.columns.
"""

from __future__ import annotations

import collections
import json
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from mentor_fast.answers import last_boxed
from mentor_fast.config import DataConfig
from mentor_fast.data.sampler import Sampler
from mentor_fast.types import Problem

Format = Literal["auto", "gsm8k", "math", "plain"]


class DataError(ValueError):
    """A dataset file or row is unusable; the message names the file (and line)."""


@dataclass
class LoadReport:
    path: str
    rows: int = 0  # non-blank lines seen
    loaded: int = 0
    skipped: collections.Counter = field(default_factory=collections.Counter)  # reason -> rows
    examples: list[str] = field(default_factory=list)  # the first few skip messages


class BadRow(Exception):
    """A row is unusable: `reason` is the LoadReport key, the message says why."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason


_CALC_RE = re.compile(r"<<[^<>]*>>")  # GSM8K calculator annotations: 9 * 2 = $<<9*2=18>>18
_THOUSANDS_RE = re.compile(r"(?<=\d),(?=\d{3}(?!\d))")
_MATH_ANSWER_TAIL_RE = re.compile(r"\s*The answer is:.*\Z", re.DOTALL)  # MATH-500's trailing copy
_ASY_RE = re.compile(r"\[asy\].*?\[/asy\]", re.DOTALL)  # figure code: not a solution step
_SENTENCE_END_RE = re.compile(r"(?<=[.!?])\s+(?=[A-Z$\\])|(?<=[.!?]\$)\s+(?=[A-Z$\\])")


def _gsm8k(answer: str) -> tuple[str, tuple[str, ...]]:
    if "####" not in answer:
        raise BadRow("no_final_answer", "answer has no '#### <final answer>'")
    solution, final = answer.rsplit("####", 1)
    gold = _THOUSANDS_RE.sub("", final.strip())
    if not gold:
        raise BadRow("no_final_answer", "nothing after '####'")
    steps = tuple(s for line in solution.splitlines() if (s := _CALC_RE.sub("", line).strip()))
    return gold, steps


def _in_math(text: str, pos: int) -> bool:
    """Whether `pos` is inside $...$ (an odd number of unescaped dollars before it)."""
    return (text.count("$", 0, pos) - text.count("\\$", 0, pos)) % 2 == 1


def _split_sentences(paragraph: str) -> list[str]:
    """Sentence ends outside $...$ math; a period inside inline math never splits."""
    out, start = [], 0
    for m in _SENTENCE_END_RE.finditer(paragraph):
        if _in_math(paragraph, m.start()):
            continue
        out.append(paragraph[start : m.start()].strip())
        start = m.end()
    out.append(paragraph[start:].strip())
    return [s for s in out if s]


def _math(answer: str) -> tuple[str, tuple[str, ...]]:
    gold = last_boxed(answer)
    if gold is None:
        raise BadRow("no_final_answer", "answer has no complete \\boxed{...}")
    if not gold:
        raise BadRow("no_final_answer", "the last \\boxed{} is empty")
    solution = _ASY_RE.sub("", _MATH_ANSWER_TAIL_RE.sub("", answer))
    steps = tuple(s for para in re.split(r"\n\s*\n", solution) for s in _split_sentences(para))
    return gold, steps


def _plain(answer: str) -> tuple[str, tuple[str, ...]]:
    if not answer.strip():
        raise BadRow("no_final_answer", "empty answer")
    return answer.strip(), ()


_PARSERS = {"gsm8k": _gsm8k, "math": _math, "plain": _plain}


def decode_row(raw: bytes) -> dict[str, Any]:
    """One JSONL line as a JSON object; raises BadRow (invalid UTF-8 or JSON, not an object)."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        where = f"byte 0x{raw[e.start]:02x} at column {e.start + 1}"
        raise BadRow("invalid_utf8", f"not valid UTF-8 ({where})") from None
    try:
        row = json.loads(text)
    except json.JSONDecodeError as e:
        raise BadRow("invalid_json", f"invalid JSON: {e.msg} at column {e.colno}") from None
    if not isinstance(row, dict):
        raise BadRow("not_an_object", f"row is a JSON {type(row).__name__}, not an object")
    return row


QUESTION_KEYS = ("prompt", "question", "problem")  # tried in order when the question key is ""
ANSWER_KEYS = ("solution", "answer", "reward_model.ground_truth")  # tried in order when the answer key is ""
_ROLES = ("system", "user", "assistant")


def _lookup(row: dict[str, Any], key: str) -> tuple[bool, Any]:
    """(found, value) of `key`; "a.b" reads row["a"]["b"] when there is no column named "a.b"."""
    if key in row:
        return True, row[key]
    head, dot, rest = key.partition(".")
    if dot and isinstance(row.get(head), dict):
        return _lookup(row[head], rest)
    return False, None


def _pick(row: dict[str, Any], key: str, defaults: tuple[str, ...], what: str) -> tuple[str, Any]:
    """The column `key` (or the first of `defaults` holding a value, when key is "")."""
    for k in (key,) if key else defaults:
        found, value = _lookup(row, k)
        if found and (key or value is not None):
            return k, value
    wanted = f"key {key!r}" if key else f"{what} column (tried {', '.join(map(repr, defaults))})"
    raise BadRow(f"missing_{what}", f"missing {wanted} (row keys: {sorted(row)})")


def _prompt(value: Any, key: str) -> tuple[str, tuple[tuple[str, str], ...]]:
    """TRL's prompt forms: a string (standard), or chat messages ending with the user's turn
    (conversational; a system message and earlier turns go to Problem.context)."""
    if isinstance(value, str):
        if not value.strip():
            raise BadRow("bad_question", f"{key!r} must be a non-empty string")
        return value, ()
    if not isinstance(value, (list, tuple)) or not value:
        raise BadRow("bad_question", f"{key!r} must be a string or a list of chat messages, "
                                     f"got {type(value).__name__}")
    turns = []
    for m in value:
        if not (isinstance(m, dict) and m.get("role") in _ROLES and isinstance(m.get("content"), str)):
            raise BadRow("bad_question", f"{key!r}: a message needs a role ({', '.join(_ROLES)}) and a "
                                         f"string content, got {str(m)[:80]}")
        turns.append((m["role"], m["content"]))
    if turns[-1][0] != "user" or not turns[-1][1].strip():
        raise BadRow("bad_question", f"{key!r}: the messages must end with a non-empty user message")
    return turns[-1][1], tuple(turns[:-1])


def _answer(value: Any, key: str, fmt: Format) -> tuple[str, tuple[str, ...]]:
    """(gold, solution steps); fmt "auto" reads `####` as gsm8k, a \\boxed{} as math, else plain."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and fmt in ("plain", "auto"):
        value, fmt = str(value), "plain"
    if not isinstance(value, str):
        raise BadRow("bad_answer", f"{key!r} must be a string, got {type(value).__name__}")
    if fmt == "auto":
        fmt = "gsm8k" if "####" in value else "math" if last_boxed(value) is not None else "plain"
    return _PARSERS[fmt](value)


def read_row(row: dict[str, Any], fmt: Format, question_key: str = "", answer_key: str = "",
             ) -> tuple[str, tuple, str, tuple, dict]:
    """(question, context, gold, steps, other columns) of one row; raises BadRow. Empty keys try
    QUESTION_KEYS and ANSWER_KEYS in order. The columns keep every top-level key but the prompt's
    and the answer's (a nested answer's parent stays: verl's reward functions read `reward_model`)."""
    q_key, q_value = _pick(row, question_key, QUESTION_KEYS, "question")
    a_key, a_value = _pick(row, answer_key, ANSWER_KEYS, "answer")
    question, context = _prompt(q_value, q_key)
    gold, steps = _answer(a_value, a_key, fmt)
    extra = {k: v for k, v in row.items() if k not in (q_key, a_key)}
    return question, context, gold, steps, extra


def problem_from_row(row: dict[str, Any], problem_id: str, source: str, fmt: Format = "auto",
                     question_key: str = "", answer_key: str = "") -> Problem:
    """One row as a Problem (`read_row`'s fields, the other columns kept for reward functions); raises
    BadRow. source: where the row is, for messages ("path:line", "train_dataset:row 3")."""
    question, context, gold, steps, extra = read_row(row, fmt, question_key, answer_key)
    return Problem(problem_id, question, gold, steps, source=source, columns=extra, context=context)


RowConverter = Callable[[dict[str, Any], int], Problem]  # (row, line number) -> Problem; raises BadRow


def load_rows(
    path: str | Path,
    convert: RowConverter,
    on_bad_row: Literal["error", "skip"] = "error",
    data: bytes | None = None,
) -> tuple[list[Problem], LoadReport]:
    """Problems from JSONL bytes (the file at `path`, or `data` when given, named `path` in messages),
    one `convert`ed row per non-blank line; a BadRow becomes a DataError "path:line: reason" or, with
    on_bad_row="skip", a count in the LoadReport. The math and code loaders share it."""
    path = Path(path)
    if data is None:
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            raise DataError(f"{path}: file not found") from None
        except OSError as e:
            raise DataError(f"{path}: cannot read: {e}") from None
    if data.startswith(b"\xef\xbb\xbf"):  # UTF-8 byte-order mark
        data = data[3:]

    def decode_and_convert(raw: bytes, line_no: int) -> Problem:
        return convert(decode_row(raw), line_no)

    lines = ((raw.rstrip(b"\r"), line_no) for line_no, raw in enumerate(data.split(b"\n"), start=1))
    items = ((f"{path}:{line_no}", decode_and_convert, raw, line_no) for raw, line_no in lines if raw.strip())
    return collect_rows(str(path), items, on_bad_row)


def collect_rows(
    name: str,
    items: Iterable[tuple[str, Callable[[Any, int], Problem], Any, int]],
    on_bad_row: Literal["error", "skip"] = "error",
) -> tuple[list[Problem], LoadReport]:
    """`convert(row, number)` for each (where, convert, row, number); a BadRow becomes a DataError
    "where: reason" or, with on_bad_row="skip", a count in the LoadReport. Every loader shares it."""
    report, problems = LoadReport(name), []
    for where, convert, row, number in items:
        report.rows += 1
        try:
            problems.append(convert(row, number))
        except BadRow as e:
            message = f"{where}: {e}"
            if on_bad_row == "error":
                raise DataError(message) from None
            report.skipped[e.reason] += 1
            if len(report.examples) < 5:
                report.examples.append(message)
    report.loaded = len(problems)
    if report.rows == 0:
        raise DataError(f"{name}: no rows")
    if not problems:
        skipped = dict(report.skipped)
        raise DataError(f"{name}: no usable rows ({skipped} skipped; first: {report.examples[0]})")
    return problems, report


def load_jsonl(
    path: str | Path,
    fmt: Format = "gsm8k",
    question_key: str = "question",
    answer_key: str = "answer",
    on_bad_row: Literal["error", "skip"] = "error",
) -> tuple[list[Problem], LoadReport]:
    """Problems from a JSONL file; raises DataError naming the file and line for a bad row (or counts
    it with on_bad_row="skip"), and for a missing file or one without usable rows."""
    if fmt != "auto" and fmt not in _PARSERS:
        raise DataError(f"{path}: unknown format {fmt!r}; use one of {['auto', *sorted(_PARSERS)]}")
    path = Path(path)

    def convert(row: dict[str, Any], line_no: int) -> Problem:
        return problem_from_row(row, f"{path.stem}-{line_no}", f"{path}:{line_no}", fmt, question_key, answer_key)

    return load_rows(path, convert, on_bad_row)


class JsonlSource:
    """A JSONL file as a problem source, drawn by a `Sampler`."""

    def __init__(self, cfg: DataConfig, seed: int):
        self.problems, self.report = self.load(cfg)
        self.sampler = Sampler(self.problems, seed, cfg.eval_size)

    def load(self, cfg: DataConfig) -> tuple[list[Problem], LoadReport]:
        """The file's problems (data/code_sources.py's CodeJsonlSource reads code rows instead)."""
        return load_jsonl(cfg.path, cfg.format, cfg.question_key, cfg.answer_key, cfg.on_bad_row)

    def batch(self, step: int, size: int, round: int = 0) -> list[Problem]:
        return self.sampler.batch(step, size, round)

    def eval_problems(self, n: int | None = None) -> list[Problem]:
        return self.sampler.eval_problems(n)
