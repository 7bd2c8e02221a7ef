"""Agents: tolerant JSON, garbage handling, fused and separate calls, and the worked-solutions writer."""

import json

import pytest

from mentor_fast.mentor import (
    Diagnosis,
    FailureCase,
    LLMAgents,
    WorkedSolutions,
    check_hint,
    cold_hint,
    parse_json_object,
)
from mentor_fast.mentor.cases import choose_attempts, truncate_middle
from mentor_fast.mentor.task import mentor_task
from mentor_fast.mentor.testing import ScriptedBackend, ladder_problem, make_group
from mentor_fast.mentor.writers.base import Failed
from mentor_fast.mentor.writers.prompts import diagnose_messages, fused_messages, instruct_messages, prompt
from mentor_fast.mentor.writers.replies import parse_hint
from mentor_fast.tasks import TaskKind
from mentor_fast.types import Problem

MATH, CODE = mentor_task(TaskKind.MATH), mentor_task(TaskKind.CODE)
DIAG = {
    "failure_type": "arithmetic slip",
    "root_cause": "432 - 129 is done wrongly.",
    "first_error": "step 2",
    "missing_knowledge": None,
    "confidence": 0.8,
}


@pytest.mark.parametrize(
    "reply",
    [
        json.dumps(DIAG),
        "Sure, here it is:\n```json\n" + json.dumps(DIAG, indent=2) + "\n```\nHope this helps.",
        '{"failure_type": "arithmetic slip", "confidence": 0.8,}',  # trailing comma
        # single quotes + null
        "{'failure_type': 'arithmetic slip', 'missing_knowledge': null, 'confidence': 0.8}",
        'Analysis... {"note": "a } inside a string"} then {"failure_type": "arithmetic slip"}',
    ],
)
def test_tolerant_json(reply):
    obj = parse_json_object(reply)
    assert obj is not None
    if "failure_type" in obj:
        assert MATH.label(obj["failure_type"]) == "arithmetic_slip"
    else:
        assert obj == {"note": "a } inside a string"}


@pytest.mark.parametrize("reply", ["", "no json at all", "{unclosed", "[1, 2, 3]", "{'a': open('x')}"])
def test_garbage_json_is_none(reply):
    assert parse_json_object(reply) is None


def test_labels_and_diagnosis_from_json():
    assert MATH.label("Format/Extraction") == "format"
    assert MATH.label("no verification / premature answer") == "premature_answer"
    assert CODE.label("Edge cases") == "wrong_output"  # the old code label, now an alias
    assert MATH.label("edge cases") == "other"  # closed per task
    d = Diagnosis.from_json({"failure_type": "truncation", "confidence": "7", "missing_knowledge": "null"}, MATH)
    assert d.failure_type == "truncation" and d.confidence == 1.0 and d.missing_knowledge is None
    assert Diagnosis.from_json({"root_cause": "no label"}, MATH) is None
    assert Diagnosis.from_json(["not", "a", "dict"], MATH) is None


def test_attempt_selection_covers_distinct_answers_and_truncates():
    p = ladder_problem()
    g = make_group(p, ["a \\boxed{1}", "b \\boxed{1}", "c \\boxed{2}", "d no answer", "e \\boxed{ 2 }"])
    chosen = choose_attempts(g.rollouts, MATH, k=3)
    assert [r.text[0] for r in chosen] == ["a", "c", "d"]
    same = make_group(p, ["x \\boxed{1}"] * 4)
    assert len(choose_attempts(same.rollouts, MATH, k=3)) == 2  # answer-concentrated: still two attempts
    long = "H" * 1000 + "M" * 1000 + "T" * 1000
    cut = truncate_middle(long, 100, 100)
    assert (
        cut.startswith("H" * 100) and cut.endswith("T" * 100) and "M" not in cut and "2800 characters" in cut
    )
    case = FailureCase.from_group(g)
    assert case.answers == {"1": 2, "2": 2, "<no answer>": 1}


def test_prompts_are_filled_and_share_a_prefix():
    case = FailureCase.from_group(make_group(ladder_problem(), ["47 + 385 = 431 \\boxed{302}"] * 3))
    d = Diagnosis("arithmetic_slip", "slip")
    msgs = [diagnose_messages(case), fused_messages(case), instruct_messages(case, d, 2, "it states 303")]
    for m in msgs:
        assert m[0] == msgs[0][0] and m[1]["content"].startswith("Problem:\n" + case.problem.question)
        assert "$" not in m[1]["content"].replace("\\$", "")  # every template variable substituted
    assert "arithmetic_slip" in msgs[0][1]["content"] and "432 - 129 = 303" in msgs[0][1]["content"]
    assert "Level 2, a plan" in msgs[2][1]["content"] and "rejected: it states 303" in msgs[2][1]["content"]
    assert "Attempt 1" in msgs[1][1]["content"] and "hint_l3" in msgs[1][1]["content"]
    assert prompt("system").strip()


