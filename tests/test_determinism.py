"""Reproducible runs (issue 42): the same commit, config, seed and thread count give the same run on
the same machine, step for step, bit for bit.

Each run is a process of its own with its own PYTHONHASHSEED (string hashes, so set orders, differ
between the two), and the two runs share the cores at the same time, so their timings differ: what a
run logs may depend on neither. Every metric is compared exactly, timings aside, and with MENTOR every
mentor.jsonl row too, its latency aside (experiments/same_run.py, which a user runs on two runs). The
async mentor writes step t's hints in a thread beside step t's update and they ride in step t+1's
generate call: its timing must not reach the batch. The real model and verifier, no mocks:
SmolLM2-135M-Instruct on 1-digit additions solves a quarter to a half of its attempts, so some groups
all fail and the mentor rescues some of them with the worked solution's first step.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from mentor_fast.config import load_config
from mentor_fast.determinism import deterministic_algorithms, wanted
from mentor_fast.metrics import read_metrics
from mentor_fast.trainer import Trainer

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "experiments"))  # the scripts import their sibling modules, as when run from it
import same_run

# MENTOR as the collapse experiment runs it (experiments/collapse.py's mentor arm: worked solutions,
# re-rolls riding in the next step's call in the rows of its last prompts, cut at the horizon, replace
# + self-distillation; hints from level 3, the first step worked out, where the raw model needs it), on
# a task the raw model half solves, so that in three steps groups fail, hints are written beside the
# update and some re-rolls rescue their group.
MENTOR_RUN = [
    "model.path=smollm2-135m-instruct", "data.levels=[1]", "data.max_digits=1", "rollout.prompts_per_step=4",
    "rollout.num_generations=4", "rollout.max_new_tokens=32", "optim.lr=2e-5", "trainer.max_steps=3",
    "method=mentor", "mentor.agents.backend=worked_solutions", "mentor.trigger.start_level=3",
    "mentor.trigger.max_groups_frac=1.0", "mentor.reroll.schedule=next_step_shared_rows", "mentor.reroll.count=4",
    "mentor.reroll.max_rounds=1", "mentor.reroll.horizon=1", "mentor.loss.distill_coef=1.0",
]


def train_twice(tmp_path: Path, overrides: list[str], threads: int = 1) -> tuple[Path, Path]:
    """The same run (`mentor-fast train` arguments) in two processes at once, PYTHONHASHSEED 1 and 2;
    their run folders."""
    procs, folders = [], []
    for hash_seed in (1, 2):
        out = tmp_path / f"run{hash_seed}"
        cmd = [sys.executable, "-m", "mentor_fast", "train", *overrides, f"output_dir={out}",
               f"trainer.threads={threads}", "trainer.tensorboard=false", "trainer.progress=false"]
        env = {**os.environ, "PYTHONHASHSEED": str(hash_seed)}
        procs.append(subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True))
        folders.append(out)
    for p in procs:
        log, _ = p.communicate(timeout=900)
        assert p.returncode == 0, log[-3000:]
    return folders[0], folders[1]


def assert_same_run(a: Path, b: Path) -> list[dict]:
    """experiments/same_run.py's comparison; the first run's metrics rows."""
    r = same_run.compare(a, b)
    assert r["same"], r
    return read_metrics(a / "metrics.jsonl")


def test_a_vanilla_run_is_the_same_run_twice(tmp_path):
    a, b = train_twice(tmp_path, ["--config", "configs/tiny_test.yaml", "trainer.max_steps=3"])
    rows = assert_same_run(a, b)
    assert len(rows) == 3 and all(r["batch/tokens"] > 0 for r in rows)
    # the policy each run ends with, bit for bit
    final = [(run / "checkpoints" / "step_000003" / "policy" / "model.safetensors").read_bytes() for run in (a, b)]
    assert final[0] == final[1]


def test_a_mentor_run_with_the_async_mentor_is_the_same_run_twice(tmp_path):
    a, b = train_twice(tmp_path, MENTOR_RUN)
    rows = assert_same_run(a, b)
    # what the comparison covered: hints written beside an update, re-rolls riding in the next step's
    # call, a rescued group in the batch
    assert sum(r.get("mentor/merged_rerolls", 0) for r in rows) > 0
    assert sum(r.get("mentor/rescued", 0) for r in rows) >= 1
    assert any(h["rescued"] for h in same_run.mentor_rows(a))


def test_same_run_names_the_first_step_where_two_runs_part_and_their_spread(tmp_path):
    """The comparison the tests above rely on sees a change in the last bit of one metric, a row of
    mentor.jsonl, and nothing in the timings."""
    rows = [{"step": s, "loss": 0.1 * s, "acc": 0.5, "timing_s/step": 1.0} for s in (1, 2, 3)]
    for name, changed in (("a", {}), ("b", {2: {"loss": math.nextafter(0.2, 1.0), "timing_s/step": 9.0}})):
        (tmp_path / name).mkdir()
        (tmp_path / name / "metrics.jsonl").write_text("".join(
            json.dumps(r | changed.get(r["step"], {})) + "\n" for r in rows))
        (tmp_path / name / "mentor.jsonl").write_text("".join(  # step 1's row written again, as on a resume
            json.dumps({"step": 1, "group_id": 7, "hint": hint, "latency_s": 1.0}) + "\n" for hint in ("x", name)))
    r = same_run.compare(tmp_path / "a", tmp_path / "a")
    assert r["same"] and r["steps"] == 3 and r["mentor_rows"] == 1
    r = same_run.compare(tmp_path / "a", tmp_path / "b")
    assert not r["same"] and (r["first_step"], r["first_keys"]) == (2, ["loss"]) and not r["mentor_same"]
    assert r["max_abs_diff"] == {"loss": pytest.approx(2.8e-17, rel=0.1)}


COLLAPSE_SMALL = ["--arms", "mentor", "--sft-steps", "2", "--sft-batch", "4", "--pre-steps", "1", "--post-steps", "4",
                  "--save-every", "2", "--prompts", "2", "--group", "4", "--max-new-tokens", "32",
                  "--eval-problems", "4", "--eval-n", "1"]


def collapse(out: Path, hash_seed: int, *flags: str) -> subprocess.Popen:
    cmd = [sys.executable, "experiments/collapse.py", "--out", str(out), "--results", str(out / "results.json"),
           *COLLAPSE_SMALL, *flags]
    return subprocess.Popen(cmd, cwd=REPO, env={**os.environ, "PYTHONHASHSEED": str(hash_seed)},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


@pytest.mark.slow  # ~3 min on 2 cores: two small collapse experiments, one cut and resumed
def test_the_collapse_experiments_mentor_arm_is_the_same_run_twice_and_when_cut_and_resumed(tmp_path):
    """experiments/collapse.py end to end (supervised warm-up, GRPO warm-up, the MENTOR arm, the held-out
    evaluation) twice at once; the second is killed once its arm has saved step 2 and rerun with --reuse,
    so it goes on from that checkpoint. Both arms log the same run and score the same held-out accuracy."""
    a, b = tmp_path / "a", tmp_path / "b"
    runs = [collapse(a, 1), collapse(b, 2)]
    ckpt = b / "seed0" / "mentor" / "checkpoints" / "step_000002"
    while not ckpt.exists():
        assert runs[1].poll() is None, runs[1].communicate()[0][-3000:]
        time.sleep(0.2)
    runs[1].kill()
    runs[1].communicate()
    resumed = collapse(b, 3, "--reuse")
    for p in (runs[0], resumed):
        log, _ = p.communicate(timeout=1800)
        assert p.returncode == 0, log[-3000:]
    for part in ("warmup", "mentor"):
        r = same_run.compare(a / "seed0" / part, b / "seed0" / part)
        assert r["same"], (part, r)
    summaries = [json.loads((run / "seed0" / "mentor" / "arm_summary.json").read_text()) for run in (a, b)]
    assert summaries[0]["heldout_acc_no_hint"] == summaries[1]["heldout_acc_no_hint"]
    assert summaries[0]["curve"] == summaries[1]["curve"] and len(summaries[0]["curve"]) == 4
    assert not (b / "seed0" / "mentor" / "checkpoints").exists()  # dropped once summarised


def test_repeated_rows_add_their_gradients_in_one_order_under_the_runs_setting():
    """What parted two runs of the collapse experiment's warm-up at their first update: the backward of
    a gather whose indices repeat (x[idx], as the shared-prompt forward hands a prompt's rows to its
    completions) adds with index_put_(accumulate=True), whose CPU kernel adds with atomics, in an order
    that changes from call to call (without the setting, 10 of these calls gave 10 gradients other than
    the sequential sum on 2 threads, torch 2.13). Under the run's setting every call gives the bits of
    the sequential sum. Rows of SmolLM2's width: whether the atomics collide depends on how the kernel
    splits the work."""
    g = torch.Generator().manual_seed(0)
    idx = torch.randint(0, 300, (4000,), generator=g)
    upstream = torch.randn(4000, 576, generator=g)
    in_order = torch.zeros(300, 576).index_add_(0, idx, upstream)  # one row after another
    x = torch.randn(300, 576, requires_grad=True)
    with deterministic_algorithms(wanted("auto", torch.device("cpu"))):
        for _ in range(10):
            x.grad = None
            x[idx].backward(upstream)
            assert torch.equal(x.grad, in_order)


def test_the_trainer_holds_the_setting_while_it_runs_and_gives_back_the_callers(tmp_path):
    assert not torch.are_deterministic_algorithms_enabled()
    for setting, on in (("auto", True), ("false", False)):
        cfg = load_config(["configs/tiny_test.yaml"], [f"output_dir={tmp_path / setting}",
                                                       f"trainer.deterministic={setting}"])
        trainer = Trainer(cfg)
        try:
            assert torch.are_deterministic_algorithms_enabled() is on
        finally:
            trainer.close()
        assert not torch.are_deterministic_algorithms_enabled()
    assert not wanted("auto", torch.device("cuda")) and wanted(True, torch.device("cuda"))


def test_the_cost_benchmarks_gradient_fingerprint_sees_one_bit_and_the_check_fails_a_cpu_update_that_varies(tmp_path):
    """benchmarks/determinism_cost.py counts the distinct gradients of a repeated update by a fingerprint
    per tensor; a change in the last bit of one element must change it. gpu_check's row built from its
    JSON fails the CPU check when the setting on gave more than one gradient, and only reports it on a GPU."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    import determinism_cost
    import gpu_check_table

    model = torch.nn.Linear(8, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    hashes = determinism_cost.GradientHashes(model, opt, torch.device("cpu"))
    grads = [torch.randn_like(p) for p in model.parameters()]
    for flip in (False, False, True):
        for p, g in zip(model.parameters(), grads, strict=True):
            p.grad = g.clone()
        if flip:  # one element, its last mantissa bit
            model.weight.grad.view(torch.int32)[1, 2] ^= 1
        opt.step()
    assert hashes.seen[0] == hashes.seen[1] != hashes.seen[2]

    rows = {"off": {"distinct_gradients": 3, "calls": 4}, "on": {"distinct_gradients": 2, "calls": 4}}
    (tmp_path / "determinism.json").write_text(json.dumps(
        {"model": "m", "rollouts": 32, "rows": rows, "on_over_off": 0.9}))
    for mode, fails in (("cpu", True), ("gpu", False)):
        t = gpu_check_table.Table()
        gpu_check_table.determinism(t, tmp_path, "0", mode)
        assert bool(t.failed) is fails and "on 2 of 4" in t.rows[0][2]
