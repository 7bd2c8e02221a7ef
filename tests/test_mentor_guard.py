"""Leak guard: gold answers in every normalised form are caught, innocent numbers are not."""

import pytest

from mentor_fast.mentor import LeakGuard, check_hint, leaks_answer
from mentor_fast.tasks.math.gates import normalize_gold, shared_ngram

LEAKY = [
    ("42", "the answer is 42"),
    ("42", "The final answer: 42."),
    ("42", "\\boxed{42}"),
    ("42", "Write \\boxed{x} at the end."),  # any \boxed is a reject
    ("42", "forty-two"),
    ("42", "Forty two is what you need."),
    ("42", "6*7 = 42"),
    ("42", "Compute 6 \\times 7 = 42 and move on."),
    ("42", "6 times 7 equals 42"),
    ("42", "The result is 42 apples."),
    ("42", "You should get 42."),
    ("42", "42"),
    ("42", "$42$"),
    ("1", "so x = 1."),
    ("1", "Check: n = 1"),  # a relation ending the hint
    ("5", "answer: 5"),
    ("5", "x is 5"),
    ("5", "it equals 5 in total"),
    ("5", "so the total is five."),
    ("-5", "hence x = -5"),
    ("1/2", "0.5"),
    ("1/2", "It is 50% of the cards."),
    ("1/2", "\\dfrac{1}{2}"),
    ("1/2", "$\\tfrac12$"),
    ("\\frac{1}{2}", "one half is 0.50"),
    ("0.5", "50%"),
    ("0.5", "It's 1/2 of it"),
    ("50\\%", "so 50 of every hundred"),
    ("1000", "1,000"),
    ("1000", "1\\,000"),
    ("1000", "1{,}000 people"),
    ("1,000", "about 1000 people"),
    ("\\$1,000", "one thousand dollars"),
    ("\\frac{14}{3}", "about 4.67"),
    ("303", "three hundred and three"),
    ("432", "47 + 385 = 432"),
    ("\\text{Evelyn}", "Evelyn runs fastest"),
    ("p - q", "express it as p - q"),
    ("B", "the answer is B"),
    ("B", "Choice (B) is right"),
    ("18 \\text{ cm}", "The side is 18 cm long"),
    ("90^\\circ", "the angle is 90 degrees"),
]

CLEAN = [
    ("42", "first compute 6 times 7"),
    ("42", "there are 42 ways"),  # short gold, no answer-like context (decided: clean)
    ("42", "Compute 6*7 = 42 + y first? No: keep y separate."),  # 42 is not the final right-hand side
    ("1", "Consider n = 1 first and look for a pattern."),
    ("1", "In step 1, add the numbers."),
    ("1", "Try the smallest case, n = 1."),
    ("1", "Set x = 1 and simplify."),
    ("1", "For n = 1 the sum has one term"),
    ("1", "Note that 1 + x = y."),
    ("5", "If n is 5, the sum is larger"),
    ("5", "Each box holds 5 apples; count the boxes."),
    ("5", "We have 5x = 10."),
    ("5", "Think about five apples."),
    ("-5", "5 is positive"),
    ("1000", "10,000 people"),
    ("1000", "about 100 people"),
    ("24", "Compute 48/2 first."),  # an integer gold: a division to do is not a stated answer
    ("\\frac{14}{3}", "about 4.6"),
    ("432", "47 + 385 = 431"),
    ("432", "4320 is too big"),
    ("B", "Point B lies on the circle"),
    ("yes", "Look at the eyes of the figure"),
    ("303", "Subtract 129 from your total."),
]


@pytest.mark.parametrize("gold,hint", LEAKY)
def test_leaky_hints_are_rejected(gold, hint):
    verdict = check_hint(hint, gold)
    assert not verdict.ok, f"{hint!r} leaks gold {gold!r} but passed"
    assert leaks_answer(hint, gold)


