"""The code problems' deterministic writer (no LLM), from the analysis of the failed attempts
(analysis.py): the sandbox results and the reference solution's steps in words.

Diagnosis: every attempt truncated -> truncation; otherwise the failure label most of the group's
failed attempts share, the first failing test and the step the attempts lack.

Hints never hold code nor a hidden test's expected output. Level 1 names the kind of mistake and
where to look (the exception, the kind of input that fails: "an empty list"); level 2 gives the
targeted fix and the reference's steps in words, in order, the missing one marked; level 3 the fix
and the missing step, concretely. The entry point and the signature the question states may be
named, and so may a module to import ("add import math": an import is no solution code). The hint
still passes the leak guard.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from mentor_fast.mentor.diagnosis import Diagnosis
from mentor_fast.tasks.code.analysis import CodeAnalysis, analyse

if TYPE_CHECKING:
    from mentor_fast.mentor.cases import FailureCase

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


def diagnose(case: FailureCase) -> Diagnosis:
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


def _plan(a: CodeAnalysis, seen: bool) -> str:
    """seen: the writer saw attempts (blind, the step is the first one, and the hint says only that)."""
    if not a.steps:
        return _STOCK_PLAN
    mark = " (your attempts miss this step)" if seen else " (start here)"
    items: list[str] = []
    for i, step in enumerate(a.steps):
        item = f"{i + 1}) {step.strip().rstrip('.')}" + (mark if i == a.missing and (seen or i) else "")
        if items and len(" ".join([*items, item]).split()) > PLAN_WORDS:
            break
        items.append(item)
    return "Plan: " + "; ".join(items) + ". Write the code yourself and check it on the question's examples."


def _concrete(a: CodeAnalysis, seen: bool) -> str:
    if a.missing is not None:
        step = a.steps[a.missing].strip().rstrip(".")
        lead = "The step your attempts lack" if seen else "Start with this step"
        return f"{lead}: {step}. Do this in your own code."
    if a.kind not in ("wrong_output", "exception", "other") or a.prints_instead:
        return ""  # a blocker (syntax, signature, import, ...): its fix is the concrete step
    where = a.input_kind or "the first example of the question"
    return (
        f"Take {where} and trace your function on it by hand, line by line: find the first value that "
        "differs from what the question asks for, and fix the logic there."
    )


def hint(case: FailureCase, diagnosis: Diagnosis, level: int) -> str:
    """The level-`level` hint (the diagnosis is analysed afresh: it is a function of the case)."""
    a = analyse(case)
    if level == 1:
        return _text(_POINTER, a) or _POINTER["other"]
    seen = bool(case.attempts)
    body = _plan(a, seen) if level == 2 else _concrete(a, seen)
    return f"{_text(_FIX, a)} {body}".strip()
