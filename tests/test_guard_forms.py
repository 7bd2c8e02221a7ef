"""Leak guard: the same value in any written form is caught (math: fractions, negatives, radicals,
pi, powers, words; code: a hidden test's expected output), and hints that only mention an operand,
an input or a plan still pass."""

import pytest

from mentor_fast.mentor import check_hint, leaks_answer
from mentor_fast.mentor.guard import leak_gates
from mentor_fast.tasks.code.outputs import expected_outputs
from mentor_fast.tasks.math.gates import normalize_gold
from mentor_fast.types import CodeTask

FRAC, NEG, SURD, HALF_PI = "\\frac{3}{4}", "-7", "2\\sqrt{3}", "\\frac{\\pi}{2}"

LEAKING = [
    # 3/4 written as LaTeX, the hint in plain words or another notation
    (FRAC, "the answer is 3/4"),
    (FRAC, "You should get three quarters."),
    (FRAC, "It comes to 3 over 4."),
    (FRAC, "three fourths of the cards"),
    (FRAC, "three-quarters"),
    (FRAC, "0.75"),
    (FRAC, "75% of them"),
    (FRAC, "$\\dfrac{3}{4}$"),
    (FRAC, "¾"),
    (FRAC, "the answer is 3 divided by 4"),
    (FRAC, "so the probability is 3 out of 4"),
    ("3/4", "three over four"),
    # -7 in a sentence
    (NEG, "you should get negative seven"),
    (NEG, "the answer is minus 7"),
    (NEG, "you should get \u22127"),  # unicode minus
    (NEG, "the answer is -7"),
    (NEG, "It ends up 7 below zero."),
    (NEG, "so x = -7."),
    (NEG, "x equals negative 7"),
    (NEG, "minus seven"),
    (NEG, "The result is -7.0"),
    # 1.5
    ("1.5", "one and a half"),
    ("1.5", "1 1/2"),
    ("1.5", "1½"),
    ("1.5", "3/2"),
    ("1.5", "\\frac{3}{2}"),
    ("1.5", "150%"),
    ("1.5", "three halves"),
    ("1.5", "one point five"),
    ("1.5", "1.50"),
    ("1.5", "1\\frac{1}{2} cups"),
    # 1/3
    ("1/3", "one third"),
    ("1/3", "a third of the marbles"),
    ("1/3", "0.333"),
    ("1/3", "about 0.33"),
    ("1/3", "33.3%"),
    ("1/3", "0.\\overline{3}"),
    ("1/3", "1 over 3"),
    ("1/3", "the probability is 1 out of 3"),
    # 250
    ("250", "two hundred fifty"),
    ("250", "two hundred and fifty"),
    ("250", "250.0"),
    ("250", "2.5 \\times 10^2"),
    ("250", "2.5e2"),
    ("250", "\\$250"),
    # 2 sqrt 3
    (SURD, "2 sqrt(3)"),
    (SURD, "2√3"),
    (SURD, "two root three"),
    (SURD, "two times the square root of three"),
    (SURD, "2 * \\sqrt 3"),
    (SURD, "2\\cdot\\sqrt{3}"),
    (SURD, "the side is \\sqrt{12}"),  # unsimplified: a stated result
    (SURD, "about 3.46"),
    # pi / 2
    (HALF_PI, "pi/2"),
    (HALF_PI, "π/2"),
    (HALF_PI, "\\pi/2"),
    (HALF_PI, "pi over 2"),
    (HALF_PI, "the angle is pi divided by 2"),
    (HALF_PI, "about 1.57"),
    ("\\pi/2", "\\frac{\\pi}{2}"),
    # 1024 and powers
    ("1024", "the answer is 2^{10}"),
    ("1024", "so you get 2 to the 10th power"),
    ("1024", "the total is 2**10"),
    ("1024", "that makes 2 to the power of 10"),
    ("1024", "one thousand twenty-four"),
    ("1,024", "1024"),
    ("2^{10}", "1024"),
    ("2^{10}", "2**10"),
    ("2^{10}", "2 to the 10th"),
    ("24", "the answer is 48/2"),  # an integer gold's fraction, stated
]

