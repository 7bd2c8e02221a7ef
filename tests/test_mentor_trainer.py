"""MENTOR inside the real training loop on the tiny model, sync and async."""

from __future__ import annotations

import json

import pytest
import torch
from helpers import comparable

from mentor_fast.checkpoint import latest_checkpoint
from mentor_fast.config import ConfigError, load_config
from mentor_fast.mentor import leaks_answer
from mentor_fast.metrics import read_metrics
from mentor_fast.recovery.plain import is_plain
from mentor_fast.trainer import Trainer

MENTOR_KEYS = [
    "groups/all_fail_frac", "groups/all_fail_frac_after_mentor", "mentor/triggered", "mentor/rescued",
    "mentor/latency_s", "mentor/leak_rejects", "mentor/level_1", "mentor/graduations",
]


@pytest.mark.parametrize("schedule", ["in_step", "next_step_extra_rows"])
def test_tiny_run_with_mentor_logs_its_metrics(tmp_path, schedule):
    deferred = schedule != "in_step"
    cfg = load_config(["configs/tiny_test.yaml"], [
        f"output_dir={tmp_path}", "mentor.enable=true", f"mentor.reroll.schedule={schedule}",
        "mentor.reroll.count=2", "trainer.max_steps=3", "trainer.tensorboard=false",
    ])
    Trainer(cfg).fit()
    rows = read_metrics(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3]
    # in_step: every step reports its own interventions; next_step: step t reports step t-1's
    reporting = rows if not deferred else rows[1:]
    for row in reporting:
        for key in MENTOR_KEYS:
            assert key in row, (key, row)
        # the random tiny model fails everything, so the mentor takes every group (budget: all)
        assert row["groups/all_fail_frac"] == 1.0
        assert row["mentor/triggered"] >= 1
        assert row["mentor/rerolls"] >= 2
    if deferred:  # step t's first re-roll round rode in step t+1's generate call
        assert "mentor/overlap_frac" in rows[1] and "off_policy/max_lag" in rows[1]
        assert rows[1]["mentor/merged_rerolls"] == 2 * rows[1]["mentor/triggered"]
        assert "mentor/merged_rerolls" not in rows[0]
    dumps = [json.loads(line) for line in (tmp_path / "mentor.jsonl").read_text().splitlines()]
    assert dumps and all(d["hint"] for d in dumps if d["no_hint_reason"] is None)
    for d in dumps:  # the guard never lets the gold through in a hint the learner saw
        for h in d["hints"]:
            assert not leaks_answer(h["text"], d["gold"])


def test_resume_with_the_mentor_logs_what_the_uninterrupted_run_logs(tmp_path):
    """Deferred MENTOR across a restart: the hints in flight, their step's plan (all-fail fraction,
    collapse and surge flags: without it the first resumed step would log them as 0) and the
    backend's counts are in the checkpoint, so every resumed row equals the uninterrupted run's,
    timings aside."""
    over = ["mentor.enable=true", "mentor.reroll.schedule=next_step_extra_rows", "mentor.reroll.count=2",
            "trainer.tensorboard=false"]
    full, part = tmp_path / "full", tmp_path / "part"
    Trainer(load_config(["configs/tiny_test.yaml"], [f"output_dir={full}", "trainer.max_steps=4", *over])).fit()
    Trainer(load_config(["configs/tiny_test.yaml"], [f"output_dir={part}", "trainer.max_steps=2", *over])).fit()
    # the method's state is plain data: it resumes the same after a JSON round trip
    [rank_file] = (latest_checkpoint(part / "checkpoints") / "ranks").glob("rank_*.pt")
    saved = torch.load(rank_file, weights_only=False)
    assert is_plain(saved["method"]) and saved["method"]["pending"]["interventions"]
    torch.save({**saved, "method": json.loads(json.dumps(saved["method"]))}, rank_file)
    Trainer(load_config(["configs/tiny_test.yaml"], [f"output_dir={part}", "trainer.max_steps=4", *over]),
            resume="auto").fit()
    a, b = read_metrics(full / "metrics.jsonl"), read_metrics(part / "metrics.jsonl")
    assert [r["step"] for r in b] == [1, 2, 3, 4]
    for x, y in zip(a, b):
        assert comparable(y) == pytest.approx(comparable(x), rel=1e-6, abs=1e-9), x["step"]
    assert b[2]["mentor/triggered"] >= 1 and b[2]["mentor/all_fail_frac"] == 1.0  # step 2's hints, carried
    assert b[2]["mentor/collapse_event"] == a[2]["mentor/collapse_event"] == 1.0


