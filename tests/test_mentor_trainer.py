"""MENTOR inside the real training loop on the tiny model, sync and async."""

from __future__ import annotations

import json

import pytest

from mentor_fast.config import load_config
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


def test_resume_keeps_the_mentor_queue(tmp_path):
    over = ["mentor.enable=true", "mentor.async=true", "mentor.rerolls=2", "trainer.tensorboard=false"]
    Trainer(load_config(["configs/tiny_test.yaml"], [f"output_dir={tmp_path}", "trainer.max_steps=1", *over])).fit()
    Trainer(load_config(["configs/tiny_test.yaml"], [f"output_dir={tmp_path}", "trainer.max_steps=2", *over]),
            resume="auto").fit()
    rows = read_metrics(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2]
    assert rows[1]["mentor/triggered"] >= 1  # step 1's interventions were carried across the restart
