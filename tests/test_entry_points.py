"""Every way a user starts training, run as the user runs it, in a fresh interpreter: the console
script, GRPOTrainer in a plain script with no main guard (TRL's examples are written so), the same
code as a notebook cell (`python -c`, `python - < script`: a __main__ with no file), under torchrun,
and TRL's own trainer with mentor_rollout_func. Each scores with the math verifier, whose worker
processes must never import the user's main module: the script's body prints a line, and that line
appears once per process that ran it (once, or once per rank), never again from a worker.

The fork server itself (mentor_fast/rewards/forkserver.py): its workers are forked from it, not
from the trainer; one killed is started again; it and its workers end with the parent process.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from conftest import REPO

from mentor_fast.metrics import read_metrics
from mentor_fast.rewards import MathVerifierPool
from mentor_fast.rewards.pool import SERVER

MARK = "script body ran"
# TRL's example layout: data, config, trainer, train(), all at the top level.
SCRIPT = """
import os
print({mark!r}, flush=True)
from mentor_fast import GRPOConfig, GRPOTrainer

rows = [{{"prompt": f"What is {{a}} + {{b}}?", "answer": str(a + b)}} for a, b in [(1, 2), (3, 4), (5, 6), (7, 1)]]
args = GRPOConfig(output_dir={out!r}, num_generations=4, per_device_train_batch_size=4, max_completion_length=8,
                  max_steps=1, report_to="none", trainer={{"progress": False}})
result = GRPOTrainer("tiny-llama", args=args, train_dataset=rows).train()
print("trained to step", result.global_step, flush=True)
"""


def _run(cmd: list[str], cwd: Path, stdin: str | None = None, timeout: float = 240) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, cwd=cwd, input=stdin, capture_output=True, text=True, timeout=timeout, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return proc


def _trained_once(proc: subprocess.CompletedProcess, out: Path, processes: int = 1) -> None:
    assert proc.stdout.count(MARK) == processes, proc.stdout  # no worker re-ran the script
    assert proc.stdout.count("trained to step 1") == processes
    rows = read_metrics(out / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1] and "reward/math/mean" in rows[0]  # the verifier's workers scored


def test_grpo_trainer_in_a_plain_script_without_a_main_guard(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT.format(mark=MARK, out=str(tmp_path / "run")))
    _trained_once(_run([sys.executable, str(script)], tmp_path), tmp_path / "run")


@pytest.mark.parametrize("how", ["python -c", pytest.param("python - < script", marks=pytest.mark.slow)])
def test_grpo_trainer_as_a_notebook_cell_whose_main_has_no_file(tmp_path, how):
    """stdin is slow-marked: to the worker processes it is the same case as `-c` (a main without a file)."""
    code = SCRIPT.format(mark=MARK, out=str(tmp_path / "run"))
    cmd, stdin = ([sys.executable, "-c", code], None) if how == "python -c" else ([sys.executable, "-"], code)
    _trained_once(_run(cmd, tmp_path, stdin), tmp_path / "run")


@pytest.mark.slow  # ~20 s; its main module has a guard, and `python -m mentor_fast train` runs in the default set
def test_the_console_script(tmp_path):
    cli = Path(sys.executable).with_name("mentor-fast")
    proc = _run([str(cli), "train", "--config", str(REPO / "configs" / "tiny_test.yaml"), f"output_dir={tmp_path / 'run'}",
                 "trainer.max_steps=1", "trainer.tensorboard=false"], tmp_path)
    assert "run folder:" in proc.stdout
    rows = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1] and "reward/math/mean" in rows[0]


@pytest.mark.slow  # 20-40 s on 2 cores: two ranks each load torch, the model and a verifier pool
def test_grpo_trainer_in_a_plain_script_under_torchrun(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT.format(mark=MARK, out=str(tmp_path / "run")))
    proc = _run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", str(script)],
                tmp_path, timeout=300)
    _trained_once(proc, tmp_path / "run", processes=2)


TRL_SCRIPT = """
print({mark!r}, flush=True)
import datasets, trl
from mentor_fast.integrations.trl import mentor_rollout_func

def answered(completions, solution, **kwargs):
    return [float(solution[0] in c) for c in completions]

rows = [{{"prompt": f"What is {{a}} + {{b}}?", "solution": str(a + b)}} for a, b in [(1, 2), (3, 4)]]
args = trl.GRPOConfig(output_dir={out!r}, use_cpu=True, per_device_train_batch_size=4, num_generations=4,
                      max_completion_length=4, max_steps=1, report_to="none", save_strategy="no", bf16=False)
trainer = trl.GRPOTrainer(model={model!r}, reward_funcs=[answered], args=args,
                          train_dataset=datasets.Dataset.from_list(rows), rollout_func=mentor_rollout_func())
