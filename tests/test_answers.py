"""One answer extractor (mentor_fast/answers.py) for the verifier, the mentor's diagnosis and the guard."""

from __future__ import annotations

import pytest

from mentor_fast.answers import has_boxed, last_boxed, unwrap_boxed
from mentor_fast.mentor import check_hint
from mentor_fast.mentor.cases import FailureCase
from mentor_fast.mentor.testing import ladder_problem, make_group
from mentor_fast.rewards import math as verifier
from mentor_fast.tasks.math.gates import normalize_gold

# (completion, the answer every reader must take from it)
CASES = [
    (r"so \boxed{12}. Check: \boxed{\frac{1}{", "12"),  # a truncated second box: the complete one counts
    (r"\fbox{7}", "7"),
    (r"x \boxed{\frac{1}{2}} y", r"\frac{1}{2}"),
    (r"\boxed{\{1, 2\}}", r"\{1, 2\}"),  # escaped braces neither open nor close
    (r"\boxed{a \} b}", r"a \} b"),
    (r"\boxed{1} and \fbox{2}", "2"),
    (r"\boxed{\boxed{5}}", "5"),  # nested: the innermost starts last
    (r"\boxed {3}", "3"),
    (r"\boxed{ 42 }", "42"),
    (r"\boxed{}", ""),  # an empty box is a box, with an empty answer
    (r"\boxed 5", None),  # no braces: no box
    (r"\boxed{\frac{1}{", None),  # unclosed, nothing before it
    ("\\boxed{5\\", None),  # a trailing backslash escapes nothing
    ("no box", None),
]


@pytest.mark.parametrize("text, answer", CASES)
def test_last_boxed(text, answer):
    assert last_boxed(text) == answer


@pytest.mark.parametrize("text, answer", CASES)
def test_the_mentor_reads_the_answer_the_verifier_scored(text, answer):
    """The verifier's extraction (rewards/math.py) and the mentor's reading of an attempt (the
    answers it groups, counts and shows the diagnoser) agree on every input, malformed ones too."""
    assert verifier.last_boxed(text) == answer
    group = make_group(ladder_problem(), [text], correct=[False])
    case = FailureCase.from_group(group)
    expected = "<no answer>" if answer is None else answer.replace(" ", "")
    assert case.answers == {expected: 1}


def test_has_boxed_counts_an_unclosed_box():
    assert has_boxed(r"\boxed{\frac{1}{") and has_boxed(r"\fbox{") and not has_boxed(r"\boxed 5")


def test_the_guard_unwraps_a_boxed_gold_as_the_verifier_does():
    assert unwrap_boxed(r"\boxed{\frac{1}{2}}") == r"\frac{1}{2}"
    assert unwrap_boxed("42") == "42" and unwrap_boxed(r"\boxed{") == r"\boxed{"
    assert normalize_gold(r"\fbox{7}") == normalize_gold("7")
    assert normalize_gold(r"\boxed{3} or \boxed{\frac{3}{4}}") == normalize_gold(r"\frac{3}{4}")
    assert check_hint("So the answer is 7.", r"\fbox{7}").gate == "gold_context"
