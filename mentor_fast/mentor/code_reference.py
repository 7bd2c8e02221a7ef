"""The reference mentor for code (no LLM): it reads the sandbox results of the failed attempts and the
reference solution's steps in words (`Problem.solution_steps`, one regex per step in
`CodeTask.step_markers`).

Diagnosis: every attempt truncated -> truncation; otherwise the failure label (diagnosis.code_failure)
most of the group's failed attempts share, ties going to the earliest blocker (code that does not
compile hides every later mistake); the first failing test of an attempt with that label, parsed as
data (`assert f(x) == y` -> call `f(x)`, expected `y`); and the first reference step whose marker
matches none of the attempts' code: the step they lack.

Hints never hold code nor a hidden test's expected output. Level 1 names the kind of mistake and
where to look (the exception, the kind of input that fails: "an empty list"); level 2 gives the
targeted fix and the reference's steps in words, in order, the missing one marked; level 3 the fix
and the missing step, concretely. The entry point and the signature the question states may be
named, and so may a module to import ("add import math": an import is no solution code). The hint
still passes the leak guard.
"""

from __future__ import annotations

import ast
import re
import sys
from dataclasses import dataclass
from typing import Any

from mentor_fast.mentor.diagnosis import (
    IMPORTABLE,
    Diagnosis,
    FailureCase,
    code_failure,
    code_result,
    missing_name,
)
from mentor_fast.rewards.program import extract_code
from mentor_fast.types import Problem, Rollout

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
_EXCEPTION_WHY = {
    "IndexError": "an index past the end of a sequence",
    "KeyError": "a key that the dictionary does not hold",
    "ZeroDivisionError": "a division by zero",
    "RecursionError": "a recursion whose base case is never reached",
    "TypeError": "an operation on a value of the wrong type (often None)",
    "ValueError": "a conversion or an unpacking of a value that does not fit",
    "AttributeError": "a method called on the wrong type (often None)",
    "UnboundLocalError": "a variable read before it is assigned",
    "NameError": "a name used before it is defined",
    "StopIteration": "next() on an exhausted iterator",
}
PLAN_WORDS = 100  # the level-2 cap is 140 words, the fix included


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


def diagnose_code(case: FailureCase) -> Diagnosis:
    a = analyse(case)
    parts = [f"{a.share:.0%} of the failed attempts: {a.kind}" + (f" ({a.exception})" if a.exception else "")]
    if a.first_test is not None:
        parts.append(f"the first failing test is {a.first_test.render()}")
    if a.missing is not None:
        parts.append(f"no attempt has step {a.missing + 1} ({a.steps[a.missing]})")
    first_error = (a.first_test.render() if a.first_test else "") or (
        f"{a.exception}: {a.message}" if a.exception else a.message
    )
    knowledge = (
        f"import {a.module}"
        if a.kind == "missing_import" and a.module
        else a.steps[a.missing]
        if a.missing is not None
        else None
    )
    return Diagnosis(a.kind, "; ".join(parts) + ".", first_error, knowledge, round(0.4 + 0.5 * a.share, 2))


