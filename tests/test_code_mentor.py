"""The code mentor: the closed code taxonomy read from genuine sandbox results of deliberately wrong
programs, the worked-solutions writer's diagnosis and hints by level (no code, no hidden expected output),
and the LLM agents' code templates over a fake backend (fault_injection-style fixed replies)."""

import json

import pytest

from mentor_fast.mentor import FailureCase, LeakGuard, LLMAgents, WorkedSolutions, cold_hint
from mentor_fast.mentor.cases import choose_attempts
from mentor_fast.mentor.counts import Counts
from mentor_fast.mentor.diagnosis import Diagnosis
from mentor_fast.mentor.task import mentor_task
from mentor_fast.mentor.testing import CharPromptBuilder, mentor_configs
from mentor_fast.mentor.writers.prompts import diagnose_messages, fused_messages, instruct_messages
from mentor_fast.rewards.code import run_tests
from mentor_fast.tasks import TaskKind
from mentor_fast.tasks.code.analysis import describe_input, parse_test_line
from mentor_fast.tasks.code.attempts import code_failure
from mentor_fast.tasks.code.outputs import expected_outputs
from mentor_fast.types import CodeTask, Group, Problem, Rollout

REFERENCE = """def second_largest(nums):
    distinct = sorted(set(nums), reverse=True)
    if len(distinct) < 2:
        return None
    return distinct[1]
"""
TESTS = """def check(candidate):
    assert candidate([3, 1, 4, 1, 5]) == 4
    assert candidate([7, 7, 7]) is None
    assert candidate([10, 10, 9]) == 9
    assert candidate([]) is None
    assert candidate([-2, -8, -5]) == -5

check(second_largest)
"""
QUESTION = (
    "Write a function second_largest(nums) that returns the second largest distinct value in the list "
    "nums, or None when there is no such value. Example: second_largest([2, 8, 5]) returns 5."
)
STEPS = (
    "Drop repeated values so that each value counts once.",
    "When fewer than two distinct values remain, give back None.",
    "Order the distinct values from largest to smallest and take the second one.",
)
MARKERS = (r"set\(|fromkeys|not in", r"len\(.*\)\s*<\s*2|<=\s*1|None", r"sort|max\(|nlargest")
PROBLEM = Problem(
    "code-1",
    QUESTION,
    REFERENCE,
    STEPS,
    source="test",
    code=CodeTask(TESTS, "second_largest", solution=REFERENCE, step_markers=MARKERS),
)
NO_DEDUPE = "def second_largest(nums):\n    s = sorted(nums)[::-1]\n    return s[1] if s[1:] else None\n"
HEAPQ = "def second_largest(nums):\n    top = heapq.nlargest(2, set(nums))\n    return (top + [None])[1]\n"
PROGRAMS = {  # deliberately wrong programs -> the label their genuine sandbox result must get
    "no_dedupe": (NO_DEDUPE, "wrong_output"),
    "index": ("def second_largest(nums):\n    s = sorted(set(nums))\n    return s[-2]\n", "exception"),
    "name": ("def second_max(nums):\n    return sorted(set(nums))[-2]\n", "signature"),
    "arity": ("def second_largest(nums, k):\n    return sorted(set(nums))[-k]\n", "signature"),
    "colon": ("def second_largest(nums)\n    return sorted(set(nums))[-2]\n", "syntax"),
    "heapq": (HEAPQ, "missing_import"),
    "numpy": ("import numpy_not_here\ndef second_largest(nums):\n    return None\n", "missing_import"),
    "typo": ("def second_largest(nums):\n    s = sorted(set(nums))\n    return sss[-2]\n", "exception"),
    "loop": ("def second_largest(nums):\n    while True:\n        pass\n", "timeout"),
    "prints": (
        "def second_largest(nums):\n    s = sorted(set(nums))\n    print(s[-2] if len(s) > 1 else None)\n",
        "wrong_output",
    ),
}


def attempt(text, result=None, finish="stop", problem=PROBLEM):
    r = Rollout(problem, 0, [1], [1], [0.0], text, finish, 0)
    r.verifier_detail = result
    r.correct = bool(result is not None and result.passed)
    r.verifier_note = "not run" if result is None else f"{result.status} {result.exception}".strip()
    return r


@pytest.fixture(scope="module")
def results():
    # a 2 s timeout keeps the infinite loop cheap; every other program ends in well under a second
    return {k: run_tests(prog, TESTS, 2.0) for k, (prog, _) in PROGRAMS.items()}


