"""The mentor's part of the code task: its failure taxonomy and what its prompts hold.

The mentor reads each attempt through its sandbox result (attempts.py), its diagnosis and prompts
through the analysis of the group (analysis.py); the leak gates keep code, the reference program and
the hidden tests' expected outputs out of a hint (gates.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from mentor_fast.mentor.diagnosis import SHARED_ALIASES
from mentor_fast.mentor.task import MentorTask
from mentor_fast.tasks.code import steps
from mentor_fast.tasks.code.analysis import analyse
from mentor_fast.tasks.code.attempts import code_failure, code_key, render_sandbox
from mentor_fast.tasks.code.gates import CODE_GATES, code_leak
from mentor_fast.types import Rollout

if TYPE_CHECKING:
    from mentor_fast.mentor.cases import FailureCase

CODE_FAILURES = (
    "syntax",  # the program does not compile
    "signature",  # the tests cannot call it: NameError on the entry point, TypeError on the call's arity
    "exception",  # another exception raised by the program (the diagnosis names its type)
    "wrong_output",  # an assertion of the tests failed
    "timeout",
    "missing_import",  # NameError on a stdlib module or name an import provides, ModuleNotFoundError
    "format",  # no code in the completion
    "truncation",  # every attempt hit the length limit
)
ALIASES = SHARED_ALIASES | {
    "syntax_compile": "syntax",
    "compile_error": "syntax",
    "syntax_error": "syntax",
    "indentation_error": "syntax",
    "wrong_signature": "signature",
    "signature_error": "signature",
    "wrong_function_name": "signature",
    "wrong_name": "signature",
    "name_error": "signature",
    "arity": "signature",
    "runtime_error": "exception",
    "runtime_exception": "exception",
    "crash": "exception",
    "crashed": "exception",
    "wrong_algorithm": "wrong_output",
    "edge_case": "wrong_output",
    "edge_cases": "wrong_output",
    "wrong_answer": "wrong_output",
    "logic_error": "wrong_output",
    "assertion_error": "wrong_output",
    "failed_test": "wrong_output",
    "io_format": "wrong_output",  # printed in the wrong shape: the comparison of the tests fails
    "i_o_format": "wrong_output",
    "io": "wrong_output",
    "time_limit": "timeout",
    "time_memory_limit": "timeout",
    "memory_limit": "timeout",
    "time_limit_exceeded": "timeout",
    "tle": "timeout",
    "missing_imports": "missing_import",
    "import_error": "missing_import",
    "module_not_found": "missing_import",
}


def _sandbox(rollout: Rollout) -> str:
    return f"\n{render_sandbox(rollout)}"


def prompt_values(case: FailureCase) -> dict[str, Any]:
    """What a code prompt holds beyond a math one. The reference program goes to the mentor (it is
    privileged, like a worked solution; the templates forbid writing code). Of the hidden tests the
    mentor sees only the failing assert lines the sandbox reported (in the attempts, and the first
    one here): a model shown every expected output tends to quote them, and a diagnosis needs the
    first failure only."""
    p, a = case.problem, analyse(case)
    return {
        "gold": (p.code.solution if p.code and p.code.solution else p.gold) or "(not available)",
        "reference": "\n".join(f"{i}. {s}" for i, s in enumerate(p.solution_steps, 1)) or "(not available)",
        "signature": a.signature or "(a whole program: it reads standard input and prints)",
        "first_test": a.first_test.render() if a.first_test else "(none: no attempt reached the tests)",
    }


MENTOR = MentorTask(
    failures=CODE_FAILURES,
    aliases=ALIASES,
    attempt_key=code_key,
    failure_of=code_failure,
    attempt_detail=_sandbox,
    gates=CODE_GATES,
    leak=code_leak,
    diagnose=steps.diagnose,
    hint=steps.hint,
    templates="mentor_fast.tasks.code",
    prompt_values=prompt_values,
)
