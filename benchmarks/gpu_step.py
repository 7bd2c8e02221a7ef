#!/usr/bin/env python
"""A GRPO step on a GPU: side by side with TRL, MENTOR's re-roll cost, and a Qwen2.5-1.5B-sized step.

    python benchmarks/gpu_step.py --model DIR [--big-model DIR] [--trl-python PY] [--parts trl,mentor,big]
        [--steps 4] [--budget-s 400] [--out FILE.json]
    python benchmarks/gpu_step.py --cpu --model TINY_DIR --big-model TINY_DIR   # tiny shapes on the CPU (CI)

benchmarks/gpu_check.sh builds the models (benchmarks/build_model.py: `0p5b` for --model, `1p5b` for
--big-model) and runs this after the kernel table. Every run is a fresh process, so each peak memory is
its own (CUDA: torch.cuda.max_memory_allocated; CPU: peak RSS).

Parts:
- trl: mentor_fast (the bench's child, `mentor_fast.bench --one fused_bf16`: the fused loss, bf16 autocast
  over fp32 master weights, the HF engine in its default mode, every other setting its default) and TRL's
  GRPOTrainer (benchmarks/trl_baseline.py: use_vllm=False, its own generation, bf16, gradient
  checkpointing on as TRL defaults) on the same model, the same prompts (the bench's ladder level 2, as
  TRL's runner builds them, checked per step), G = 8, 4 prompts, 128 new tokens, lr 1e-6, beta 0, one
  optimizer step per generation, and the same reward (trl_baseline.shorter_is_better: -len(text) / 100,
  a random model's only signal). Also ours with gradient checkpointing on, TRL's setting, for a like-for-
  like memory figure (GPU only). Runs alternate ours, TRL, ours-gc; the figures are medians over steps 2..N.
- mentor: ours as above, vanilla against MENTOR (worked_solutions writer, re-rolls riding in the next
  step's generate call: recovery.reroll.schedule=next_step_extra_rows). The random model fails every
  group, so MENTOR works its whole budget every step: the worst case of what re-rolls cost.
- big: the one-H200 recipe (configs/qwen2.5-1.5b-instruct_gpu.yaml) on the 1.5B-shaped model with
  rollout.engine=hf (vLLM cannot reach the lent machine), the built-in ladder for data (no GSM8K on
  the machine), the worked_solutions writer (the recipe's `self` writer on a random model only adds
  decoding), 64 prompts x 8 x 512 new tokens, 2 steps: tokens/s, peak memory, each stage's share.
Prints one table and writes JSON; exits 1 if a run failed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
REWARD = 'reward.functions=["trl_baseline:shorter_is_better"]'
OURS = ["trainer.threads=0", REWARD]  # the bench's BASE pins 2 threads for the CPU; a GPU run takes torch's default
GC_ON = ["model.gradient_checkpointing=true"]
MENTOR = ["mentor.enable=true", "mentor.agents.backend=worked_solutions", "recovery.reroll.schedule=next_step_extra_rows"]
STAGES = ("gen", "reward", "old_logprob", "mentor", "update", "weight_sync")


def _env() -> dict:
    path = os.pathsep.join(filter(None, [str(REPO / "benchmarks"), os.environ.get("PYTHONPATH")]))
    return dict(os.environ, PYTHONPATH=path, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false")


def _run(cmd: list[str], timeout_s: float, log: Path) -> subprocess.CompletedProcess:
    with log.open("w") as f:
        return subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=_env(), timeout=max(10.0, timeout_s),
                              check=False, text=True)


def run_ours(name: str, model: str, device: str, steps: int, extra: list[str], timeout_s: float, logs: Path) -> dict:
    """Our trainer through the bench's child process (mentor_fast.bench --one): its per-step metric rows."""
    cmd = [sys.executable, "-m", "mentor_fast.bench", "--one", "fused_bf16", "--steps", str(steps),
           f"model.path={model}", f"model.device={device}", *OURS, *extra]
    proc = _run(cmd, timeout_s, logs / f"{name}.log")
    text = (logs / f"{name}.log").read_text()
    line = next((ln for ln in text.splitlines() if ln.startswith("RESULT ")), None)
    if proc.returncode != 0 or line is None:
        return {"name": name, "error": f"exit {proc.returncode}: {text[-400:]}"}
    rows = json.loads(line[len("RESULT "):])["steps"]
    return {"name": name, "overrides": extra, **_summary([{
        "step_s": r["timing_s/step"], "tokens": r["batch/tokens"], "peak_gb": r.get("perf/peak_mem_gb"),
        **{f"{k}_s": r.get(f"timing_s/{k}", 0.0) for k in STAGES}} for r in rows])}


