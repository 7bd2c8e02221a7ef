"""examples/trl_gsm8k.py, the TRL script ported by its imports: real GSM8K rows as a
datasets.Dataset with conversational prompts, TRL's accuracy_reward and a reward reading an extra
column, two steps with MENTOR on (the toy model fails every group, so MENTOR takes them)."""

from __future__ import annotations

import pytest
from conftest import REPO


def test_trl_gsm8k_example_runs_two_steps_with_mentor(tmp_path, shared_data, monkeypatch):
    pytest.importorskip("datasets")
    pytest.importorskip("trl")
    monkeypatch.syspath_prepend(str(REPO / "examples"))
    import trl_gsm8k

    result = trl_gsm8k.main(["--data", str(shared_data / "gsm8k" / "test.jsonl"), "--model", "tiny-llama",
                             "--output-dir", str(tmp_path), "--max-steps", "2", "--max-completion-length", "8"])
    assert result.global_step == 2
    metrics = result.metrics
    assert "reward/accuracy_reward/mean" in metrics and metrics["reward/within_budget/mean"] > 0  # the column arrived
    assert not any(k.startswith("reward/errors/") for k in metrics)
    assert metrics["mentor/triggered"] > 0 and metrics["mentor/rerolls"] > 0
