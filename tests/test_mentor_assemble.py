"""Batch assembly after MENTOR: replace, group and transfer modes, and the invariants that guard them."""

import dataclasses

import pytest

from mentor_fast.algo import assemble
from mentor_fast.algo.assemble import LossMode, assemble_groups, check_assembly
from mentor_fast.mentor.testing import CharPromptBuilder, ladder_problem, make_group
from mentor_fast.types import Hint, Rollout

WRONG, RIGHT = "so \\boxed{1}", "so \\boxed{303}"


def reroll(group, text, level, correct):
    hinted = CharPromptBuilder().encode(group.problem, f"hint at level {level}")
    return Rollout(
        group.problem,
        group.group_id,
        hinted,
        [1, 2],
        [-0.1, -0.2],
        text,
        "stop",
        1,
        reward=float(correct),
        correct=correct,
        origin="mentor",
        hint=Hint(f"hint at level {level}", level),
    )


@pytest.fixture
def batch():
    fail = make_group(ladder_problem("a"), [WRONG] * 4, group_id=10)
    mixed = make_group(ladder_problem("b"), [WRONG, RIGHT, WRONG, WRONG], group_id=11)
    return fail, mixed


def test_replace_inserts_lowest_level_successes_and_keeps_ids_and_sizes(batch):
    fail, mixed = batch
    rs = [
        reroll(fail, WRONG, 1, False),
        reroll(fail, RIGHT, 2, True),
        reroll(fail, RIGHT, 1, True),
        reroll(fail, RIGHT, 3, True),
    ]
    out = assemble_groups([fail, mixed], {10: rs}, "replace", max_replace=2, seed=0)
    new = out[0]
    assert out[1] is mixed  # untouched group: same object
    assert new.group_id == 10 and len(new.rollouts) == 4 and new.num_correct == 2
    inserted = [r for r in new.rollouts if r.origin == "mentor"]
    assert sorted(r.hint.level for r in inserted) == [1, 2]  # minimal help first: levels 1 and 2, not 3
    assert all(
        r.prompt_ids != fail.prompt_ids and r.prompt_ids[: len(fail.prompt_ids)] == fail.prompt_ids
        for r in inserted
    )  # own context q + h, which starts with q
    assert fail.num_correct == 0  # the input group is not mutated
    one = assemble_groups([fail], {10: rs}, LossMode.REPLACE, max_replace=1)[0]
    assert one.num_correct == 1 and [r.hint.level for r in one.rollouts if r.origin == "mentor"] == [1]


def test_replace_is_deterministic_per_seed(batch):
    fail, _ = batch
    rs = [reroll(fail, RIGHT, 1, True)]
    positions = {
        seed: [r.origin for r in assemble_groups([fail], {10: rs}, seed=seed)[0].rollouts].index("mentor")
        for seed in range(8)
    }
    assert positions == {
        seed: [r.origin for r in assemble_groups([fail], {10: rs}, seed=seed)[0].rollouts].index("mentor")
        for seed in range(8)
    }
    assert len(set(positions.values())) > 1  # the replaced failure is chosen at random


@pytest.mark.parametrize("mode", ["transfer", "shaping"])  # same placement; the update weighs them apart
def test_transfer_trains_the_success_under_the_original_prompt(batch, mode):
    fail, mixed = batch
    rs = [reroll(fail, WRONG, 1, False), reroll(fail, RIGHT, 2, True)]
    replaced = assemble_groups([fail, mixed], {10: rs}, "replace", seed=3)[0]
    out = assemble_groups([fail, mixed], {10: rs}, mode, seed=3)
    assert out[1] is mixed and out[0].group_id == 10 and out[0].num_correct == 1
    (moved,) = [r for r in out[0].rollouts if r.origin == "mentor"]
    assert moved.prompt_ids == fail.prompt_ids  # trained under q ...
    assert moved.behaviour_prompt_ids == rs[1].prompt_ids  # ... sampled under q + h, as recorded
    assert moved.sampler_logprobs == rs[1].sampler_logprobs and moved.completion_ids == rs[1].completion_ids
    assert [r.origin for r in out[0].rollouts] == [r.origin for r in replaced.rollouts]  # same slot
    assert rs[1].behaviour_prompt_ids is None and rs[1].prompt_ids != fail.prompt_ids  # input untouched


def test_group_mode_swaps_in_the_hinted_group(batch):
    fail, mixed = batch
    rs = [
        reroll(fail, RIGHT, 2, True),
        reroll(fail, WRONG, 2, False),
        reroll(fail, WRONG, 2, False),
        reroll(fail, RIGHT, 2, True),
    ]
    out = assemble_groups([fail, mixed], {10: rs}, "group")
    assert out[0].rollouts == rs and out[0].group_id == 10 and out[0].num_correct == 2 and out[1] is mixed
    with pytest.raises(ValueError, match="exactly G=4"):
        assemble_groups([fail], {10: rs[:3]}, "group")
    mixed_ctx = [*rs[:3], reroll(fail, RIGHT, 3, True)]
    with pytest.raises(ValueError, match="one context"):
        assemble_groups([fail], {10: mixed_ctx}, "group")


def test_input_errors(batch):
    fail, mixed = batch
    with pytest.raises(ValueError, match="not in the batch"):
        assemble_groups([fail], {99: []}, "replace")
    with pytest.raises(ValueError):
        assemble_groups([fail], {}, "no-such-mode")
    wrong_id = dataclasses.replace(reroll(fail, RIGHT, 1, True), group_id=11)
    with pytest.raises(ValueError, match="another group id"):
        assemble_groups([fail, mixed], {10: [wrong_id]}, "replace")


def test_rerolls_into_a_group_with_a_correct_rollout_is_a_violation(batch):
    _, mixed = batch
    with pytest.raises(AssertionError, match="already had a correct rollout"):
        assemble_groups([mixed], {11: [reroll(mixed, RIGHT, 1, True)]}, "replace")


def test_broken_assembler_is_detected(batch, monkeypatch):
    fail, _ = batch

    def drops_one(group, rerolls, max_replace, rng):  # a buggy mode: loses a rollout
        new = dataclasses.replace(group, rollouts=group.rollouts[:-1])
        return new, []

    def double_counts(group, rerolls, max_replace, rng):  # inserts 2 successes, reports 1
        ok = [r for r in rerolls if r.correct]
        return dataclasses.replace(group, rollouts=ok[:2] + group.rollouts[2:]), ok[:1]

    rs = [reroll(fail, RIGHT, 1, True), reroll(fail, RIGHT, 1, True)]
    monkeypatch.setitem(assemble.ASSEMBLERS, LossMode.REPLACE, drops_one)
    with pytest.raises(AssertionError, match="size changed 4 -> 3"):
        assemble_groups([fail], {10: rs}, "replace")
    monkeypatch.setitem(assemble.ASSEMBLERS, LossMode.REPLACE, double_counts)
    with pytest.raises(AssertionError, match="2 correct after assembly, 1 successes inserted"):
        assemble_groups([fail], {10: rs}, "replace")


def test_check_assembly_catches_a_changed_untouched_group(batch):
    fail, mixed = batch
    tampered = dataclasses.replace(mixed, rollouts=[mixed.rollouts[1]] * 4)
    with pytest.raises(AssertionError, match="had no re-rolls but its rollouts changed"):
        check_assembly([fail, mixed], [fail, tampered], {})
    renamed = dataclasses.replace(fail, group_id=12)
    with pytest.raises(AssertionError, match="group id changed"):
        check_assembly([fail], [renamed], {})