CLEAN = [
    (FRAC, "multiply both sides by 4"),
    (FRAC, "the denominators are 3 and 4"),
    (FRAC, "a quarter of the cards are red"),
    (FRAC, "4/3 is the reciprocal"),
    (FRAC, "count the 3 red cards among the 4 drawn"),
    (NEG, "subtract 7 from both sides"),
    (NEG, "step 1: subtract 7"),
    (NEG, "x - 7 = 0 has one solution"),
    (NEG, "the total minus 7 is what remains"),
    (NEG, "negative numbers have no real square root"),
    (NEG, "move the 7 to the other side"),
    (NEG, "Think about which temperatures are below zero."),
    ("1.5", "divide 3 by 2"),
    ("1.5", "half of the 3 cakes"),
    ("1.5", "15 minutes pass"),
    ("1/3", "a third step is needed"),
    ("1/3", "the third term of the sequence"),
    ("1/3", "divide by 3"),
    ("1/3", "there are 3 cases"),
    ("250", "multiply 25 by 10"),
    ("250", "2500 is too big"),
    ("250", "a quarter of 1000"),
    (SURD, "\\sqrt{3} appears in the height of an equilateral triangle"),
    (SURD, "square both sides first"),
    (SURD, "the roots of the equation are real"),
    (SURD, "use sqrt(3) ≈ 1.732"),
    (SURD, "simplify \\sqrt{12}"),  # an expression to work out, not a stated result
    (HALF_PI, "pi is about 3.14"),
    (HALF_PI, "use the unit circle"),
    (HALF_PI, "\\pi/4 is half of the angle"),
    (HALF_PI, "2\\pi is a full turn"),
    ("1024", "compute 2^{10}"),  # an operation to carry out (as "48/2" for an integer gold)
    ("1024", "there are 10 doublings"),
    ("1024", "halve 2048"),
    ("24", "Compute 48/2 first."),
]


@pytest.mark.parametrize("gold,hint", LEAKING)
def test_every_form_of_the_gold_is_caught(gold, hint):
    v = check_hint(hint, gold)
    assert not v.ok and v.gate in ("gold", "gold_context"), f"{hint!r} leaks {gold!r} but got {v}"
    assert leaks_answer(hint, gold)


@pytest.mark.parametrize("gold,hint", CLEAN)
def test_operands_and_plans_pass(gold, hint):
    v = check_hint(hint, gold)
    assert v.ok, f"{hint!r} (gold {gold!r}) rejected by {v.gate}: {v.detail}"


def test_forms_count_and_one_reading_per_span():
    assert len(LEAKING) >= 40 and len(CLEAN) >= 30
    # "three quarters" is 3/4, not 3; "minus 7" is -7, not 7; "2 sqrt 3" is not 2
    assert check_hint("the answer is three quarters", "3").ok
    assert check_hint("you get minus 7", "7").ok
    assert check_hint("the answer is 2\\sqrt{3}", "2").ok
    assert check_hint("so it is 1 1/2", "1/2").ok


def test_gold_normal_forms():
    assert normalize_gold("2^{10}").values == {1024} and normalize_gold("2^{10}").form == "power"
    assert normalize_gold("-7").values == {-7} and normalize_gold("-7").short
    assert normalize_gold("2\\sqrt{3}").term == (2, 3, 0)
    assert normalize_gold("\\frac{\\pi}{2}").term == normalize_gold("\\pi/2").term
    assert normalize_gold("\\frac{\\sqrt{3}}{2}").term == (__import__("fractions").Fraction(1, 2), 3, 0)


# ---------------------------------------------------------------- code: a hidden test's output

COUNT_TESTS = """def check(candidate):
    assert candidate([3, 1, 2]) == 2
    assert candidate(list(range(10, 0, -1))) == 45
    assert candidate([]) == 0
    assert candidate([1, 3, 2]) == 1
check(count_inversions)
"""
COUNT_REF = """def count_inversions(nums):
    total_pairs = 0
    for i in range(len(nums)):
        for j in range(i + 1, len(nums)):
            if nums[i] > nums[j]:
                total_pairs += 1
    return total_pairs
"""
COUNT_Q = (
    "Write count_inversions(nums) that returns how many pairs of positions hold a larger value before a "
    "smaller one. Example: count_inversions([1, 5, 4]) returns 1."
)
WORDS_TESTS = """def check(candidate):
    assert candidate("hello world") == "world hello"
    assert candidate("") == ""
    assert candidate("one two three") == "three two one"
    assert candidate("a") == "a"
check(reverse_words)
"""
WORDS_REF = """def reverse_words(s):
    # split on runs of whitespace
    words_list = s.split()
    return ' '.join(reversed(words_list))
"""
WORDS_Q = "Write reverse_words(s) that returns the words of the string s in reverse order, one space apart."
DUP_TESTS = "assert has_duplicates([1, 2, 1]) is True\nassert not has_duplicates([1, 2])\n"
DUP_REF = "def has_duplicates(nums):\n    return len(set(nums)) != len(nums)\n"
DUP_Q = "Write has_duplicates(nums) that tells whether some value occurs twice in nums."
MEAN_TESTS = "def check(candidate):\n    assert abs(candidate([1, 2]) - 1.5) < 1e-9\ncheck(mean)\n"
MEAN_REF = "def mean(nums):\n    return sum(nums) / len(nums)\n"
UNIQ_TESTS = (
    "assert sorted_unique([3, 1, 3]) == [1, 3]\nassert sorted_unique([]) == []\nassert first([]) is None\n"
)
UNIQ_REF = (
    "def sorted_unique(nums):\n    seen = set()\n    for value in nums:\n        seen.add(value)\n"
    "    return sorted(seen)\n"
)
UNIQ_Q = "Write sorted_unique(nums) giving the distinct values of nums in increasing order."

