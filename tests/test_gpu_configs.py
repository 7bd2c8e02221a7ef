"""The GPU recipes in configs/ (*_gpu.yaml, *_8gpu.yaml), checked on the CPU: every key is real and
the config resolves, they train with fp32 master weights and bf16 compute, vLLM samples in bf16,
G = 8 and 1,024 new tokens on GSM8K, their leading comment names the command and the disk they
need, and on a machine without CUDA they stop with a clear error instead of training on the CPU."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from mentor_fast.config import load_config, resolve
from mentor_fast.rollout import engine_dtype

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
GPU_CONFIGS = sorted(CONFIGS.glob("*_gpu.yaml")) + sorted(CONFIGS.glob("*_8gpu.yaml"))
IDS = [p.name for p in GPU_CONFIGS]


def _leading_comment(path: Path) -> str:
    lines = []
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            break
        lines.append(line.lstrip("#").strip())
    return "\n".join(lines)


def test_the_four_recipes_are_there():
    names = {p.name for p in GPU_CONFIGS}
    assert {"qwen2.5-1.5b-instruct_gpu.yaml", "llama-3.2-3b-instruct_gpu.yaml",
            "qwen2.5-1.5b-instruct_8gpu.yaml", "llama-3.2-3b-instruct_8gpu.yaml"} <= names


@pytest.mark.parametrize("path", GPU_CONFIGS, ids=IDS)
def test_gpu_config_resolves_to_the_recipe(path):
    cfg = load_config([path])  # unknown keys and bad values fail here
    resolve(cfg)  # idempotent: load_config has resolved it already
    assert cfg.model.dtype == "float32" and cfg.model.autocast_bf16, "fp32 master weights, bf16 compute"
    assert cfg.model.tf32 and cfg.model.gradient_checkpointing
    assert cfg.model.device == "cuda"
    assert engine_dtype(cfg) == "bfloat16"
    assert cfg.rollout.engine == "vllm" and cfg.rollout.vllm_dtype == "auto"
    assert cfg.rollout.vllm_sleep_level == 2 and not cfg.rollout.vllm_enforce_eager
    assert cfg.rollout.num_generations == 8
    assert cfg.rollout.max_new_tokens == 1024
    assert cfg.rollout.vllm_max_model_len >= cfg.data.max_prompt_tokens + cfg.rollout.max_new_tokens
    assert cfg.data.source == "jsonl" and cfg.data.format == "gsm8k"
    assert not Path(cfg.data.path).is_absolute() and cfg.data.path.endswith(".jsonl")
    assert cfg.loss.impl == "fused" and cfg.loss.is_cap == 2.0
    assert cfg.mentor.enable


@pytest.mark.parametrize("path", GPU_CONFIGS, ids=IDS)
def test_gpu_config_placement(path):
    cfg = load_config([path])
    if path.name.endswith("_8gpu.yaml"):  # colocate is one rank's: a child process per rank
        assert cfg.rollout.vllm_mode == "process"
        assert cfg.rollout.prompts_per_step % 8 == 0
        one = load_config([path.with_name(path.name.replace("_8gpu", "_gpu"))])
        assert cfg.rollout.vllm_gpu_memory_utilization < one.rollout.vllm_gpu_memory_utilization
    else:
        assert cfg.rollout.vllm_mode == "colocate"
        assert 0.25 <= cfg.rollout.vllm_gpu_memory_utilization <= 0.35


@pytest.mark.parametrize("path", GPU_CONFIGS, ids=IDS)
def test_gpu_config_comment_says_how_to_run_it_and_what_it_needs(path):
    head = _leading_comment(path)
    assert head, f"{path.name} has no leading comment"
    nproc = "--nproc 8 " if path.name.endswith("_8gpu.yaml") else ""
    assert f"mentor-fast train {nproc}--config configs/{path.name}" in head
    assert "disk" in head and "GB" in head
    assert re.search(r"model folder .*~\d+(\.\d+)? GB", head), "the model folder's size"
    assert "~4 MB" in head, "the GSM8K JSONL's size"
    assert re.search(r"checkpoint.*\n?.*bytes/param.*\n?.*~\d+(\.\d+)? GB", head), "the checkpoint's size per save"
    assert "keep_last_n" in head
    assert "ESTIMATE" in head and "Peak GPU memory" in head, "the peak memory, as an estimate"
    if nproc:
        assert "file PER RANK" in head, "process mode syncs the weights through a file per rank"


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the machine without CUDA")
def test_gpu_config_without_cuda_is_an_error_not_a_cpu_run():
    from mentor_fast.models import ModelError, resolve_device

    for path in GPU_CONFIGS:
        cfg = load_config([path])
        with pytest.raises(ModelError, match="torch sees no CUDA device"):
            resolve_device(cfg.model.device)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the machine without CUDA")
def test_gpu_config_train_command_fails_clearly_without_cuda(tmp_path, capsys):
    """`mentor-fast train` stops with one error line (exit 2) before it writes or loads anything."""
    from mentor_fast.cli import main

    out = tmp_path / "run"
    code = main(["train", "--config", str(CONFIGS / "qwen2.5-1.5b-instruct_gpu.yaml"), f"output_dir={out}",
                 f"model.path={tmp_path / 'no-model-here'}"])
    assert code == 2
    err = capsys.readouterr().err
    assert "error: model.device=cuda: torch sees no CUDA device" in err
    assert not out.exists()
