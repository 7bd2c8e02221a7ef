"""Dynamic sampling (rollout.dynamic_sampling), the soft overlong penalty (reward.overlong_cache) and
the mismatch modes (loss.is_mode) in tiny runs; the 2-rank equality is in test_distributed.py."""

from __future__ import annotations

import pytest
from helpers import make_groups

from mentor_fast.config import load_config
from mentor_fast.data import JsonlSource, build_source
from mentor_fast.metrics import read_metrics
from mentor_fast.rewards.registry import RewardScorer, overlong_penalty
from mentor_fast.trainer import Trainer

TINY = "configs/tiny_test.yaml"
P = 4  # prompts_per_step

# Round 0 of each step: the prompts at even places get a flat reward (no signal), the others a
# shaped one; every prompt of a later round gets a shaped one. A ladder prompt's id ends in its
# index in the stream, with ".k" in dynamic sampling's round k.
REWARDS = """
def flat_at_even_places_of_round_0(completions, problem_id, **columns):
    out = []
    for c, pid in zip(completions, problem_id):
        index, _, rnd = pid.rsplit("-", 1)[1].partition(".")
        flat = not rnd and int(index) % 2 == 0
        out.append(0.5 if flat else -len(c[0]["content"]) / 100.0)
    return out
"""


def _cfg(tmp_path, monkeypatch, *overrides):
    (tmp_path / "ds_rewards.py").write_text(REWARDS)
    monkeypatch.syspath_prepend(str(tmp_path))
    return load_config([TINY], [f"output_dir={tmp_path / 'run'}", f"rollout.prompts_per_step={P}",
                                'reward.functions=["ds_rewards:flat_at_even_places_of_round_0"]', *overrides])


def _trained_groups(trainer: Trainer) -> list[list[int]]:
    """Records, per update, the group ids of the batch the updater gets."""
    seen, update = [], trainer.updater.update

    def record(batch, version):
        seen.append(sorted({r.group_id for r in batch.rollouts}))
        return update(batch, version)

    trainer.updater.update = record
    return seen


def test_overlong_penalty_is_dapos_and_trls():
    trl_rewards = pytest.importorskip("trl.rewards")
    trl = trl_rewards.get_soft_overlong_punishment(max_completion_len=16, soft_punish_cache=6)
    lengths = list(range(20))
    ours = [overlong_penalty(n, 16, 6) for n in lengths]
    assert ours == pytest.approx(trl([[1] * n for n in lengths]))
    assert ours[10] == 0.0 and ours[13] == pytest.approx(-0.5) and ours[16] == -1.0  # ramp from 10 to 16


def test_scorer_adds_the_overlong_penalty_to_the_reward_and_logs_its_mean():
    cfg = load_config([TINY], ["reward.overlong_cache=4"]).reward
    groups = make_groups([[0, 0, 0]], hinted=False)
    rollouts = groups[0].rollouts
    for r, n in zip(rollouts, (2, 14, 16)):  # max_new_tokens 16: no penalty, half, all
        r.completion_ids = list(range(3, 3 + n))
        r.text = "no answer"
    with RewardScorer(cfg, max_new_tokens=16) as scorer:
        metrics = scorer.score(rollouts)
    assert [r.reward for r in rollouts] == [0.0, -0.5, -1.0]
    assert metrics["reward/overlong_penalty/mean"] == pytest.approx(-0.5)
    assert not any(r.correct for r in rollouts)  # correctness is the verifier's alone
    with pytest.raises(ValueError, match="overlong_cache"):
        RewardScorer(cfg, max_new_tokens=3)


def test_sources_draw_each_round_from_a_stream_of_its_own(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(f'{{"question": "q{i}", "answer": "{i}"}}\n' for i in range(10)))
    cfg = load_config([TINY], [f"data.path={path}", "data.source=jsonl", "data.format=plain"]).data
    ladder_cfg = load_config([TINY], []).data
    for make in (lambda: JsonlSource(cfg, seed=3), lambda: build_source(ladder_cfg, seed=3)):
        a, b = make(), make()
        first = [p.question for p in a.batch(5, 4)]
        extra = [p.question for p in a.batch(5, 4, round=1)]
        assert extra == [p.question for p in b.batch(5, 4, round=1)]  # a pure function: resume draws the same
        assert first == [p.question for p in b.batch(5, 4, round=0)]
        assert extra != first and extra != [p.question for p in a.batch(5, 4, round=2)]
    # a round's stream, like the first, visits every row once per epoch
    src = JsonlSource(cfg, seed=3)
    assert sorted(p.question for s in range(5) for p in src.batch(s, 2, round=1)) == sorted(f"q{i}" for i in range(10))