def run(results, kind):
    return attempt(f"Here is my solution:\n```python\n{PROGRAMS[kind][0]}```\nDone.", results[kind])


MATH, CODE = mentor_task(TaskKind.MATH), mentor_task(TaskKind.CODE)
CODE_FAILURES = CODE.failures


def case_of(rollouts):
    return FailureCase.from_group(Group(0, PROBLEM, [1], rollouts))


# ---------------------------------------------------------------- taxonomy


@pytest.mark.parametrize("kind", list(PROGRAMS))
def test_genuine_sandbox_results_get_their_label(results, kind):
    r = run(results, kind)
    assert not r.verifier_detail.passed
    assert code_failure(r) == PROGRAMS[kind][1], (kind, r.verifier_detail)


def test_unrun_attempts_format_and_truncation():
    assert code_failure(attempt("I think you should sort the list and pick the second one.")) == "format"
    assert (
        code_failure(attempt("```python\ndef second_largest(nums):\n    ret", finish="length"))
        == "truncation"
    )
    assert code_failure(attempt("")) == "other"  # nothing to read


def test_taxonomy_is_closed_and_old_labels_are_aliases():
    assert set(CODE_FAILURES) == {
        "syntax",
        "signature",
        "exception",
        "wrong_output",
        "timeout",
        "missing_import",
        "format",
        "truncation",
    }
    aliases = {
        "syntax_error": "syntax",
        "runtime_error": "exception",
        "Runtime error": "exception",
        "time_limit": "timeout",
        "wrong_algorithm": "wrong_output",
        "edge_case": "wrong_output",
        "io_format": "wrong_output",
        "Missing import": "missing_import",
        "wrong signature": "signature",
    }
    for old, new in aliases.items():
        assert CODE.label(old) == new
    assert CODE.label("arithmetic_slip") == "other"
    assert MATH.label("timeout") == "other"


def test_attempts_are_told_apart_by_how_they_fail(results):
    same = [run(results, "no_dedupe") for _ in range(3)]
    other = run(results, "index")
    assert CODE.attempt_key(same[0]) == "wrong_output: AssertionError at assert candidate([7, 7, 7]) is None"
    assert CODE.attempt_key(other).startswith("exception: IndexError at ")
    chosen = choose_attempts([*same, other], CODE, k=2)
    assert chosen[0] is same[0] and chosen[1] is other  # the differently failing one is shown
    case = case_of([*same, other])
    assert case.kinds == {"wrong_output": 3, "exception": 1} and len(case.answers) == 2


def test_render_attempts_show_the_sandbox(results):
    text = case_of([run(results, "index"), run(results, "colon")]).render_attempts()
    assert "Sandbox: error, IndexError: list index out of range" in text
    assert "Failing test: assert candidate([7, 7, 7]) is None" in text
    assert "Failure kind: syntax" in text and "SyntaxError" in text


# ---------------------------------------------------------------- the worked-solutions writer


def test_failing_test_is_parsed_as_data():
    t = parse_test_line("assert candidate([7, 7, 7]) is None", "second_largest")
    assert (t.call, t.expected, t.args) == ("second_largest([7, 7, 7])", "None", ([7, 7, 7],))
    t = parse_test_line("    assert total([1, 2]) == 3", "total")
    assert (t.call, t.expected) == ("total([1, 2])", "3")
    assert parse_test_line("check(second_largest)", "second_largest").call == ""
    assert describe_input(([],)) == "an empty list" and describe_input(("",)) == "an empty string"
    assert describe_input(([1, 2, 1],)) == "a list with duplicate values"
    assert describe_input(([3, -1],)) == "a list with negative numbers" and describe_input((5,)) is None


def test_diagnosis_majority_first_test_and_missing_step(results):
    case = case_of([run(results, "no_dedupe"), run(results, "no_dedupe"), run(results, "index")])
    [d] = WorkedSolutions().diagnose([case])
    assert d.failure_type == "wrong_output"
    assert "assert candidate([7, 7, 7]) is None" in d.first_error and "expected None" in d.first_error
    assert "input second_largest([7, 7, 7])" in d.first_error
    assert "no attempt has step 1" in d.root_cause and d.missing_knowledge == STEPS[0]
    # a tie goes to the earliest blocker: code that does not compile hides the rest
    [d] = WorkedSolutions().diagnose([case_of([run(results, "no_dedupe"), run(results, "colon")])])
    assert d.failure_type == "syntax"
    [d] = WorkedSolutions().diagnose([case_of([run(results, "no_dedupe")] * 2 + [run(results, "loop")])])
    assert d.failure_type == "wrong_output" and d.confidence == pytest.approx(0.4 + 0.5 * 2 / 3, abs=0.01)