# ---------------------------------------------------------------- hints
# Texts by failure kind, or "kind/variant" where the kind needs more than one; fields from `_fields`.
_POINTER = {
    "syntax": "Your code does not compile: {exc}. Check the line it points at.",
    "signature/name": (
        "Your code raises NameError: the tests call {ep}, and your code defines no function of that name. "
        "Check the name the tests call."
    ),
    "signature/arity": (
        "Your function cannot be called the way the tests call it: {exc}. Check its parameters against the "
        "question."
    ),
    "exception": "Your function raises {exc}{on}: look for {why}.",
    "exception/killed": (
        "Your program was killed before the tests finished ({message}): avoid building huge structures or "
        "printing in a loop."
    ),
    "wrong_output": (
        "Your function returns a wrong value on one of the tests: run the examples of the question through "
        "it by hand and compare."
    ),
    "wrong_output/input": "Your function returns a wrong value on {input}: check what it returns there.",
    "wrong_output/prints": (
        "Your function prints its result but returns nothing, and the tests read the return value."
    ),
    "timeout": (
        "Your function does not finish within the time limit: look for a loop that never ends, or work that "
        "grows too fast with the input."
    ),
    "missing_import": "Your code uses {missing} without importing it.",
    "missing_import/unavailable": "Your code imports {module}, which is not available here.",
    "format": "Your reply contains no code: write the complete function in one Python code block.",
    "truncation": "Your reply stops at the length limit before your code is complete: keep reasoning short.",
    "other": (
        "Re-read the question: which function must you write, what does it take and what must it return? "
        "Check your code on the question's examples."
    ),
}
_SIGNATURE_FIX = (
    "The tests call {sig}: name your function exactly {ep}, give it the parameters the question gives, and "
    "return the result."
)
_FIX = {  # levels 2 and 3 start with the targeted fix
    "syntax": (
        "First make your code compile ({exception}): every def, if, for and while line ends with a colon, "
        "brackets and quotes are closed, and the indentation is consistent."
    ),
    "signature/name": _SIGNATURE_FIX,
    "signature/arity": _SIGNATURE_FIX,
    "exception": "Guard against {why}{on}: check for that case before the operation that fails.",
    "exception/killed": "Build no structure larger than the task needs, and print nothing in a loop.",
    "wrong_output/input": "Make sure your function handles {input}.",
    "wrong_output/prints": "Return the result instead of printing it.",
    "timeout": (
        "Make sure every loop ends: the loop variable or the remaining input must change on each pass, and a "
        "recursion must reach its base case. Do not recompute values you already have."
    ),
    "missing_import": "Add import {module} at the top of your program.",
    "missing_import/name": "Add the import: from {module} import {name}, at the top of your program.",
    "missing_import/unavailable": "The module {module} is not available here: use only the standard library.",
    "format": (
        "Write the complete function in one Python code block (fenced with three backticks), with the name "
        "and parameters the question gives."
    ),
    "truncation": (
        "Keep your reasoning short and write the code early, in one block, so that you finish before the "
        "length limit."
    ),
}
_STOCK_PLAN = (
    "Plan: restate what the function takes and returns, work the question's examples by hand, write the "
    "steps in words, then turn each into code and check it on the examples."
)


def _variant(a: CodeAnalysis) -> str:
    """Which text of the failure kind applies (see _POINTER)."""
    if a.kind == "signature":
        return "name" if a.exception == "NameError" else "arity"
    if a.kind == "exception" and not a.exception:
        return "killed"  # crashed: no exception, killed by a limit
    if a.kind == "wrong_output":
        return "prints" if a.prints_instead else "input" if a.input_kind else ""
    if a.kind == "missing_import":
        return "unavailable" if a.module not in sys.stdlib_module_names else "name" if a.name else ""
    return ""


def _fields(a: CodeAnalysis) -> dict[str, str]:
    return {
        "exc": a.exception + (f" ({a.message})" if a.message else ""),
        "exception": a.exception or "a syntax error",
        "message": a.message,
        "on": f" on {a.input_kind}" if a.input_kind else "",
        "input": a.input_kind or "",
        "why": _EXCEPTION_WHY.get(a.exception, "the operation that fails"),
        "ep": a.entry_point or "as the question does",
        "sig": a.signature or "the function the question names",
        "module": a.module,
        "name": a.name,
        "missing": a.name or a.module,
    }


def _text(table: dict[str, str], a: CodeAnalysis) -> str:
    template = table.get(f"{a.kind}/{_variant(a)}", table.get(a.kind, ""))
    return template.format(**_fields(a))


def _plan(a: CodeAnalysis) -> str:
    if not a.steps:
        return _STOCK_PLAN
    items: list[str] = []
    for i, step in enumerate(a.steps):
        item = f"{i + 1}) {step.strip().rstrip('.')}" + (
            " (your attempts miss this step)" if i == a.missing else ""
        )
        if items and len(" ".join([*items, item]).split()) > PLAN_WORDS:
            break
        items.append(item)
    return "Plan: " + "; ".join(items) + ". Write the code yourself and check it on the question's examples."


def _concrete(a: CodeAnalysis) -> str:
    if a.missing is not None:
        step = a.steps[a.missing].strip().rstrip(".")
        return f"The step your attempts lack: {step}. Do this in your own code."
    if a.kind not in ("wrong_output", "exception", "other") or a.prints_instead:
        return ""  # a blocker (syntax, signature, import, ...): its fix is the concrete step
    where = a.input_kind or "the first example of the question"
    return (
        f"Take {where} and trace your function on it by hand, line by line: find the first value that "
        "differs from what the question asks for, and fix the logic there."
    )


def code_hint(case: FailureCase, level: int) -> str:
    a = analyse(case)
    if level == 1:
        return _text(_POINTER, a) or _POINTER["other"]
    body = _plan(a) if level == 2 else _concrete(a)
    return f"{_text(_FIX, a)} {body}".strip()