trainer.train()
print("trained to step", trainer.state.global_step, flush=True)
"""


@pytest.mark.slow  # ~60 s on 2 cores, most of it TRL importing vLLM (installed beside it here), as a user's would
def test_trl_with_mentor_rollout_func_in_a_plain_script(tmp_path):
    pytest.importorskip("trl")
    pytest.importorskip("datasets")
    from mentor_fast.models import resolve_model_path

    script = tmp_path / "train.py"
    script.write_text(TRL_SCRIPT.format(mark=MARK, out=str(tmp_path / "run"), model=str(resolve_model_path("ladder-llama"))))
    proc = _run([sys.executable, str(script)], tmp_path)
    assert proc.stdout.count(MARK) == 1 and "trained to step 1" in proc.stdout, proc.stdout
    rows = [json.loads(line) for line in (tmp_path / "run" / "mentor.jsonl").read_text().splitlines()]
    assert rows and all(r["step"] == 0 for r in rows)  # the toy model failed every group: the mentor took them


# -- the fork server -----------------------------------------------------------------------------


def _ppid(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def _gone(pid: int, within_s: float = 10.0) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except FileNotFoundError:
            return True
        if state == "Z" and _ppid(pid) != os.getpid():  # a zombie its (dead) parent's reaper will collect
            return True
        time.sleep(0.1)
    return False


needs_proc = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc (Linux)")


@needs_proc
@pytest.mark.timeout(120)
def test_workers_fork_from_the_server_not_the_trainer_and_a_killed_server_is_replaced():
    with MathVerifierPool(workers=2, timeout_s=10) as pool:
        assert [v.correct for v in pool.verify_batch([r"\boxed{3}", r"\boxed{4}"], ["3", "3"])] == [True, False]
        server = SERVER.pid
        assert server is not None and all(_ppid(p) == server for p in pool.pids)
        cmdline = Path(f"/proc/{server}/cmdline").read_bytes().split(b"\0")
        assert cmdline[1] == b"-c"  # a fresh interpreter, not a fork of this one
        workers, starts = pool.pids, SERVER.starts
        os.kill(server, signal.SIGKILL)
        assert all(_gone(p) for p in workers)  # they die with their server
        out = pool.verify_batch([r"\boxed{5}", r"\boxed{6}"], ["5", "5"])
        assert [v.correct for v in out] == [True, False]  # nothing lost: both items scored again
        assert SERVER.starts == starts + 1 and SERVER.pid != server
        assert all(_ppid(p) == SERVER.pid for p in pool.pids)


@needs_proc
def test_the_server_and_its_workers_end_with_the_process_that_started_them(tmp_path):
    code = textwrap.dedent("""
        import os
        from mentor_fast.rewards.pool import SERVER, MathVerifierPool
        pool = MathVerifierPool(workers=2)
        assert pool.verify_batch([r"\\boxed{1}"], ["1"])[0].correct
        print(SERVER.pid, *pool.pids, flush=True)
        os._exit(0)  # no close, no atexit: as a process killed outright
    """)
    proc = _run([sys.executable, "-c", code], tmp_path, timeout=120)
    pids = [int(p) for p in proc.stdout.split()]
    assert len(pids) == 3 and all(_gone(p) for p in pids)


def test_a_pool_copied_into_a_forked_process_leaves_the_parents_workers_alone(tmp_path):
    """A DataLoader worker forked from the trainer holds a copy of the pool: scoring there starts the
    copy's own workers (from a server of its own), and closing it neither stops nor kills the parent's."""
    code = textwrap.dedent("""
        import gc, os
        from mentor_fast.rewards.pool import SERVER, MathVerifierPool
        pool = MathVerifierPool(workers=2)
        pool.verify_batch([r"\\boxed{1}"], ["1"])
        workers, server = pool.pids, SERVER.pid
        pid = os.fork()
        if pid == 0:
            ok = pool.verify_batch([r"\\boxed{2}"], ["2"])[0].correct
            print("child", ok, not set(pool.pids) & set(workers), SERVER.pid != server, flush=True)
            pool.close()
            del pool
            gc.collect()
            SERVER.stop()
            os._exit(0)
        os.waitpid(pid, 0)
        out = pool.verify_batch([r"\\boxed{3}", r"\\boxed{3}"], ["3", "4"])
        print("parent", [v.correct for v in out], pool.pids == workers, pool.counters.restarts, flush=True)
        pool.close()
    """)
    lines = _run([sys.executable, "-c", code], tmp_path, timeout=120).stdout.splitlines()
    assert lines == ["child True True True", "parent [True, False] True 0"]