@pytest.mark.parametrize("gold,hint", CLEAN)
def test_clean_hints_pass(gold, hint):
    verdict = check_hint(hint, gold)
    assert verdict.ok, f"{hint!r} (gold {gold!r}) rejected by {verdict.gate}: {verdict.detail}"
    assert not leaks_answer(hint, gold)


def test_gate_names_and_short_gold_context():
    assert check_hint("\\boxed{7}", "42").gate == "boxed"
    assert check_hint("it is 1,000", "1000").gate == "gold"
    assert check_hint("so x = 1.", "1").gate == "gold_context"
    assert "concluding" in check_hint("so x = 1.", "1").detail


def test_normalize_gold_forms():
    g = normalize_gold("\\boxed{\\dfrac{1}{2}}")
    assert g.values == {__import__("fractions").Fraction(1, 2)} and not g.short
    assert normalize_gold("5").short and normalize_gold("42").short and not normalize_gold("100").short
    assert normalize_gold("5.0").short  # 5.0 is the integer 5
    assert normalize_gold("\\text{Evelyn}").text == "evelyn"


def test_final_step_result_gate():
    # The gold is written differently from the last step's result; the last step's result leaks too.
    steps = ("She earns 12/60 = $0.2 per minute.", "In 50 minutes she earns 0.2 x 50 = $10.")
    assert check_hint("the total is 10.00 dollars", "ten dollars", steps).gate == "final_step"


def test_overlap_with_end_of_reference():
    steps = (
        "First list the cases by the number of red balls drawn.",
        "Each case is counted with the multiplication principle.",
        "Adding the cases counts every draw with at least one red ball exactly once.",
    )
    copied = "Remember that adding the cases counts every draw with at least one red ball."
    assert shared_ngram(copied, steps) is not None
    assert check_hint(copied, "99", steps).gate == "overlap"
    # the same words from the *start* of the solution are a plan, not the end: allowed
    assert check_hint("First list the cases by the number of red balls drawn.", "99", steps).ok
    assert check_hint("Count the cases with at least one red ball.", "99", steps).ok  # < 8 shared tokens


def test_code_gates_only_for_code_tasks():
    block = "Try this:\n```python\na = 1\nb = 2\nc = a + b\nprint(c)\n```"
    assert check_hint(block, "7", task="code").gate == "code_block"
    # a fence of any length is a reject now (it is the learner's code format, as \boxed is math's)
    assert check_hint("```\nx = 1\n```", "7", task="code").gate == "code_block"
    assert check_hint("Check the loop bounds of your function.", "7", task="code").ok
    assert check_hint("Write def solve(n): and recurse.", "7", task="code").gate == "code_def"
    assert check_hint(block, "7", task="math").ok


def test_length_cap_and_empty():
    assert check_hint("word " * 81, "7", level=1).gate == "too_long"
    assert check_hint("word " * 81, "7", level=3).ok
    assert check_hint("   ", "7").gate == "empty"
    assert not leaks_answer("   ", "7")  # empty is not a leak


def test_judge_hook_and_counts():
    seen = []

    def judge(hint, gold):
        seen.append((hint, gold))
        return "secret" in hint

    guard = LeakGuard(judge=judge)
    assert guard.check("the secret is near", "7").gate == "judge"
    assert guard.check("plain pointer", "7").ok
    assert guard.check("the answer is 7", "7").gate == "gold_context"  # deterministic gates first
    assert len(seen) == 2
    assert guard.counts.snapshot() == {"checked": 3, "judge": 1, "gold_context": 1}


def test_answer_word_needs_a_link_to_the_number():
    assert check_hint("Plan: 1) compute 64 * 3; 2) compute (the result of 1) - 96.", "96").ok
    assert not check_hint("The answer should be 96.", "96").ok
    assert not check_hint("Your final answer is therefore 96", "96").ok
    assert not check_hint("Result = 96", "96").ok