def test_fused_call_gives_diagnosis_and_all_levels_in_one_call():
    reply = json.dumps(
        {
            "diagnosis": DIAG,
            "hint_l1": "Recheck the subtraction.",
            "hint_l2": "Plan: add, then subtract.",
            "hint_l3": "Start with 47 + 385.",
        }
    )
    backend = ScriptedBackend(lambda m: reply)
    agents = LLMAgents(backend, fused=True)
    case = FailureCase.from_group(make_group(ladder_problem(), ["\\boxed{302}"] * 2))
    [d] = agents.diagnose([case])
    assert d.failure_type == "arithmetic_slip" and len(backend.calls) == 1
    hints = agents.instruct([case, case], [d, d], [1, 3], [None, None])
    assert hints == ["Recheck the subtraction.", "Start with 47 + 385."] and len(backend.calls) == 1  # cached
    backend.script = lambda m: "<hint>Another pointer.</hint>"
    assert agents.instruct([case], [d], [2], ["it leaked"]) == ["Another pointer."]  # feedback: a new call
    assert len(backend.calls) == 2


def test_garbage_is_retried_once_then_failed():
    replies = ["I cannot answer that.", "still not json", json.dumps(DIAG)[:-1] + ",}", None, None]
    # case 0: garbage, retry garbage -> Failed(garbage); case 1: tolerant JSON first time; case 2: error
    backend = ScriptedBackend(
        [
            replies[0],
            replies[2],
            None,
            replies[1],
        ]
    )
    agents = LLMAgents(backend, fused=False)
    cases = [
        FailureCase.from_group(make_group(ladder_problem(f"q{i}"), ["\\boxed{1}"] * 2))
        for i in range(3)
    ]
    out = agents.diagnose(cases)
    assert out[0] == Failed("garbage") and isinstance(out[1], Diagnosis) and out[2] == Failed("error")
    assert len(backend.calls) == 2 and len(backend.calls[1]) == 1  # one retry, only for the garbage item
    retry_msgs = backend.calls[1][0]
    assert retry_msgs[-2] == {"role": "assistant", "content": "I cannot answer that."}
    assert "JSON" in retry_msgs[-1]["content"]
    assert backend.counts.snapshot() == {"errors/scripted": 1, "retries/parse": 1}


def test_hint_parsing():
    assert parse_hint("Thoughts... <hint>Check the borrow.</hint>") == "Check the borrow."
    assert parse_hint("Hint: check the borrow.") == "check the borrow."
    assert parse_hint("<hint>   </hint>") is None and parse_hint(None) is None


# ---------------------------------------------------------------- the worked-solutions writer


def ladder_case(texts, finish="stop"):
    return FailureCase.from_group(make_group(ladder_problem(), texts, finish=finish))


def test_worked_solutions_end_to_end_on_a_ladder_problem():
    ref = WorkedSolutions()
    case = ladder_case(["47 + 385 = 431, 431 - 129 = 302, \\boxed{302}", "I get \\boxed{293}"])
    [d] = ref.diagnose([case])
    assert d.failure_type == "arithmetic_slip" and d.first_error == "step 1: 47 + 385"
    h1, h2, h3 = ref.instruct([case] * 3, [d] * 3, [1, 2, 3], [None] * 3)
    assert h1 == "Work out 47 + 385 (an addition) first, carefully."
    assert h2.startswith("Plan: 1) compute 47 + 385; 2) compute (the result of 1) - 129")
    assert "432" not in h2  # a plan names results, never states them
    assert "47 + 385 = 432" in h3  # level 3: the first missing step with its result
    for level, h in zip((1, 2, 3), (h1, h2, h3)):
        assert "303" not in h and check_hint(h, "303", case.problem.solution_steps, level=level).ok


def test_worked_solutions_never_gives_the_last_result():
    ref = WorkedSolutions()
    case = ladder_case(["47 + 385 = 432 then 432 - 129 = 313 \\boxed{313}"] * 2)  # step 1 right, step 2 wrong
    [d] = ref.diagnose([case])
    assert d.first_error == "step 2: 432 - 129"
    for level in (1, 2, 3):
        h = ref.hint(case, d, level)
        assert "432 - 129" in h and "303" not in h and check_hint(h, "303", case.problem.solution_steps).ok