def test_dropped_groups_never_reach_the_update_and_a_second_round_fills_the_batch(tmp_path, monkeypatch):
    trainer = Trainer(_cfg(tmp_path, monkeypatch, "rollout.dynamic_sampling=true", "trainer.max_steps=1"))
    trained = _trained_groups(trainer)
    out = trainer.fit()
    rows = read_metrics(out / "metrics.jsonl")
    for step, (row, ids) in enumerate(zip(rows, trained), start=1):
        # round 0 keeps its odd places (1, 3); round 1 (ids step * 100000 + 4 + i) fills the other two
        # with its first two prompts; the round's other two are cut
        assert ids == [step * 100_000 + i for i in (1, 3, 4, 5)], ids
        assert row["dynamic_sampling/rounds"] == 1 and row["dynamic_sampling/prompts_drawn"] == 2 * P
        assert row["dynamic_sampling/groups_kept"] == P and row["dynamic_sampling/short"] == 0
        assert row["dynamic_sampling/discarded_frac"] == pytest.approx(0.5)
        assert row["batch/sequences"] == P * 4  # num_generations 4
        assert row["groups/count"] == P  # the initial groups' metrics stay round 0's


def test_a_level_nobody_solves_runs_every_round_logs_it_and_does_not_crash(tmp_path, capsys):
    # level 7 from the random tiny model and the bare verifier: every group fails, every round
    cfg = load_config([TINY], [f"output_dir={tmp_path / 'run'}", "data.levels=[7]", "trainer.max_steps=2",
                               "rollout.dynamic_sampling=true", "rollout.dynamic_sampling_rounds=2"])
    trainer = Trainer(cfg)
    trained = _trained_groups(trainer)
    rows = read_metrics(trainer.fit() / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2] and trained == []  # nothing with a signal: no update
    for row in rows:
        assert row["dynamic_sampling/rounds"] == 2 and row["dynamic_sampling/prompts_drawn"] == 3 * 2
        assert row["dynamic_sampling/short"] == 2 and row["dynamic_sampling/discarded_frac"] == 1.0
        assert row["trainer/skipped_step"] == 1.0
    assert capsys.readouterr().out.count("dynamic sampling kept 0 of 2 groups") == 1  # said once


@pytest.mark.parametrize("mode", ["token_truncate", "token_mask", "sequence_truncate", "sequence_mask"])
def test_a_tiny_run_with_each_mismatch_mode_and_the_overlong_penalty(tmp_path, monkeypatch, mode):
    # two mini-batches: pi_old is recomputed, so the correction has a ratio to act on
    row = read_metrics(Trainer(_cfg(
        tmp_path, monkeypatch, "trainer.max_steps=1", "trainer.mini_batches=2", f"loss.is_mode={mode}",
        "loss.is_floor=0.5", "reward.overlong_cache=8")).fit() / "metrics.jsonl")[0]
    assert 0.0 < row["is/weight_mean"] <= 2.0 and 0.0 <= row["is/masked_frac"] <= 1.0
    assert row["reward/overlong_penalty/mean"] < 0  # the random model rambles to the limit
    assert row["grad_norm"] > 0


def test_a_tiny_run_with_truncated_completions_masked(tmp_path, monkeypatch):
    row = read_metrics(Trainer(_cfg(tmp_path, monkeypatch, "trainer.max_steps=1", "rollout.max_new_tokens=24",
                                    "loss.mask_truncated=true")).fit() / "metrics.jsonl")[0]
    # without a method, the sequences masked are the initial rollouts cut at the limit
    assert row["update/masked_truncated_frac"] == pytest.approx(row["response_length/clip_frac"])
    assert row["update/masked_truncated_frac"] > 0


def test_dynamic_sampling_with_the_mentor_in_step(tmp_path, monkeypatch):
    # the mentor first (in_step: its re-rolls join the step's groups), then the filter on what is left
    rows = read_metrics(Trainer(_cfg(
        tmp_path, monkeypatch, "trainer.max_steps=2", "rollout.dynamic_sampling=true", "mentor.enable=true",
        "mentor.reroll.schedule=in_step")).fit() / "metrics.jsonl")
    for row in rows:
        assert row["dynamic_sampling/groups_kept"] == P
        assert "mentor/triggered" in row