def test_reroll_horizon_applies_only_to_rows_riding_in_the_next_steps_call_on_hf():
    riding = "recovery.reroll.horizon cuts the re-rolls riding in the next step's generate call"
    for over, msg in [(["mentor.reroll.horizon=0.5"], "mentor.reroll.horizon: 0.5 is out of range: it must be 0 or >= 1"),
                      (["rollout.engine=vllm"], riding),
                      (["mentor.reroll.schedule=in_step"], riding),
                      (["mentor.reroll.schedule=during_update", "rollout.engine=vllm",
                        "rollout.vllm_sleep_level=0"], riding),
                      (["mentor.loss.mode=group"], riding)]:
        with pytest.raises(ConfigError, match=msg):
            load_config(["configs/tiny_test.yaml"], ["mentor.reroll.horizon=1", *over])
    for schedule in ("next_step_extra_rows", "next_step_shared_rows"):
        cfg = load_config(["configs/tiny_test.yaml"], ["mentor.reroll.horizon=1", f"mentor.reroll.schedule={schedule}"])
        assert cfg.recovery.reroll.horizon == 1


def test_old_mentor_keys_name_the_new_ones():
    """mentor.async, reroll.when and reroll.budget were one choice in three keys: now
    mentor.reroll.schedule; the reference backend is worked_solutions."""
    for old in ("mentor.async=false", "mentor.reroll.when=during_update", "mentor.reroll.budget=shared",
                "mentor.reroll_budget=shared"):
        with pytest.raises(ConfigError, match="was renamed: use recovery.reroll.schedule .*in_step"):
            load_config(["configs/tiny_test.yaml"], [old])
    with pytest.raises(ConfigError, match="reference was renamed worked_solutions"):
        load_config(["configs/tiny_test.yaml"], ["mentor.agents.backend=reference"])
    with pytest.raises(ConfigError, match="schedule=during_update needs rollout.engine=vllm"):
        load_config(["configs/tiny_test.yaml"], ["mentor.reroll.schedule=during_update"])


