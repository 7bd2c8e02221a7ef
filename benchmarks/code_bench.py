#!/usr/bin/env python
"""The code sandbox's costs: HumanEval programs per second, the cost of one sandboxed start against
a bare interpreter start, and a training step's reward time for 4 x 8 code completions.

    .venv/bin/python benchmarks/code_bench.py [--pairs 20] [--out benchmarks/results/code_cpu.jsonl]

- humaneval: all 164 canonical solutions with their tests through `run_many` (one per core), wall
  time of the batch -> programs/s; every one must pass.
- start cost: a sandboxed `pass` with tests `pass` (namespaces, read-only remounts, uid drop,
  rlimits, the verdict pipe) against a bare `python3 -c pass` (the target: at most 1.3x) and
  against the interpreter's floor `python3 -I -S -c pass`, in rotating rounds; medians.
- reward step: the code verifier's `check` on 4 ladder problems x 8 completions (the references,
  wrong programs, a syntax error, a program with no code and an infinite loop that hits the
  timeout), timed as the trainer's reward stage would see it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

from mentor_fast.bench import versions
from mentor_fast.config import CodeRewardConfig, DataConfig
from mentor_fast.data.code_ladder import CodeLadder
from mentor_fast.data.code_sources import humaneval_problems
from mentor_fast.rewards.code import CodeVerifier, run_many, run_tests
from mentor_fast.rewards.program import assemble_program


def humaneval_rate(workers: int) -> dict:
    problems = humaneval_problems()
    jobs = [(p.code.reference, p.code.tests) for p in problems]
    t0 = time.perf_counter()
    results = run_many(jobs, timeout_s=20.0, workers=workers)
    wall = time.perf_counter() - t0
    failed = [p.id for p, r in zip(problems, results, strict=True) if not r.passed]
    return {"programs": len(jobs), "passed": len(jobs) - len(failed), "failed": failed, "wall_s": wall,
            "programs_per_s": len(jobs) / wall, "workers": workers}


def start_cost(pairs: int) -> dict:
    """Medians over alternating triples: a bare `python3 -c pass` (the issue's baseline: site and
    the user's environment), the interpreter's floor (`-I -S`, no site, as the sandbox starts it)
    and a sandboxed `pass` with tests `pass`."""
    commands = {"bare": [sys.executable, "-c", "pass"], "floor": [sys.executable, "-I", "-S", "-c", "pass"]}
    times: dict[str, list[float]] = {"bare": [], "floor": [], "sandbox": []}
    order = list(times)
    for i in range(pairs):
        for which in order[i % 3:] + order[:i % 3]:  # rotate the order
            t0 = time.perf_counter()
            if which == "sandbox":
                r = run_tests("pass", "pass", timeout_s=10.0)
                assert r.passed, r
            else:
                subprocess.run(commands[which], check=True)
            times[which].append(time.perf_counter() - t0)
    med = {k: statistics.median(v) for k, v in times.items()}
    return {"rounds": pairs, **{f"{k}_median_s": v for k, v in med.items()},
            "ratio_vs_bare": med["sandbox"] / med["bare"], "ratio_vs_floor": med["sandbox"] / med["floor"],
            "target_ratio_vs_bare": 1.3}


def reward_step(workers: int, timeout_s: float) -> dict:
    problems = CodeLadder(DataConfig(source="code_ladder", levels=[2, 4, 6, 7]), seed=0).batch(0, 4)
    completions, owners = [], []
    for p in problems:
        ref = f"```python\n{p.code.reference}\n```"
        wrong = f"```python\ndef {p.code.entry_point}(*args):\n    return None\n```"
        kinds = [ref, ref, wrong, wrong, "```python\ndef broken(:\n```", "I do not know.",
                 f"```python\ndef {p.code.entry_point}(*args):\n    return args[0]\n```",
                 f"```python\ndef {p.code.entry_point}(*args):\n    while True:\n        pass\n```"]
        completions += kinds
        owners += [p] * len(kinds)
    assert all(assemble_program(c, p.code) is not None for c, p in zip(completions, owners) if "```" in c)
    verifier = CodeVerifier(CodeRewardConfig(timeout_s=timeout_s, workers=workers))
    t0 = time.perf_counter()
    verdicts = verifier.check(completions, owners)
    wall = time.perf_counter() - t0
    return {"completions": len(completions), "wall_s": wall, "timeout_s": timeout_s, "workers": workers,
            "correct": sum(v.correct for v in verdicts), "statuses": verifier.pop_metrics(),
            "isolation": verifier.describe()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pairs", type=int, default=20)
    p.add_argument("--workers", type=int, default=0, help="0: one per core")
    p.add_argument("--timeout", type=float, default=4.0, help="reward step: per-program timeout")
    p.add_argument("--out", default="benchmarks/results/code_cpu.jsonl")
    args = p.parse_args()
    row = {"bench": "code_sandbox", "time": time.strftime("%Y-%m-%dT%H:%M:%S"), "machine": versions()}
    row["start_cost"] = start_cost(args.pairs)
    print(json.dumps({"start_cost": row["start_cost"]}), flush=True)
    row["humaneval"] = humaneval_rate(args.workers)
    print(json.dumps({"humaneval": {k: v for k, v in row["humaneval"].items() if k != "failed"}}), flush=True)
    row["reward_step"] = reward_step(args.workers, args.timeout)
    print(json.dumps({"reward_step": row["reward_step"]}), flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "a") as f:
        f.write(json.dumps(row) + "\n")
    print(f"appended to {args.out}")


if __name__ == "__main__":
    main()