def test_truncated_groups_are_truncation():
    cut = [attempt("```python\ndef second_largest(nums):\n    distinct =", finish="length") for _ in range(2)]
    case = case_of(cut)
    [d] = WorkedSolutions().diagnose([case])
    assert d.failure_type == "truncation"
    assert "length limit" in WorkedSolutions().hint(case, d, 1)


HINTS = {  # kind -> what each level must say (genuine failures; the hints are the mentor's own)
    "no_dedupe": (
        "returns a wrong value on a list whose values are all the same",
        "1) Drop repeated values so that each value counts once (your attempts miss this step); 2)",
        "The step your attempts lack: Drop repeated values",
    ),
    "index": (
        "raises IndexError (list index out of range)",
        "give back None (your attempts miss this step)",
        "lack: When fewer than two distinct values remain, give back None",
    ),
    "name": (
        "the tests call second_largest, and your code defines no function of that name",
        "The tests call second_largest(nums): name your function exactly second_largest",
        "second_largest(nums)",
    ),
    "arity": (
        "cannot be called the way the tests call it",
        "give it the parameters the question gives",
        "second_largest(nums)",
    ),
    "colon": (
        "does not compile: SyntaxError (expected ':' (line 1))",
        "ends with a colon",
        "ends with a colon",
    ),
    "heapq": (
        "uses heapq without importing it",
        "Add import heapq at the top",
        "Add import heapq at the top",
    ),
    "numpy": (
        "imports numpy_not_here, which is not available",
        "use only the standard library",
        "standard library",
    ),
    "loop": ("does not finish within the time limit", "every loop ends", "Drop repeated values"),
    "prints": (
        "prints its result but returns nothing",
        "Return the result instead of printing it",
        "Return the result instead of printing it",
    ),
}


@pytest.mark.parametrize("kind", list(HINTS))
def test_hints_by_level_say_what_and_never_code_or_outputs(results, kind):
    case = case_of([run(results, kind), run(results, kind)])
    mentor, guard = WorkedSolutions(), LeakGuard()
    [d] = mentor.diagnose([case])
    outputs = [repr(v) for v in expected_outputs(TESTS) if repr(v) not in QUESTION]  # 4, 9, -5
    for level, must in zip((1, 2, 3), HINTS[kind]):
        hint = mentor.hint(case, d, level)
        assert must in hint, (level, hint)
        v = guard.check(hint, PROBLEM.gold, STEPS, "code", level, PROBLEM.code, question=QUESTION)
        assert v.ok, (level, hint, v)
        assert "```" not in hint and "def " not in hint and "return s" not in hint
        assert not any(f" {o} " in f" {hint} " or f" {o}." in hint for o in outputs), hint
    plan = mentor.hint(case, d, 2)
    if kind not in ("numpy",):  # the steps in order
        assert plan.index("1) Drop") < plan.index("2) When") < plan.index("3) Order")


def test_cold_hint_for_a_code_problem_points_at_the_first_step():
    assert "Drop repeated values" in cold_hint(PROBLEM, 3)
    assert cold_hint(PROBLEM, 2).startswith("Plan: 1) Drop repeated values")
    assert "Re-read the question" in cold_hint(PROBLEM, 1)


def test_pipeline_guards_code_hints_with_the_problems_code_task(results):
    """The Mentor passes the problem's CodeTask to the guard: a hint stating a hidden test's expected
    output is rejected (test_output needs code.tests), the worked-solutions writer's own hint passes."""
    from mentor_fast.mentor import Mentor

    class FakeLeakyAgents(WorkedSolutions):  # fault injection: the first hint states a hidden output
        name, regenerates = "fake_leaky", True

        def __init__(self):
            super().__init__()
            self.asked = 0

        def instruct(self, cases, diagnoses, levels, feedback):
            self.asked += 1
            if self.asked == 1:
                return ["The function should return 9 for the third test." for _ in cases]
            return super().instruct(cases, diagnoses, levels, feedback)

    # a mentor built with math's defaults: the problem's CodeTask alone makes it a code case
    cfg = mentor_configs(
        "trigger.max_groups_frac=1.0", "trigger.collapse_abs=1.0", "trigger.collapse_delta=1.0"
    )
    mentor = Mentor(*cfg, FakeLeakyAgents(), CharPromptBuilder())
    group = Group(3, PROBLEM, [1], [run(results, "no_dedupe") for _ in range(4)])
    [iv] = mentor.write_hints([group], 0).interventions
    assert [v["gate"] for v in iv.verdicts] == ["test_output", None]
    assert iv.hint is not None and iv.hint.text.startswith("Your function returns a wrong value")
    assert iv.diagnosis.failure_type == "wrong_output"