BEST_REF = (
    "def largest(nums):\n    best = nums[0]\n    for x in nums[1:]:\n        if x > best:\n"
    "            best = x\n        elif x == best:\n            continue\n    return best\n"
)

TASKS = {
    "best": (
        CodeTask("assert largest([2, 9]) == 9\n", "largest", solution=BEST_REF),
        "Write largest(nums).",
    ),
    "count": (CodeTask(COUNT_TESTS, "count_inversions", solution=COUNT_REF), COUNT_Q),
    "words": (CodeTask(WORDS_TESTS, "reverse_words", solution=WORDS_REF), WORDS_Q),
    "dup": (CodeTask(DUP_TESTS, "has_duplicates", solution=DUP_REF), DUP_Q),
    "mean": (CodeTask(MEAN_TESTS, "mean", solution=MEAN_REF), "Write mean(nums), the average of nums."),
    "uniq": (CodeTask(UNIQ_TESTS, "sorted_unique", solution=UNIQ_REF), UNIQ_Q),
}

CODE_LEAKING = [
    ("count", "The function should return 45 for the second test.", "test_output"),
    ("count", "For the empty list it should return 0.", "test_output"),
    ("count", "If the list is empty, return 0.", "test_output"),
    ("count", "It returns 2 for the first test.", "test_output"),
    ("count", "The expected output is forty-five.", "test_output"),
    ("count", "Make sure that == 0 holds for an empty list", "test_output"),
    ("words", "For the first test the answer is world hello.", "test_output"),
    ("words", "It should give 'three two one'.", "test_output"),
    ("words", "For a single word it should return 'a'.", "test_output"),
    ("words", "For an empty input it should return an empty string.", "test_output"),
    ("dup", "It should return True for a list with a repeat.", "test_output"),
    ("mean", "The mean of the first test is 1.5.", "test_output"),
    ("uniq", "It should return [1, 3] for the first test.", "test_output"),
    ("uniq", "It should return an empty list for an empty input.", "test_output"),
    ("uniq", "first returns None when nums is empty", "test_output"),
    ("words", "```python\nreturn ' '.join(s.split()[::-1])\n```", "code_block"),
    ("words", "Use this:\n```\nx\n```", "code_block"),
    ("words", "Try:\n    parts = s.split()\n    return parts", "code_block"),
    ("words", "\tfor w in s.split():\n\t\tprint(w)", "code_block"),
    ("words", "def reverse_words(s): return the words reversed", "code_def"),
    ("words", "Write a helper lambda w: w.upper() first.", "code_def"),
    ("words", "Add `return s[::-1]` at the end.", "code_inline"),
    ("count", "Use `for i in range(n):` to loop.", "code_inline"),
    ("words", "Then return parts[::-1], which reverses them.", "code_inline"),
    ("count", "Start with result = len(nums) - 1 and go on.", "code_inline"),
    ("count", "Set `count = 0` first.", "code_inline"),
    ("count", "Keep the loop for j in range(i + 1, len(nums)): as the inner one", "code_inline"),
    ("best", "Add the branch elif x == best: to skip ties.", "code_line"),  # no statement alone
    ("words", "Store the pieces in words_list.", "code_identifier"),
    ("count", "Increase total_pairs for each pair.", "code_identifier"),
    ("uniq", "Call seen.add for each number.", "code_identifier"),
    ("dup", "Compare len(set(nums)) with len(nums).", "code_identifier"),
    ("count", "Check nums[i] > nums[j] for every pair of positions.", "code_overlap"),
]

