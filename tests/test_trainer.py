"""End-to-end runs on the tiny model, resume equality, config and data errors through the CLI."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from helpers import comparable, write_shaped_reward
from transformers import AutoModelForCausalLM

from mentor_fast.config import load_config
from mentor_fast.metrics import read_metrics
from mentor_fast.trainer import Trainer

TINY = "configs/tiny_test.yaml"


def _cfg(tmp_path, *overrides):
    return load_config([TINY], [f"output_dir={tmp_path}", "trainer.tensorboard=true", *overrides])


REQUIRED = [
    "reward/mean", "acc", "groups/all_fail_frac", "groups/all_pass_frac", "signal_yield",
    "response_length/mean", "clip_frac", "entropy", "grad_norm", "lr", "timing_s/gen", "timing_s/reward",
    "timing_s/old_logprob", "timing_s/update", "timing_s/step", "perf/tokens_per_s", "perf/peak_mem_gb",
]


def test_two_step_run_writes_metrics_report_and_loadable_checkpoint(tmp_path, monkeypatch):
    # A random tiny model never answers correctly, so a shaped TRL-style reward gives it a signal.
    reward_fn = write_shaped_reward(tmp_path, monkeypatch)
    out = Trainer(_cfg(tmp_path / "run", "trainer.max_steps=2",
                       reward_fn)).fit()
    rows = read_metrics(out / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2]
    for key in REQUIRED:
        assert key in rows[0], key
    assert 0.0 <= rows[0]["groups/all_fail_frac"] <= 1.0
    assert rows[0]["acc"] == 0.0 and rows[0]["groups/all_fail_frac"] == 1.0  # correctness is not shaped
    assert rows[0]["grad_norm"] > 0 and rows[0]["signal_yield"] > 0  # ... but the shaped reward teaches
    assert rows[0]["reward/shorter_is_better/mean"] < 0
    assert (out / "report.png").stat().st_size > 1000
    assert list((out / "tensorboard").glob("events.out.tfevents.*"))
    assert (out / "config.yaml").is_file()
    ckpt = out / "checkpoints" / "step_000002"
    model = AutoModelForCausalLM.from_pretrained(ckpt / "policy")
    assert model.config.num_hidden_layers == 2


def test_model_device_is_checked_and_resolved():
    from mentor_fast.config import ConfigError
    from mentor_fast.models import ModelError, resolve_device

    with pytest.raises(ConfigError, match="model.device"):
        load_config([TINY], ["model.device=tpu"])
    assert resolve_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    assert resolve_device("cpu").type == "cpu"
    if torch.cuda.is_available():
        assert resolve_device("cuda:0") == torch.device("cuda:0")
    else:  # a GPU asked for and not there is an error, not a silent run on the CPU
        with pytest.raises(ModelError, match="model.device=cuda"):
            resolve_device("cuda")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_run_on_gpu_trains_and_generates_there(tmp_path, monkeypatch):
    reward_fn = write_shaped_reward(tmp_path, monkeypatch)
    trainer = Trainer(_cfg(tmp_path / "run", "trainer.max_steps=2", "model.device=cuda", "mentor.enable=true",
                           reward_fn))
    try:
        assert next(trainer.model.parameters()).device.type == "cuda"
        rows = [trainer.step(step) for step in (1, 2)]
    finally:
        trainer.close()
    assert rows[0]["grad_norm"] > 0 and all(torch.isfinite(torch.tensor(r["loss"])) for r in rows)
    assert rows[-1]["perf/peak_mem_gb"] > 0  # CUDA memory was allocated: the work ran on the GPU


def test_resume_gives_the_same_next_step(tmp_path):
    full = tmp_path / "full"
    Trainer(_cfg(full, "trainer.max_steps=3")).fit()
    part = tmp_path / "part"
    Trainer(_cfg(part, "trainer.max_steps=2")).fit()
    Trainer(_cfg(part, "trainer.max_steps=3"), resume="auto").fit()
    a = read_metrics(full / "metrics.jsonl")
    b = read_metrics(part / "metrics.jsonl")
    assert [r["step"] for r in b] == [1, 2, 3]
    assert comparable(a[2]) == pytest.approx(comparable(b[2]), rel=1e-6, abs=1e-9)


def _cli(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "mentor_fast.cli", *args], capture_output=True, text=True,
                          cwd=cwd, timeout=300, check=False)


def _cli_here(capsys, *args) -> tuple[int, str]:
    """The CLI's main in this process (what `mentor-fast ARGS` runs, without a fresh interpreter's
    imports; test_config.py runs the real command once): its exit code and stderr. An uncaught
    exception, which a user would see as a traceback, fails the test."""
    from mentor_fast.cli import main

    capsys.readouterr()
    rc = main(list(args))
    return rc, capsys.readouterr().err


def test_unknown_key_fails_at_once_naming_it(capsys):
    rc, err = _cli_here(capsys, "train", "--config", "configs/demo_cpu.yaml", "no_such_key=1")
    assert rc == 2 and "no_such_key" in err


def test_wrong_type_names_key_and_close_match(capsys):
    rc, err = _cli_here(capsys, "train", "--config", TINY, "trainer.max_step=x")
    assert rc == 2 and "trainer.max_steps" in err
    rc, err = _cli_here(capsys, "train", "--config", TINY, "rollout.temperature=hot")
    assert rc == 2 and "rollout.temperature" in err


def test_cross_field_checks_name_the_key():
    from mentor_fast.config import ConfigError, load_config

    with pytest.raises(ConfigError, match="mentor.loss.shaping_gamma"):
        load_config([TINY], ["mentor.loss.mode=shaping", "mentor.loss.shaping_gamma=0"])
    assert load_config([TINY], ["mentor.loss.mode=shaping"]).mentor.loss.shaping_gamma == 0.1


@pytest.mark.parametrize(
    "content,needle",
    [
        (b'{"question": "1+1?", "answer": "#### 2"}\n{"question": "2+2?"}\n', ":2"),
        (b"", "no rows"),
        (b'{"question": "1+1?", "answer": "#### 2"}\n\xff\xfe{"question"\n', ":2"),
    ],
    ids=["missing-answer", "empty-file", "non-utf8"],
)
def test_bad_data_gives_clear_error_naming_file_and_line(tmp_path, capsys, content, needle):
    data = tmp_path / "bad.jsonl"
    data.write_bytes(content)
    rc, err = _cli_here(capsys, "train", "--config", TINY, f"output_dir={tmp_path / 'run'}", "data.source=jsonl",
                        f"data.path={data}", "data.format=gsm8k")
    assert rc == 2 and "bad.jsonl" in err and needle in err, err[-2000:]


def test_long_prompts_are_dropped_and_counted(tmp_path):
    data = tmp_path / "mixed.jsonl"
    rows = [{"question": "What is 2 + 3?", "answer": "2 + 3 = 5\n#### 5"},
            {"question": "Count the apples. " * 120 + "How many?", "answer": "#### 7"}]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = _cfg(tmp_path / "run", "trainer.max_steps=1", "data.source=jsonl", f"data.path={data}",
               "data.format=gsm8k", "data.max_prompt_tokens=200")
    Trainer(cfg).fit()
    (row,) = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert row["data/dropped_long_prompts"] == 1
    assert row["groups/count"] == 1


def test_smollm2_smoke_step(tmp_path, smollm2_path):
    cfg = load_config([], [
        f"output_dir={tmp_path}", "model.path=smollm2-135m-instruct", "rollout.prompts_per_step=1",
        "rollout.num_generations=2", "rollout.max_new_tokens=8", "trainer.max_steps=1", "trainer.progress=false",
        "trainer.tensorboard=false",
    ])
    trainer = Trainer(cfg)
    try:
        row = trainer.step(1)
    finally:
        trainer.close()
    assert row["batch/sequences"] == 2
    assert row["response_length/mean"] >= 1
    assert row["grad_norm"] >= 0


@pytest.mark.parametrize("kl", [None, "k1", "k2", "k3"])
def test_fused_loss_run_matches_reference_run(tmp_path, monkeypatch, kl):
    """Same seed, same samples: the fused kernels and the plain-torch reference give the same
    training run, without a KL term and with beta > 0 for each estimator (both compute
    kernels/objective.py's objective; the KL is 0 at step 1 and grows as the policy leaves the
    reference). Tolerance: both compute fp32 log-softmax over the same logits in a different order
    (chunked GEMM vs one GEMM), ~1e-6 relative per log-prob; after Adam steps of lr 1e-4 the
    weights differ by ~1e-7, far below what flips a sampled token, so per-step metrics agree to 1e-4."""
    reward_fn = write_shaped_reward(tmp_path, monkeypatch)
    beta = [] if kl is None else ["loss.beta=0.5", "model.ref_model=true", f"loss.kl_estimator={kl}"]
    rows = {}
    for impl in ("reference", "fused"):
        out = Trainer(_cfg(tmp_path / impl, "trainer.max_steps=3", f"loss.impl={impl}", *beta,
                           reward_fn)).fit()
        rows[impl] = read_metrics(out / "metrics.jsonl")
    keys = ["loss", "grad_norm", "entropy", "rollout/logp_mismatch"] + ([] if kl is None else ["kl"])
    for ref, fused in zip(rows["reference"], rows["fused"]):
        assert fused["reward/mean"] == ref["reward/mean"]  # identical samples
        for key in keys:
            assert fused[key] == pytest.approx(ref[key], rel=1e-4, abs=1e-6), key
    if kl is not None:
        assert abs(rows["fused"][-1]["kl"]) > 1e-6  # the policy left the reference (k1 may be < 0)


def test_periodic_eval_logs_heldout_pass_at_1(tmp_path):
    out = Trainer(_cfg(tmp_path, "trainer.max_steps=2", "trainer.eval_every=2", "data.eval_size=3",
                       "trainer.eval_n=2")).fit()
    rows = read_metrics(out / "metrics.jsonl")
    assert "eval/pass@1" not in rows[0]
    assert rows[1]["eval/count"] == 3 and 0.0 <= rows[1]["eval/pass@1"] <= 1.0
    records = [json.loads(line) for line in (out / "eval" / "step_000002.jsonl").read_text().splitlines()]
    assert len(records) == 3 and all(r["n"] == 2 and len(r["completions"]) == 2 for r in records)


def test_bench_rejects_unknown_variants_and_trl_without_its_python(capsys):
    from mentor_fast.bench import main as bench_main

    with pytest.raises(SystemExit):
        bench_main(["--variants", "fused_fp33"])
    assert "unknown variant" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench_main(["--variants", "trl_fp32_gc,fused_fp32"])
    assert "--trl-python" in capsys.readouterr().err


def test_every_bench_variant_is_a_valid_config():
    from mentor_fast.bench import BASE, VARIANTS

    for name, overrides in VARIANTS.items():
        cfg = load_config([], BASE + overrides)  # an unknown or mistyped key raises here
        assert cfg.mentor.enable == name.startswith("mentor_"), name


def test_help_exits_zero_and_names_every_command():
    from mentor_fast.cli import COMMANDS

    proc = _cli("--help")
    assert proc.returncode == 0 and all(name in proc.stdout for name in COMMANDS)
    assert _cli().returncode == 2 and _cli("trian").returncode == 2


def test_sft_writes_a_policy_that_learned_the_targets(tmp_path, capsys):
    """mentor-fast sft on the tiny model: the loss on worked solutions falls and the folder loads."""
    from mentor_fast.sft import main as sft_main

    assert sft_main(["--config", TINY, "--model", "tiny-llama", "--levels", "1", "--hinted-levels", "5",
                     "--steps", "6", "--batch", "4", "--lr", "3e-3", "--out", str(tmp_path / "sft")]) == 0
    losses = [float(line.rsplit(" ", 1)[1]) for line in capsys.readouterr().out.splitlines()
              if line.startswith("sft step")]
    assert len(losses) == 6 and losses[-1] < losses[0]
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "sft" / "policy")
    assert model.config.num_hidden_layers == 2


def test_an_hf_engine_in_bf16_decodes_from_its_own_copy_synced_every_step(tmp_path, monkeypatch):
    """rollout.hf_dtype=bfloat16 over fp32 master weights: the engine holds a bf16 copy of the policy,
    each step's sync overwrites it with the updated weights (the copy is not left behind), and the
    sampler/trainer log-prob gap it opens is logged and small; the fp32 default shares the module."""
    reward_fn = write_shaped_reward(tmp_path, monkeypatch)
    trainer = Trainer(_cfg(tmp_path / "run", "trainer.max_steps=2", "rollout.hf_dtype=bfloat16", "optim.lr=1e-2",
                           reward_fn))
    engine_model = trainer.engine._model
    assert engine_model is not trainer.model
    assert {p.dtype for p in engine_model.parameters()} == {torch.bfloat16}
    rows = [trainer.step(step) for step in (1, 2)]
    for name, p in trainer.model.state_dict().items():
        assert torch.equal(engine_model.state_dict()[name], p.to(torch.bfloat16)), name
    assert 0 < rows[1]["rollout/logp_mismatch"] < 0.5
    trainer.close()
    shared = Trainer(_cfg(tmp_path / "shared", "trainer.max_steps=1", reward_fn))
    assert shared.engine._model is shared.model
    shared.close()