# ---------------------------------------------------------------- LLM agents: the code templates


class FakeCodeBackend:
    """A MentorBackend with fixed replies (JSON diagnosis, fused hints, or a <hint>), keeping every batch."""

    name = "fake_code"

    def __init__(self, fused=True):
        self.fused, self.calls, self.counts = fused, [], Counts()

    def complete(self, batch, max_tokens, temperature):
        self.calls.append(batch)
        diag = {
            "failure_type": "Runtime error",
            "root_cause": "s[-2] on one distinct value.",
            "first_error": "assert candidate([7, 7, 7]) is None",
            "missing_knowledge": None,
            "confidence": 0.7,
        }
        reply = (
            {
                "diagnosis": diag,
                "hint_l1": "Check a list whose values are all equal.",
                "hint_l2": "Plan: drop repeats, check how many remain, pick the second.",
                "hint_l3": "Handle fewer than two distinct values first.",
            }
            if self.fused
            else diag
        )
        return [
            json.dumps(reply)
            if "Reply with only this JSON" in m[-1]["content"]
            else "<hint>Look at the length check.</hint>"
            for m in batch
        ]


def test_code_cases_render_the_code_templates_filled(results):
    case = case_of([run(results, "index"), run(results, "no_dedupe")])
    d = Diagnosis("exception", "index past the end", "assert candidate([7, 7, 7]) is None")
    msgs = {
        "diagnose": diagnose_messages(case),
        "fused": fused_messages(case),
        "instruct": instruct_messages(case, d, 3, "it stated a test's output"),
    }
    for name, m in msgs.items():
        user = m[1]["content"]
        assert "$" not in user, name  # every placeholder substituted
        assert user.startswith("Problem:\n" + QUESTION) and "Function to write: second_largest(nums)" in user
        assert REFERENCE.strip() in user and "1. Drop repeated values" in user  # privileged: mentor only
        assert (
            "First failing test (hidden from the student" in user or "First failing test (the student" in user
        )
        assert "assert candidate([7, 7, 7]) is None (input second_largest([7, 7, 7]), expected None)" in user
        assert "never write code" in user or name == "diagnose"
        assert "candidate([-2, -8, -5])" not in user  # tests that no attempt failed on stay hidden
    for name in ("diagnose", "fused"):
        user = msgs[name][1]["content"]
        assert "Sandbox: error, IndexError" in user and "Failure kind: wrong_output" in user
        assert "missing_import" in user and "wrong_output" in user and "arithmetic_slip" not in user
    assert "Level 3, a concrete first step: the step the attempts lack" in msgs["instruct"][1]["content"]
    assert "rejected: it stated a test's output" in msgs["instruct"][1]["content"]
    assert "never state what a test expects" in msgs["fused"][1]["content"]


@pytest.mark.parametrize("fused", [True, False])
def test_llm_agents_on_a_code_case(results, fused):
    backend = FakeCodeBackend(fused)
    agents = LLMAgents(backend, fused=fused)
    case = case_of([run(results, "index"), run(results, "index")])
    [d] = agents.diagnose([case])
    assert d.failure_type == "exception" and d.confidence == 0.7  # "Runtime error" on the code taxonomy
    sent = backend.calls[0][0][1]["content"]
    assert ("hint_l1" in sent) == fused and "Function to write: second_largest(nums)" in sent
    hints = agents.instruct([case], [d], [3], [None])
    assert hints == (
        ["Handle fewer than two distinct values first."] if fused else ["Look at the length check."]
    )
    assert len(backend.calls) == (1 if fused else 2)
    if not fused:
        assert (
            "Level 3, a concrete first step: the step the attempts lack" in backend.calls[1][0][1]["content"]
        )