CODE_CLEAN = [
    ("count", "Check what your function returns when the list is empty."),
    ("count", "Your function raises NameError: check the name the tests call."),
    ("count", "Trace your code on the example of the question: it should return 1 there."),  # shown
    ("count", "Loop over the positions with an index, and compare each value with the ones after it."),
    ("count", "Check the first 2 elements by hand."),
    ("count", "Return the count instead of printing it."),
    ("count", "If n is 0, the loop does nothing."),
    ("count", "Use two nested loops over the positions."),
    ("count", "Skip comparing a value with itself: use two different positions."),  # not a with statement
    ("count", "Make sure n = 0 is handled."),  # a one-letter relation reads as maths
    ("count", "Check if done: then stop."),  # a header without code punctuation is prose
    ("words", "It should return a string, not a list."),  # "a" is a hidden output, but a word here
    ("words", "Name your function reverse_words, with the parameter s, as the question says."),
    ("words", "The tests call `reverse_words(s)` with one string."),
    ("words", "Split the string into words, reverse their order, and join them with single spaces."),
    ("words", "Make sure it handles an empty string."),
    ("words", "Add import math at the top of your program."),
    ("words", "Add the import: from collections import Counter, at the top of your program."),
    ("uniq", "Use a set to keep the values you have seen, then sort them."),
    ("uniq", "Your loop stops one step early: range must reach the last index."),
    ("dup", "Compare the number of distinct values with the length of the list."),
    ("mean", "Divide the sum by how many values there are."),
    ("count", "Plan: 1) Start a count at zero; 2) Loop over the pairs; 3) Return the count."),  # step numbers
]


def test_step_numbers_of_a_plan_are_not_hidden_outputs():
    """Found in a code-ladder run: the level-2 plan was rejected because "Plan: 1)" read as the
    statement of the hidden output 1, and the group got a level-1 pointer instead."""
    from mentor_fast.types import CodeTask

    tests = "assert f([]) == 0\nassert f([1]) == 1\nassert f([-5, 2]) == 4\n"
    code = CodeTask(tests=tests, entry_point="f", solution="def f(xs):\n    return sum(x * x for x in xs if x > 0)\n")
    question = "Write a Python function `f(xs: list[int]) -> int` that returns the sum of the squares of the positives."
    plan = ("Plan: 1) Start a total at zero; 2) Go through the numbers one by one; 3) Skip the numbers that are "
            "not greater than 0; 4) Add the square of each remaining number; 5) Return the total.")
    assert check_hint(plan, code.solution, task="code", code=code, question=question).ok
    stated = check_hint("For a list holding only 1, it should return 1.", code.solution, task="code", code=code,
                        question=question)
    assert not stated.ok and stated.gate == "test_output"


@pytest.mark.parametrize("task,hint,gate", CODE_LEAKING)
def test_code_leaks_are_rejected_by_their_gate(task, hint, gate):
    code, question = TASKS[task]
    v = check_hint(hint, code.solution, task="code", code=code, question=question)
    assert not v.ok and v.gate == gate, f"{hint!r}: expected {gate}, got {v}"
    assert gate in leak_gates() and leaks_answer(
        hint, code.solution, task="code", code=code, question=question
    )


@pytest.mark.parametrize("task,hint", CODE_CLEAN)
def test_code_pointers_and_plans_pass(task, hint):
    code, question = TASKS[task]
    v = check_hint(hint, code.solution, task="code", code=code, question=question)
    assert v.ok, f"{hint!r} rejected by {v.gate}: {v.detail}"


def test_expected_outputs_of_tests():
    assert expected_outputs(COUNT_TESTS) == [2, 45, 0, 1]
    assert expected_outputs(DUP_TESTS) == [True, False]
    assert expected_outputs(MEAN_TESTS) == [1.5]
    assert expected_outputs(UNIQ_TESTS) == [[1, 3], [], None]


def test_what_the_question_or_prompt_shows_is_no_leak():
    code, question = TASKS["count"]
    assert not check_hint(
        "It should return 45.", code.solution, task="code", code=code, question=question
    ).ok
    assert check_hint(
        "It should return 45.",
        code.solution,
        task="code",
        code=code,
        question=question + " count_inversions(list(range(10, 0, -1))) returns 45.",
    ).ok
    # a HumanEval prompt shows the signature and names: they are the learner's too
    prompt = "def reverse_words(s):\n    words_list = None  # fill in\n"
    humaneval = CodeTask(WORDS_TESTS, "reverse_words", prompt=prompt, solution=WORDS_REF)
    assert not check_hint(
        "Fill words_list first.", WORDS_REF, task="code", code=TASKS["words"][0], question=WORDS_Q
    ).ok
    assert check_hint("Fill words_list first.", WORDS_REF, task="code", code=humaneval, question=WORDS_Q).ok


def test_code_gold_skips_the_math_gates():
    # a program gold is no number: "the answer" or "0" in a code hint is judged by the code gates only
    code, question = TASKS["words"]
    assert check_hint(
        "Split on whitespace; the answer is in the order of the words.",
        WORDS_REF,
        ("Split the string.", "Reverse the words."),
        "code",
        2,
        code=code,
        question=question,
    ).ok
    assert check_hint("```\nx\n```", "7", task="math").ok  # and math hints never run the code gates
