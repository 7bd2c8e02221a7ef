"""A method's checkpoint state is plain data: no class is pickled, so renaming one does not break
resume, and the state survives a JSON round trip unchanged."""

import json

import pytest

from mentor_fast.mentor import Diagnosis, FailureCase, Mentor, WorkedSolutions
from mentor_fast.mentor.pipeline import HintedStep
from mentor_fast.mentor.testing import CharPromptBuilder, ladder_problem, make_group, mentor_configs
from mentor_fast.recovery.plain import from_plain, is_plain, to_plain
from mentor_fast.rewards.code import CodeResult
from mentor_fast.tasks import TaskKind
from mentor_fast.types import CodeTask, ExtraTerm, Group, Hint, Problem, Rollout, TokenWeighting


def json_round_trip(data):
    return json.loads(json.dumps(data))


def hinted_step() -> HintedStep:
    """Step 7's hints for two all-fail groups of three, written by the worked-solutions writer, with
    what a checkpoint may meet besides: a sandbox result, a cached level-keyed hint, loss data."""
    mentor = Mentor(*mentor_configs("trigger.max_groups_frac=1.0"), WorkedSolutions(), CharPromptBuilder())
    groups = [make_group(ladder_problem(f"p{i}"), ["so \\boxed{1}", "so \\boxed{2}"], group_id=i) for i in range(2)]
    groups.append(make_group(ladder_problem("p2"), ["so \\boxed{303}", "so \\boxed{2}"], group_id=2))
    hinted = mentor.write_hints(groups, 7)
    assert len(hinted.interventions) == 2 and all(iv.hint is not None for iv in hinted.interventions)
    detail = CodeResult(passed=False, status="error", exception="NameError", message="name 'x' is not defined")
    groups[0].rollouts[0].verifier_detail = detail
    hinted.interventions[1].case.hint_cache[2] = "Add first."
    groups[2].rollouts[0] = Rollout(
        ladder_problem("p2"), 2, [1, 2], [3], [-0.25], "x", "length", 3, reward=1, correct=True,
        hint=Hint("h", 2, {"failure_type": "arithmetic"}, "worked_solutions"), behaviour_prompt_ids=[1, 2, 9],
        weighting=TokenWeighting("shaping", 0.1), extra_terms=(ExtraTerm("distill", 0.5, (1, 2)),))
    return hinted


def test_a_hinted_step_is_plain_data_that_rebuilds_after_a_json_round_trip():
    hinted = hinted_step()
    state = hinted.state()
    assert is_plain(state)
    back = HintedStep.from_state(json_round_trip(state))
    assert back == hinted
    assert back.state() == state
    # the types come back, not look-alikes (a StrEnum equals its string; a dict has no attributes)
    iv = back.interventions[1]
    assert type(iv.case) is FailureCase and type(iv.case.kind) is TaskKind and type(iv.diagnosis) is Diagnosis
    assert iv.case.hint_cache == {2: "Add first."}
    assert type(back.groups[0].rollouts[0].verifier_detail) is CodeResult
    assert back.groups[2].rollouts[0].extra_terms == (ExtraTerm("distill", 0.5, (1, 2)),)
    assert type(back.groups[2].rollouts[0].reward) is int  # as written
    # one record per group: the plan and the interventions point at the step's groups
    assert all(iv.group is back.groups[iv.group.group_id] for iv in back.interventions)
    assert sorted(id(g) for g, _ in back.plan.selected) == sorted(map(id, back.groups[:2]))


def test_a_code_problem_and_its_columns_round_trip():
    code = CodeTask(tests="assert f() == 1", entry_point="f", solution="def f():\n    return 1",
                    step_markers=(r"def f",))
    p = Problem("c1", "Write f.", "", ("return 1",), columns={"split": "train", "n": 3}, code=code)
    g = Group(4, p, [5, 6], [Rollout(p, 4, [5, 6], [7], [-1.0], "def f(): pass", "stop", 0)])
    back = from_plain(Group, json_round_trip(to_plain(g)))
    assert back == g and back.problem.columns == {"split": "train", "n": 3} and back.problem.code == code


def test_what_has_no_plain_form_is_an_error_naming_it():
    class Opaque:
        pass

    p = Problem("c1", "q", "1", columns={"blob": Opaque()})
    with pytest.raises(TypeError, match="Opaque is not plain data"):
        to_plain(p)