def test_shared_reroll_budget_skips_the_last_prompts_of_the_step(tmp_path):
    """mentor.reroll.schedule=next_step_shared_rows: the merged re-rolls take the rows of the step's
    last prompts, so the call decodes at most prompts_per_step x num_generations rows (unless one
    prompt must stay), and the prompts kept are the ones vanilla GRPO would get first."""
    prompts, g = 3, 4
    cfg = load_config(["configs/tiny_test.yaml"], [
        f"output_dir={tmp_path}", "mentor.enable=true", "mentor.reroll.schedule=next_step_shared_rows",
        "mentor.reroll.count=2", "mentor.reroll.max_rounds=1", "mentor.trigger.max_groups_frac=1",
        f"rollout.prompts_per_step={prompts}", f"rollout.num_generations={g}", "trainer.max_steps=4",
        "trainer.tensorboard=false",
    ])
    trainer = Trainer(cfg)
    seen: dict[int, list[str]] = {}
    rollout = trainer.rollout

    def spy(plan, step, timer, metrics):
        seen[step] = [p.id for p in plan.problems]
        return rollout(plan, step, timer, metrics)

    trainer.rollout = spy
    trainer.fit()
    rows = read_metrics(tmp_path / "metrics.jsonl")
    assert "mentor/prompts_skipped" not in rows[0]  # nothing pending at step 1
    skipped = 0
    for row in rows[1:]:
        step, merged = row["step"], row["mentor/merged_rerolls"]
        skip = row["mentor/prompts_skipped"]
        assert merged > 0 and skip == min(-(-merged // g), prompts - 1)
        assert row["groups/count"] == prompts - skip
        assert seen[step] == [p.id for p in trainer.source.batch(step, prompts)][: prompts - int(skip)]
        if skip < prompts - 1:
            assert row["groups/count"] * g + merged <= prompts * g
        skipped += skip
    assert skipped > 0


def test_reroll_horizon_cuts_merged_rerolls_in_training(tmp_path):
    """On a tiny model biased toward EOS (rows end at different steps; fault injection of lengths),
    mentor.reroll.horizon=1 keeps every merged re-roll within the initial rollouts' longest length:
    longer ones are cut, counted, and never reach the dump as re-rolls."""
    from helpers import eos_bias_hook

    cfg = load_config(["configs/tiny_test.yaml"], [
        f"output_dir={tmp_path}", "mentor.enable=true", "mentor.reroll.schedule=next_step_extra_rows",
        "mentor.reroll.count=4", "mentor.reroll.max_rounds=1", "mentor.reroll.horizon=1", "trainer.max_steps=4",
        "trainer.tensorboard=false", "rollout.temperature=0.7",
    ])
    trainer = Trainer(cfg)
    trainer.model.lm_head.register_forward_hook(eos_bias_hook)
    trainer.fit()
    rows = read_metrics(tmp_path / "metrics.jsonl")
    dumps = [json.loads(line) for line in (tmp_path / "mentor.jsonl").read_text().splitlines()]
    assert all("mentor/rerolls_cut" in r for r in rows[1:])
    hinted = [d for d in dumps if d["hints"]]
    assert sum(len(d["rerolls"]) + d["rerolls_cut"] for d in hinted) == 4 * len(hinted)
    assert sum(r["mentor/rerolls_cut"] for r in rows[1:]) == sum(d["rerolls_cut"] for d in dumps) > 0


def test_mentor_declares_how_its_metrics_reduce_over_ranks_and_which_are_timings():
    from helpers import TwoRanks

    from mentor_fast.mentor.method import MentorMethod
    from mentor_fast.metrics import reduce_metrics
    from mentor_fast.trainer import TIMING_PREFIXES

    a = {"mentor/triggered": 2.0, "mentor/latency_s": 1.0, "mentor/overlap_frac": 0.9, "mentor/all_fail_frac": 0.75,
         "groups/all_fail_frac_after_mentor": 0.5, "mentor/assembled_groups": 2.0, "reward/mean": 0.2}
    b = {"mentor/triggered": 1.0, "mentor/latency_s": 3.0, "mentor/overlap_frac": 0.4, "mentor/all_fail_frac": 0.75,
         "groups/all_fail_frac_after_mentor": 0.0, "mentor/assembled_groups": 6.0, "reward/mean": 0.4}
    out = reduce_metrics(TwoRanks(b), a, MentorMethod.metrics)
    assert out == pytest.approx({
        "mentor/triggered": 3.0, "mentor/latency_s": 3.0, "mentor/overlap_frac": 0.4, "mentor/all_fail_frac": 0.75,
        "groups/all_fail_frac_after_mentor": 0.125, "mentor/assembled_groups": 8.0, "reward/mean": 0.3})
    # undeclared, they would reduce by their names: latencies and the after-assembly fraction summed
    # as counts, the plan's shared fraction averaged
    plain = reduce_metrics(TwoRanks(b), a)
    assert plain["mentor/latency_s"] == 4.0 and plain["groups/all_fail_frac_after_mentor"] == 0.5
    assert {"mentor/latency_s", "mentor/reroll_s", "mentor/overlap_frac"} <= set(TIMING_PREFIXES)