def run_trl(name: str, model: str, device: str, steps: int, new_tokens: int, trl_python: str, timeout_s: float,
            logs: Path) -> dict:
    with tempfile.TemporaryDirectory(prefix="gpu-step-trl-") as tmp:
        cmd = [trl_python, str(REPO / "benchmarks" / "trl_baseline.py"), "--model", model, "--out", tmp, "--name",
               name, "--max-steps", str(steps), "--bf16", "--device", device, "--reward", "length",
               "--max-new-tokens", str(new_tokens)]
        proc = _run(cmd, timeout_s, logs / f"{name}.log")
        result = Path(tmp) / f"{name}.json"
        if proc.returncode != 0 or not result.is_file():
            return {"name": name, "error": f"exit {proc.returncode}: {(logs / f'{name}.log').read_text()[-400:]}"}
        raw = json.loads(result.read_text())
    peak_rss = raw["ru_maxrss_mb"] / 1024
    return {"name": name, "prompts_match": all(s["prompts_match"] for s in raw["steps"]), **_summary([{
        "step_s": s["wall_s"], "tokens": float(s["completion_tokens"]),
        "peak_gb": s["peak_cuda_gb"] if s.get("peak_cuda_gb") is not None else peak_rss,
        "gen_s": s["generate_s"], "reward_s": s["reward_s"], "update_s": s["train_s"]} for s in raw["steps"]])}


def run_big(model: str, device: str, cpu: bool, timeout_s: float, logs: Path) -> dict:
    """The one-H200 recipe on the 1.5B-shaped model, 2 steps (CPU: the tiny model, tiny shapes)."""
    shape = (["rollout.prompts_per_step=2", "rollout.num_generations=4", "rollout.max_new_tokens=16",
              "trainer.micro_batch_tokens=1024", "model.tf32=false"] if cpu else
             ["rollout.prompts_per_step=64", "rollout.num_generations=8", "rollout.max_new_tokens=512",
              "rollout.hf_batch_size=512"])  # the step's 512 rows in one bucket, as a GPU user sets it
    with tempfile.TemporaryDirectory(prefix="gpu-step-big-") as tmp:
        cmd = [sys.executable, "-m", "mentor_fast.cli", "train", "--config",
               str(REPO / "configs" / "qwen2.5-1.5b-instruct_gpu.yaml"), f"output_dir={tmp}", f"model.path={model}",
               f"model.device={device}", "rollout.engine=hf", "data.source=ladder", "data.levels=[2]",
               "mentor.agents.backend=worked_solutions", "trainer.max_steps=2", "trainer.save_every=0",
               "trainer.eval_every=0", "trainer.tensorboard=false", "trainer.progress=false", REWARD, *shape]
        proc = _run(cmd, timeout_s, logs / "big.log")
        metrics = Path(tmp) / "metrics.jsonl"
        rows = [json.loads(ln) for ln in metrics.read_text().splitlines() if ln.strip()] if metrics.is_file() else []
    if proc.returncode != 0 or len(rows) != 2:
        return {"name": "big", "error": f"exit {proc.returncode}, {len(rows)} of 2 steps: "
                                        f"{(logs / 'big.log').read_text()[-400:]}"}
    return {"name": "big", "shape": shape, "steps_rows": [{
        "step_s": r["timing_s/step"], "tokens": r["batch/tokens"], "peak_gb": r.get("perf/peak_mem_gb"),
        "tokens_per_s": r["perf/tokens_per_s"], **{f"{k}_s": r.get(f"timing_s/{k}", 0.0) for k in STAGES}}
        for r in rows]}


def _summary(rows: list[dict]) -> dict:
    """Medians over steps 2..N (the first pays compilation and allocator warm-up), the largest peak."""
    rest = rows[1:] if len(rows) > 1 else rows
    med = {k: statistics.median(r[k] for r in rest) for k in rest[0] if k != "peak_gb"}
    med["tokens_per_s"] = statistics.median(r["tokens"] / r["step_s"] for r in rest)
    peaks = [r["peak_gb"] for r in rows if r.get("peak_gb") is not None]
    return {"median": med, "peak_gb": max(peaks) if peaks else None, "steps": rows}


