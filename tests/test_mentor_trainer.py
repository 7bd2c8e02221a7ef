"""MENTOR inside the real training loop on the tiny model, sync and async."""

from __future__ import annotations

import json

import pytest

from mentor_fast.config import ConfigError, load_config
from mentor_fast.mentor import leaks_answer
from mentor_fast.metrics import read_metrics
from mentor_fast.trainer import Trainer

MENTOR_KEYS = [
    "groups/all_fail_frac", "groups/all_fail_frac_after_mentor", "mentor/triggered", "mentor/rescued",
    "mentor/latency_s", "mentor/leak_rejects", "mentor/level_1", "mentor/graduations",
]


@pytest.mark.parametrize("async_", [False, True], ids=["sync", "async"])
def test_tiny_run_with_mentor_logs_its_metrics(tmp_path, async_):
    cfg = load_config(["configs/tiny_test.yaml"], [
        f"output_dir={tmp_path}", "mentor.enable=true", f"mentor.async={str(async_).lower()}",
        "mentor.rerolls=2", "trainer.max_steps=3", "trainer.tensorboard=false",
    ])
    Trainer(cfg).fit()
    rows = read_metrics(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3]
    # sync: every step reports its own interventions; async: step t reports step t-1's
    reporting = rows if not async_ else rows[1:]
    for row in reporting:
        for key in MENTOR_KEYS:
            assert key in row, (key, row)
        # the random tiny model fails everything, so the mentor takes every group (budget: all)
        assert row["groups/all_fail_frac"] == 1.0
        assert row["mentor/triggered"] >= 1
        assert row["mentor/rerolls"] >= 2
    if async_:
        assert "mentor/overlap_frac" in rows[1] and "off_policy/max_lag" in rows[1]
    dumps = [json.loads(line) for line in (tmp_path / "mentor.jsonl").read_text().splitlines()]
    assert dumps and all(d["hint"] for d in dumps if d["no_hint_reason"] is None)
    for d in dumps:  # the guard never lets the gold through in a hint the learner saw
        for h in d["hints"]:
            assert not leaks_answer(h["text"], d["gold"])


def test_merged_first_round_changes_nothing_but_the_call_count(tmp_path):
    """mentor.merge_rerolls: the first re-roll round rides in the next step's initial generate call;
    the re-rolls, rewards, assembly and update are what separate calls give."""
    over = ["mentor.enable=true", "mentor.async=true", "mentor.rerolls=2", "mentor.max_rounds=2",
            "trainer.max_steps=3", "trainer.tensorboard=false"]
    runs = {}
    for merge in ("true", "false"):
        out = tmp_path / merge
        Trainer(load_config(["configs/tiny_test.yaml"], [f"output_dir={out}", f"mentor.merge_rerolls={merge}",
                                                         *over])).fit()
        runs[merge] = ([json.loads(x) for x in (out / "mentor.jsonl").read_text().splitlines()],
                       read_metrics(out / "metrics.jsonl"))
    (dumps_on, rows_on), (dumps_off, rows_off) = runs["true"], runs["false"]
    assert rows_on[1]["mentor/merged_rerolls"] == 2 * rows_on[1]["mentor/triggered"]
    assert "mentor/merged_rerolls" not in rows_off[1]
    assert [d["rerolls"] for d in dumps_on] == [d["rerolls"] for d in dumps_off]
    assert [len(d["hints"]) for d in dumps_on] == [2] * len(dumps_on)  # round 1 still ran, separately
    for on, off in zip(rows_on, rows_off):
        assert on["loss"] == pytest.approx(off["loss"], abs=1e-5)


def test_resume_keeps_the_mentor_queue(tmp_path):
    over = ["mentor.enable=true", "mentor.async=true", "mentor.rerolls=2", "trainer.tensorboard=false"]
    Trainer(load_config(["configs/tiny_test.yaml"], [f"output_dir={tmp_path}", "trainer.max_steps=1", *over])).fit()
    Trainer(load_config(["configs/tiny_test.yaml"], [f"output_dir={tmp_path}", "trainer.max_steps=2", *over]),
            resume="auto").fit()
    rows = read_metrics(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2]
    assert rows[1]["mentor/triggered"] >= 1  # step 1's interventions were carried across the restart


def test_reroll_horizon_is_checked():
    for over, msg in [(["mentor.reroll_horizon=0.5"], "0 \\(off\\) or >= 1"),
                      (["mentor.reroll_horizon=1", "rollout.engine=vllm"], "needs rollout.engine=hf"),
                      (["mentor.reroll_horizon=1", "mentor.loss_mode=group"], "loss_mode=group")]:
        with pytest.raises(ConfigError, match=f"mentor.reroll_horizon.*{msg}"):
            load_config(["configs/tiny_test.yaml"], over)


def test_shared_reroll_budget_skips_the_last_prompts_of_the_step(tmp_path):
    """mentor.reroll_budget=shared: the merged re-rolls take the rows of the step's last prompts, so
    the call decodes at most prompts_per_step x num_generations rows (unless one prompt must stay),
    and the prompts kept are the ones vanilla GRPO would get first."""
    prompts, g = 3, 4
    cfg = load_config(["configs/tiny_test.yaml"], [
        f"output_dir={tmp_path}", "mentor.enable=true", "mentor.async=true", "mentor.rerolls=2",
        "mentor.max_rounds=1", "mentor.max_groups_frac=1", "mentor.reroll_budget=shared",
        f"rollout.prompts_per_step={prompts}", f"rollout.num_generations={g}", "trainer.max_steps=4",
        "trainer.tensorboard=false",
    ])
    trainer = Trainer(cfg)
    seen: dict[int, list[str]] = {}
    rollout = trainer.rollout

    def spy(problems, step, metrics, extra=()):
        seen[step] = [p.id for p in problems]
        return rollout(problems, step, metrics, extra)

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
    with pytest.raises(ConfigError, match="reroll_budget=shared needs mentor.async=true"):
        load_config(["configs/tiny_test.yaml"], ["mentor.reroll_budget=shared", "mentor.async=false"])


def test_reroll_horizon_cuts_merged_rerolls_in_training(tmp_path):
    """On a tiny model biased toward EOS (rows end at different steps; fault injection of lengths),
    mentor.reroll_horizon=1 keeps every merged re-roll within the initial rollouts' longest length:
    longer ones are cut, counted, and never reach the dump as re-rolls."""
    from test_hf_engine import eos_bias_hook  # tests/ is on sys.path (pytest rootdir-relative imports)

    cfg = load_config(["configs/tiny_test.yaml"], [
        f"output_dir={tmp_path}", "mentor.enable=true", "mentor.async=true", "mentor.rerolls=4",
        "mentor.max_rounds=1", "mentor.reroll_horizon=1", "trainer.max_steps=4", "trainer.tensorboard=false",
        "rollout.temperature=0.7",
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
