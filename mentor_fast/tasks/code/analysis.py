"""What the failed attempts of a code problem have in common, read from their sandbox results and
the reference solution's steps in words (`Problem.solution_steps`, one regex per step in
`CodeTask.step_markers`): the failure label most of them share, ties going to the earliest blocker
(code that does not compile hides every later mistake); the first failing test of an attempt with
that label, parsed as data (`assert f(x) == y` -> call `f(x)`, expected `y`); the kind of input
it fails on ("an empty list"); and the first reference step whose marker matches none of the
attempts' code: the step they lack. The code writer (steps.py) and the LLM prompts
both read it.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from mentor_fast.rewards.program import extract_code
from mentor_fast.tasks.code.attempts import IMPORTABLE, code_failure, code_result, missing_name
from mentor_fast.types import Problem, Rollout

if TYPE_CHECKING:
    from mentor_fast.mentor.cases import FailureCase

# ties go to the earliest blocker: a program that does not compile hides every later mistake
_PRIORITY = (
    "format",
    "syntax",
    "missing_import",
    "signature",
    "exception",
    "timeout",
    "wrong_output",
    "other",
)
_EMPTY = {str: "string", list: "list", tuple: "tuple", dict: "dictionary", set: "set"}


@dataclass(frozen=True)
class FailingTest:
    line: str  # the failing assert, as the sandbox reported it
    call: str  # "total([])" (HumanEval's `candidate` named by the entry point); "" when unparsed
    expected: str  # "0"; "" when the assert is no comparison
    args: tuple[Any, ...] = ()  # the call's literal arguments, when they parse

    def render(self) -> str:
        if not self.call:
            return self.line
        return f"{self.line} (input {self.call}" + (f", expected {self.expected})" if self.expected else ")")


@dataclass(frozen=True)
class CodeAnalysis:
    kind: str  # the majority failure label
    share: float  # of the group's failed attempts with that label
    entry_point: str
    signature: str  # "total(xs)" as the question states it, else the entry point, else ""
    exception: str  # of the first attempt with that label
    message: str
    first_test: FailingTest | None
    input_kind: str | None  # "an empty list", "a list with duplicate values", ...
    steps: tuple[str, ...]  # the reference's steps in words
    missing: int | None  # 0-based index of the first step no attempt has
    prints_instead: bool  # the attempts print and never return a value
    module: str  # missing_import: the module to import ("" unknown)
    name: str  # missing_import: the name that was not defined ("" for a missing module)


def _code_of(text: str) -> str:
    """The attempt's code as the verifier read it ("" when it has none)."""
    return extract_code(text) or ""


def parse_test_line(line: str, entry_point: str = "") -> FailingTest | None:
    """`assert candidate([]) == 0` -> FailingTest(call "total([])", expected "0", args ([],))."""
    src = line.strip()
    if not src:
        return None
    try:
        node = ast.parse(src).body[0]
    except (SyntaxError, IndexError):
        return FailingTest(src, "", "")
    if not isinstance(node, ast.Assert):  # "check(total)": the call of the whole check, no test
        return FailingTest(src, "", "")
    test = node.test
    call, expected = test, None
    if isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], (ast.Eq, ast.Is)):
        call, expected = test.left, test.comparators[0]
    if not isinstance(call, ast.Call):
        return FailingTest(src, "", "")
    args: tuple[Any, ...] = ()
    try:
        args = tuple(ast.literal_eval(a) for a in call.args)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        pass
    text = ast.unparse(call)
    if entry_point and isinstance(call.func, ast.Name) and call.func.id == "candidate":
        text = entry_point + text[len("candidate") :]
    return FailingTest(src, text, ast.unparse(expected) if expected is not None else "", args)


def _describe_one(a: Any) -> str | None:
    if isinstance(a, (str, list, tuple, dict, set)) and len(a) == 0:
        return f"an empty {_EMPTY[type(a)]}"
    if isinstance(a, (list, tuple)):
        nums = [x for x in a if isinstance(x, (int, float)) and not isinstance(x, bool)]
        if len(a) == 1:
            return "a list with a single element"
        if len({repr(x) for x in a}) == 1:
            return "a list whose values are all the same"
        if len({repr(x) for x in a}) < len(a):
            return "a list with duplicate values"
        if any(x < 0 for x in nums):
            return "a list with negative numbers"
    if isinstance(a, (int, float)) and not isinstance(a, bool):
        return {0: "zero"}.get(a) or (
            "a negative number" if a < 0 else "a large number" if a >= 10**6 else None
        )
    if isinstance(a, str):
        if len(a) == 1:
            return "a one-character string"
        if " " in a.strip():
            return "a string with spaces"
        if a != a.lower() and a != a.upper():
            return "a string mixing upper- and lower-case letters"
    return None