def test_a_step_counts_as_reached_only_when_an_attempt_computed_its_result():
    """Level 7 (a # b = 2a + b): step 1's result 2 turns up as a stray line and as an operand, which
    is not computing it; the diagnosis must still point at step 1, the rule the attempts lack."""
    problem = Problem("p7", "What is 1 # 39?", "41", ("2 * 1 = 2", "2 + 39 = 41"), level=7, source="ladder")
    ref = WorkedSolutions()

    def first_error(texts):
        case = FailureCase.from_group(make_group(problem, texts))
        return ref.diagnose([case])[0].first_error

    assert first_error(["1\n1 # 39\n2\n1 + 39 = 40\n\\boxed{40}", "2 + 39 is 39 \\boxed{39}"]) == "step 1: 2 * 1"
    assert first_error(["2 * 1 = 2, 2 + 39 = 42 \\boxed{42}"] * 2) == "step 2: 2 + 39"


def test_reference_plan_names_each_earlier_result_once():
    """(2 + 3) * 5 + 3 * 7: step 2 is "5 * 5", one factor the result of step 1 and one the operand 5.
    Naming both "(the result of 1)" would square it; each result is used once."""
    problem = Problem("p6", "What is (2 + 3) * 5 + 3 * 7?", "46",
                      ("2 + 3 = 5", "5 * 5 = 25", "3 * 7 = 21", "25 + 21 = 46"), level=6, source="ladder")
    hint = cold_hint(problem, 2)
    assert hint.startswith(
        "Plan: 1) compute 2 + 3; 2) compute (the result of 1) * 5; 3) compute 3 * 7; "
        "4) compute (the result of 2) + (the result of 3)."
    ), hint


def test_worked_solutions_reads_verifier_signals():
    ref = WorkedSolutions()
    [trunc] = ref.diagnose([ladder_case(["47 + 385 is " + "very " * 50] * 3, finish="length")])
    [fmt] = ref.diagnose([ladder_case(["I think it is 300", "maybe 12", "\\boxed{5}"])])
    [strategy] = ref.diagnose([ladder_case(["47 * 385 = 18095 \\boxed{18095}"] * 2)])
    assert (trunc.failure_type, fmt.failure_type, strategy.failure_type) == (
        "truncation",
        "format",
        "wrong_strategy",
    )
    assert ref.hint(ladder_case(["so"] * 2), fmt, 1).startswith("End with one final answer in a box")
    # GSM8K-style steps: the result follows "=" inside a sentence
    from mentor_fast.types import Problem

    p = Problem(
        "g1",
        "Natalia sold clips ...",
        "72",
        (
            "Natalia sold 48/2 = 24 clips in May.",
            "Natalia sold 48+24 = 72 clips altogether in April and May.",
        ),
    )
    case = FailureCase.from_group(make_group(p, ["48*2 = 96, so \\boxed{144}"] * 2))
    [d] = ref.diagnose([case])
    assert ref.hint(case, d, 3) == "Start with this step: 48 / 2 = 24. Then continue on your own."
    assert "72" not in ref.hint(case, d, 2)
    # no worked solution: stock metacognitive hints
    bare = FailureCase.from_group(make_group(Problem("b", "q?", "7"), ["\\boxed{1}"] * 2))
    [bd] = ref.diagnose([bare])
    assert "Re-read the question" in ref.hint(bare, bd, 1)


@pytest.mark.parametrize(
    "step,lhs",
    [
        ("47 + 385 = 432", "47 + 385"),
        ("Working 50 minutes, she earned 0.2 x 50 = $10.", "0.2 * 50"),
        ("20 drops/minute x 120 minutes = 2400 drops", "20 * 120"),
        ("2400 drops x 5 ml/100 drops = 120 ml", "2400 * 5 / 100"),
        ("There are 22 pieces because 14 plus 8 equals 22.", "14 + 8"),
        ("-14 + (-8) + 1 = -21 degrees", "-14 + (-8) + 1"),
        ("He had $10, so 10 - 2 - 3 = 5", "10 - 2 - 3"),
        ("x = 2 * 3 = 6", "2 * 3"),
        ("This means that X = 3X - 18", ""),  # no bare computation: never quoted
        ("He gets 79 questions right in total.", ""),
    ],
)
def test_reference_steps_are_read_as_bare_computations(step, lhs):
    from mentor_fast.tasks.math.steps import parse_step

    assert parse_step(1, step).lhs == lhs