def table(results: list[dict]) -> str:
    lines = ["| run | step s | gen s | update s | tokens/s | peak GB | note |", "|---|---|---|---|---|---|---|"]
    for r in results:
        if "error" in r:
            lines.append(f"| {r['name']} | ERROR | | | | | {r['error'][-150:]!r} |")
            continue
        if r["name"] == "big":
            for i, s in enumerate(r["steps_rows"], 1):
                share = ", ".join(f"{k} {s[f'{k}_s'] / s['step_s']:.0%}" for k in STAGES if s[f"{k}_s"])
                lines.append(f"| big step {i} | {s['step_s']:.2f} | {s['gen_s']:.2f} | {s['update_s']:.2f} | "
                             f"{s['tokens_per_s']:.0f} | {s['peak_gb'] or 0:.2f} | {share} |")
            continue
        m = r["median"]
        note = r.get("note", "")
        lines.append(f"| {r['name']} | {m['step_s']:.2f} | {m['gen_s']:.2f} | {m['update_s']:.2f} | "
                     f"{m['tokens_per_s']:.0f} | {r['peak_gb'] or 0:.2f} | {note} |")
    return "\n".join(lines)


def compare(results: list[dict]) -> dict:
    """The ratios the issue asks for: ours over TRL (tokens/s, peak memory), MENTOR over vanilla (step time)."""
    by = {r["name"]: r for r in results if "error" not in r}
    out = {}
    if "ours" in by and "trl" in by:
        out["tokens_per_s_vs_trl"] = by["ours"]["median"]["tokens_per_s"] / by["trl"]["median"]["tokens_per_s"]
        if by["ours"]["peak_gb"] and by["trl"]["peak_gb"]:
            out["peak_mem_vs_trl"] = by["ours"]["peak_gb"] / by["trl"]["peak_gb"]
    if "ours_gc" in by and "trl" in by:
        out["gc_tokens_per_s_vs_trl"] = by["ours_gc"]["median"]["tokens_per_s"] / by["trl"]["median"]["tokens_per_s"]
        if by["ours_gc"]["peak_gb"] and by["trl"]["peak_gb"]:
            out["gc_peak_mem_vs_trl"] = by["ours_gc"]["peak_gb"] / by["trl"]["peak_gb"]
    if "ours" in by and "mentor" in by:
        out["mentor_step_vs_vanilla"] = by["mentor"]["median"]["step_s"] / by["ours"]["median"]["step_s"]
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="model folder for the trl and mentor parts (gpu_check: 0p5b)")
    p.add_argument("--big-model", help="model folder for the big part (gpu_check: 1p5b)")
    p.add_argument("--trl-python", default=sys.executable, help="a python with trl (default: this one)")
    p.add_argument("--parts", default="trl,mentor,big")
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--cpu", action="store_true", help="tiny shapes on the CPU (automatic without CUDA)")
    p.add_argument("--budget-s", type=float, default=400.0, help="start no new run after this many seconds")
    p.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "gpu_step.json"))
    p.add_argument("--logs", help="folder for each run's log (default: beside --out)")
    args = p.parse_args(argv)
    import torch

    cpu = args.cpu or not torch.cuda.is_available()
    device = "cpu" if cpu else "cuda"
    steps = 2 if cpu else args.steps
    new_tokens = 16 if cpu else 128
    small = [f"rollout.max_new_tokens={new_tokens}"]
    parts = set(args.parts.split(","))
    logs = Path(args.logs or Path(args.out).parent / "gpu_step_logs")
    logs.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    left = lambda: args.budget_s - (time.time() - t0)
    plan = []
    if "trl" in parts:
        plan += [("ours", lambda t: run_ours("ours", args.model, device, steps, small, t, logs)),
                 ("trl", lambda t: run_trl("trl", args.model, device, steps, new_tokens, args.trl_python, t, logs))]
        if not cpu:  # the CPU's checkpointing choice is the same code path; a GPU's decides the memory figure
            plan.append(("ours_gc", lambda t: run_ours("ours_gc", args.model, device, steps, [*small, *GC_ON], t,
                                                       logs)))
    if "mentor" in parts:
        if "trl" not in parts:
            plan.append(("ours", lambda t: run_ours("ours", args.model, device, steps, small, t, logs)))
        plan.append(("mentor", lambda t: run_ours("mentor", args.model, device, steps, [*small, *MENTOR], t, logs)))
    if "big" in parts and args.big_model:
        plan.append(("big", lambda t: run_big(args.big_model, device, cpu, t, logs)))
    results = []
    for name, fn in plan:
        if left() < 20:
            results.append({"name": name, "error": "skipped: time budget"})
            continue
        try:
            results.append(fn(left()))
        except subprocess.TimeoutExpired:
            results.append({"name": name, "error": "timed out (time budget)"})
    for r in results:
        if r["name"] == "trl" and "error" not in r and not r.get("prompts_match", True):
            r["error"] = "TRL generated from other prompts than ours"
    ratios = compare(results)
    print(table(results))
    print("ratios: " + ", ".join(f"{k} {v:.2f}x" for k, v in ratios.items()))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"device": device, "steps": steps, "results": results, "ratios": ratios,
                                          "wall_s": time.time() - t0}, indent=1, default=str))
    return 1 if any("error" in r for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