def describe_input(args: tuple[Any, ...]) -> str | None:
    """The kind of input a failing test gives ("an empty list"): what a hint may say about it."""
    kinds = [k for k in map(_describe_one, args) if k]
    empty = [k for k in kinds if k.startswith("an empty")]
    return (empty or kinds or [None])[0]


def signature_of(problem: Problem) -> str:
    code = problem.code
    ep = code.entry_point if code else ""
    if not ep:
        return ""
    src = f"{problem.question}\n{code.prompt}"
    m = re.search(rf"def\s+{re.escape(ep)}\s*\(([^)]*)\)", src) or re.search(
        rf"\b{re.escape(ep)}\s*\(([^()]*)\)", src
    )
    return f"{ep}({' '.join(m.group(1).split())})" if m else ep


def missing_step(case: FailureCase, attempts: list[Rollout] | None = None) -> int | None:
    """The first reference step whose marker matches none of the attempts' code (`attempts`: those of
    the diagnosed failure kind, so that the step and the failure describe the same attempts)."""
    steps, code = case.problem.solution_steps, case.problem.code
    markers = code.step_markers if code else ()
    if not steps or len(markers) != len(steps):
        return None
    codes = [_code_of(r.text) for r in (attempts or case.attempts)]
    for i, pattern in enumerate(markers):
        try:
            rx = re.compile(pattern, re.MULTILINE)
        except re.error:  # a bad marker says nothing about the attempts
            continue
        if not any(rx.search(c) for c in codes):
            return i
    return None


def _majority(case: FailureCase) -> tuple[str, float]:
    if case.all_truncated:
        return "truncation", 1.0
    counts = dict(case.kinds) or {}
    if not counts:
        for r in case.attempts:
            counts[code_failure(r)] = counts.get(code_failure(r), 0) + 1
    counts.pop("truncation", None)  # truncation is every attempt's, or no diagnosis
    if not counts:
        return "other", 0.0
    kind = max(counts, key=lambda k: (counts[k], -_PRIORITY.index(k) if k in _PRIORITY else -99))
    return kind, counts[kind] / max(1, sum(counts.values()))


def analyse(case: FailureCase) -> CodeAnalysis:
    p = case.problem
    ep = p.code.entry_point if p.code else ""
    kind, share = _majority(case)
    same = [r for r in case.attempts if code_failure(r) == kind] or case.attempts
    results = [res for res in map(code_result, same) if res is not None]
    first = next((res for res in results if res.test_line.strip()), None)
    test = parse_test_line(first.test_line, ep) if first is not None else None
    rep = results[0] if results else None
    name = missing_name(rep.message) if rep is not None and kind == "missing_import" else ""
    module = IMPORTABLE.get(name, name.split(".")[0])
    if (
        rep is not None
        and rep.exception == "NameError"
        and kind == "missing_import"
        and name not in IMPORTABLE
    ):
        name = ""  # the undefined name is the module itself
    shown = test.args if test and kind in ("wrong_output", "exception") else ()  # where the input matters
    codes = [_code_of(r.text) for r in same]
    prints = bool(codes) and all(
        re.search(r"\bprint\s*\(", c) and not re.search(r"\breturn\s+\S", c) for c in codes
    )
    return CodeAnalysis(
        kind,
        share,
        ep,
        signature_of(p),
        rep.exception if rep else "",
        _message(rep.message if rep else ""),
        test,
        describe_input(shown),
        tuple(p.solution_steps),
        missing_step(case, same),
        prints and kind == "wrong_output" and bool(ep),
        module,
        name,
    )


def _message(message: str) -> str:
    """The first line of an exception's message, without the sandbox's file name."""
    first = (message.strip().splitlines() or [""])[0]
    return re.sub(r"\s*\(<\w+>, (line \d+)\)", r" (\1)", first)[:120]
