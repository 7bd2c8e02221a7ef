"""The Python API in TRL's shape: GRPOConfig's TRL fields map onto ours, unsupported ones are refused
by name, a GRPOConfig and a YAML file with the same settings run the same, train() says where the
run is, and a resumed run goes on from its checkpoint."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from helpers import comparable

from mentor_fast import GRPOConfig, GRPOTrainer
from mentor_fast.api.docs import table_markdown
from mentor_fast.api.trainer import reward_specs
from mentor_fast.config import ConfigError, load_config, to_dict
from mentor_fast.metrics import read_metrics
from mentor_fast.rewards import load_reward_function
from mentor_fast.trainer import Trainer

REPO = Path(__file__).resolve().parents[1]

REWARDS = '''
def shorter(completions, **columns):
    return [-len(c[0]["content"]) / 100.0 for c in completions]


def gold_in_column(completions, reward_model, data_source, solution, **columns):
    return [float(rm["ground_truth"] == s and d == "ladder") for rm, d, s in zip(reward_model, data_source, solution)]
'''

ROWS = [{"prompt": [{"role": "system", "content": "Reply with a number."},
                    {"role": "user", "content": f"What is {a} + {b}?"}],
         "data_source": "ladder", "reward_model": {"style": "rule", "ground_truth": str(a + b)}}
        for a, b in [(1, 2), (3, 4), (5, 6), (7, 1), (2, 9)]]


def test_trl_fields_map_onto_ours():
    cfg = GRPOConfig(output_dir="runs/x", learning_rate=2e-6, lr_scheduler_type="cosine", num_generations=4,
                     per_device_train_batch_size=8, gradient_accumulation_steps=2, steps_per_generation=4,
                     max_completion_length=64, epsilon=0.1, beta=0.04, loss_type="dr_grpo", scale_rewards="none",
                     importance_sampling_level="sequence", mask_truncated_completions=True, report_to=["wandb"],
                     bf16=True, use_vllm=True, vllm_mode="server", vllm_server_port=8011, top_k=0).run_config()
    assert cfg.optim.lr == 2e-6 and cfg.optim.schedule == "cosine"
    assert cfg.rollout.prompts_per_step == 8 and cfg.trainer.mini_batches == 2  # 8 x 4 completions / G=4; 4/2
    assert (cfg.loss.eps_low, cfg.loss.eps_high) == (0.1, 0.1)  # TRL: epsilon_high defaults to epsilon
    assert cfg.loss.beta == 0.04 and cfg.model.ref_model
    assert (cfg.loss.type, cfg.loss.aggregation, cfg.advantage.estimator) == ("gspo", "constant", "dr_grpo")
    assert cfg.loss.mask_truncated and cfg.model.autocast_bf16
    assert (cfg.trainer.wandb, cfg.trainer.tensorboard) == (True, False)
    assert (cfg.rollout.engine, cfg.rollout.vllm_mode, cfg.rollout.vllm_server_url) == (
        "vllm", "server", "http://127.0.0.1:8011")


def test_our_settings_are_reachable_and_unsupported_fields_are_refused_by_name():
    cfg = GRPOConfig(mentor=True, **{"mentor.trigger.max_groups_frac": 0.25},
                     data={"max_prompt_tokens": 300}).run_config()
    assert cfg.mentor.enable and cfg.recovery.trigger.max_groups_frac == 0.25 and cfg.data.max_prompt_tokens == 300
    # the budget's own section, and the old spelling through the Python API's sections, give the same config
    assert GRPOConfig(mentor=True, recovery={"trigger": {"max_groups_frac": 0.25}},
                      data={"max_prompt_tokens": 300}).run_config() == cfg
    assert GRPOConfig(mentor={"enable": True, "trigger": {"max_groups_frac": 0.25}},
                      data={"max_prompt_tokens": 300}).run_config() == cfg
    with pytest.raises(ConfigError, match="'use_liger_kernel' is not supported"):
        GRPOConfig(use_liger_kernel=True)
    with pytest.raises(ConfigError, match="'warmup_ratio' is not supported.*did you mean 'warmup_steps'"):
        GRPOConfig(warmup_ratio=0.1)
    with pytest.raises(ConfigError, match="loss_type='vespo' is not supported"):
        GRPOConfig(loss_type="vespo").run_config()
    with pytest.raises(ConfigError, match="optim.lr is 0.001, but a TRL field sets it to 1e-05"):
        GRPOConfig(learning_rate=1e-5, optim={"lr": 1e-3}).run_config()
    with pytest.raises(ConfigError, match="unknown config key 'mentor.trigger.max_group_frac'"):
        GRPOConfig(**{"mentor.trigger.max_group_frac": 0.5}).run_config()


def test_reward_functions_without_an_importable_name_are_registered():
    offset = 3
    specs = reward_specs([lambda completions, **kw: [offset] * len(completions), load_reward_function])
    assert specs[0].startswith("mentor_fast.api.rewards:") and specs[1] == "mentor_fast.rewards.registry:load_reward_function"
    assert load_reward_function(specs[0])(completions=["a", "b"]) == [3, 3]
    with pytest.raises(ConfigError, match="reward models .* are not supported"):
        reward_specs(["some-org/reward-model"])


def test_docs_hold_the_current_field_table():
    assert table_markdown() in (REPO / "docs" / "python_api.md").read_text(), (
        "docs/python_api.md is stale: paste `python -m mentor_fast.api.docs` into it")


def test_a_grpo_config_and_a_yaml_file_run_the_same_and_train_says_where_the_run_is(tmp_path, monkeypatch):
    datasets = pytest.importorskip("datasets")
    pq = pytest.importorskip("pyarrow.parquet")
    import pyarrow as pa

    (tmp_path / "api_rewards.py").write_text(REWARDS)
    monkeypatch.syspath_prepend(str(tmp_path))
    import api_rewards

    data = tmp_path / "train.parquet"
    pq.write_table(pa.Table.from_pylist(ROWS), data)
    settings = {
        "model": {"path": "tiny-llama"},
        "data": {"source": "file", "path": str(data), "max_prompt_tokens": 256},
        "rollout": {"prompts_per_step": 2, "num_generations": 4, "max_new_tokens": 8},
        "reward": {"functions": ["api_rewards:shorter", "api_rewards:gold_in_column"], "weights": [0.0, 1.0, 1.0]},
        "optim": {"lr": 1e-4},
        "trainer": {"max_steps": 2, "micro_batch_tokens": 512, "progress": False, "tensorboard": False},
    }
    (tmp_path / "run.yaml").write_text(yaml.safe_dump({"output_dir": str(tmp_path / "cli"), **settings}))
    cli_cfg = load_config([tmp_path / "run.yaml"])

    def api_trainer(max_steps: int) -> GRPOTrainer:
        args = GRPOConfig(output_dir=str(tmp_path / "api"), learning_rate=1e-4, num_generations=4,
                          per_device_train_batch_size=8, max_completion_length=8, max_steps=max_steps,
                          report_to="none", trainer={"micro_batch_tokens": 512, "progress": False},
                          **{"data.max_prompt_tokens": 256})
        return GRPOTrainer("tiny-llama", reward_funcs=[api_rewards.shorter, api_rewards.gold_in_column], args=args,
                           train_dataset=datasets.Dataset.from_list(ROWS))

    differs = {"output_dir", "data"}
    assert {k: v for k, v in to_dict(api_trainer(2).cfg).items() if k not in differs} == {
        k: v for k, v in to_dict(cli_cfg).items() if k not in differs}

    Trainer(cli_cfg).fit()
    first = api_trainer(1).train()  # one step, then a resumed run to step 2: the CLI's two steps exactly
    assert first.output_dir == tmp_path / "api" and first.global_step == 1
    assert (tmp_path / "api" / "checkpoints" / "step_000001" / "policy").is_dir()
    result = api_trainer(2).train(resume_from_checkpoint=True)
    assert result.global_step == 2

    def rows(run: str) -> list[dict]:
        return [comparable(r) for r in read_metrics(tmp_path / run / "metrics.jsonl")]

    assert rows("api") == rows("cli") and [r["step"] for r in rows("api")] == [1, 2]
    assert rows("api")[1]["reward/gold_in_column/mean"] == 1.0  # the columns reached the function
    assert rows("api")[0]["grad_norm"] > 0  # the policy moved: step 2 depends on step 1's update
    assert comparable(result.metrics) | {"step": 2} == rows("api")[-1]


def test_a_pretrained_model_object_is_saved_once_and_becomes_model_path(tmp_path, tiny_model_path):
    from mentor_fast.models import load_policy, load_tokenizer

    model, tokenizer = load_policy(tiny_model_path, "float32"), load_tokenizer(tiny_model_path)
    trainer = GRPOTrainer(model, args=GRPOConfig(output_dir=str(tmp_path)), processing_class=tokenizer)
    saved = Path(trainer.cfg.model.path)
    assert saved == tmp_path / "initial_policy"
    assert (saved / "config.json").exists() and (saved / "tokenizer_config.json").exists()
    assert load_policy(saved, "float32").state_dict()["lm_head.weight"].equal(model.state_dict()["lm_head.weight"])
