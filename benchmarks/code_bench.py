#!/usr/bin/env python
"""The code reward's costs: today's two processes against the single sandboxed process before them,
measured in the same run, alternating.

    .venv/bin/python benchmarks/code_bench.py [--rounds 30] [--he-rounds 3] [--before 9201d24]
                                              [--out benchmarks/results/code_cpu.jsonl]

- start cost: one program at a time, `pass` with tests `pass`, in rotating rounds of four: a bare
  `python3 -c pass`, the interpreter's floor `python3 -I -S -c pass`, the sandbox before the
  checker existed (program and tests in one sandboxed process; its sandbox.py read from git at
  --before) and today's path (the sandboxed program, and a checker forked by the zygote); medians.
  The target: today's at most 1.5x the one before.
- humaneval: the 164 canonical solutions and the 164 `return None` stubs, one per core, the path
  before and today's (the prompt as the checker's setup) alternating, --he-rounds rounds of each;
  median programs/s. Every canonical solution must pass, no stub. Today's path also counts the
  tests that needed the program's objects (needs_objects), the programs whose calls changed an
  argument in place, and the calls.
- ladder: every code-ladder level's references and `return None` stubs through today's path (the
  repo's MBPP-style data: plain asserts), with the same counts.
- reward step: the code verifier's `check` on 4 ladder problems x 8 completions (the references,
  wrong programs, a syntax error, a program with no code and an infinite loop that hits the
  timeout), timed as the trainer's reward stage would see it.

The machine may be shared: each row records the load average before and after, and every figure
that matters is a ratio of interleaved measurements.
"""

from __future__ import annotations

import argparse
import collections
import importlib.util
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from mentor_fast.bench import versions
from mentor_fast.config import CodeRewardConfig, DataConfig
from mentor_fast.data.code_ladder import LEVELS, CodeLadder
from mentor_fast.data.code_sources import humaneval_problems
from mentor_fast.rewards.code import CodeVerifier, classify, run_tests
from mentor_fast.rewards.judge import judge
from mentor_fast.rewards.program import assemble_program
from mentor_fast.rewards.sandbox import Limits

ROOT = Path(__file__).resolve().parents[1]


def load_before(rev: str):
    """rewards/sandbox.py as it was at `rev`: program and tests ran in one sandboxed process."""
    source = subprocess.run(["git", "-C", str(ROOT), "show", f"{rev}:mentor_fast/rewards/sandbox.py"],
                            check=True, capture_output=True, text=True).stdout
    spec = importlib.util.spec_from_loader("sandbox_before", loader=None)
    module = importlib.util.module_from_spec(spec)
    sys.modules["sandbox_before"] = module
    exec(compile(source, f"{rev}:mentor_fast/rewards/sandbox.py", "exec"), module.__dict__)  # noqa: S102
    return module


def start_cost(before, rounds: int) -> dict:
    commands = {"bare": [sys.executable, "-c", "pass"], "floor": [sys.executable, "-I", "-S", "-c", "pass"]}
    run_tests("pass", "pass", timeout_s=10.0)  # the zygote's own start, once per trainer, is not a program's
    times: dict[str, list[float]] = {"bare": [], "floor": [], "before": [], "today": []}
    order = list(times)
    for i in range(rounds):
        for which in order[i % 4:] + order[:i % 4]:
            t0 = time.perf_counter()
            if which == "before":
                r = before.run_python("pass", "pass", 10.0)
                assert r.report and r.report.get("passed"), r
            elif which == "today":
                assert run_tests("pass", "pass", timeout_s=10.0).passed
            else:
                subprocess.run(commands[which], check=True)
            times[which].append(time.perf_counter() - t0)
    med = {k: statistics.median(v) for k, v in times.items()}
    return {"rounds": rounds, **{f"{k}_median_s": v for k, v in med.items()},
            "ratio_today_vs_before": med["today"] / med["before"], "ratio_today_vs_bare": med["today"] / med["bare"],
            "target_ratio_today_vs_before": 1.5}


def _today(jobs: list[tuple[str, str, str, str]], workers: int) -> list:
    def one(job):
        run = judge(job[0], job[1], 20.0, Limits(), entry_point=job[2], setup=job[3])
        return classify(run), run.verdict or {}

    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(one, jobs))


def _before(before, jobs: list[tuple[str, str]], workers: int) -> list[bool]:
    def one(job):
        r = before.run_python(job[0], job[1], 20.0)
        return bool(r.status == "finished" and r.report and r.report.get("passed"))

    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(one, jobs))


def _counts(out: list) -> dict:
    return {"passed": sum(r.passed for r, _ in out), "statuses": dict(collections.Counter(r.status for r, _ in out)),
            "needs_objects": sum(r.status == "needs_objects" for r, _ in out),
            "programs_changing_an_argument": sum(v.get("mutated", 0) > 0 for _, v in out),
            "calls": sum(v.get("calls", 0) for _, v in out)}


def humaneval(before, rounds: int, workers: int) -> dict:
    problems = humaneval_problems()
    stub = [assemble_program("    return None\n", p.code) for p in problems]
    today = {"canonical": [(p.code.solution, p.code.tests, p.code.entry_point, p.code.prompt) for p in problems],
             "return_none": [(s, p.code.tests, p.code.entry_point, p.code.prompt) for s, p in zip(stub, problems)]}
    rates: dict[str, list[float]] = {"before": [], "today": []}
    counts = {}
    for i in range(rounds):
        for which in (("before", "today") if i % 2 == 0 else ("today", "before")):
            t0 = time.perf_counter()
            if which == "before":
                ok = [_before(before, [j[:2] for j in today[k]], workers) for k in today]
                assert sum(ok[0]) == 164 and sum(ok[1]) == 0, (sum(ok[0]), sum(ok[1]))
            else:
                out = {k: _today(jobs, workers) for k, jobs in today.items()}
                counts = {k: _counts(v) for k, v in out.items()}
                assert counts["canonical"]["passed"] == 164 and counts["return_none"]["passed"] == 0, counts
            rates[which].append(2 * len(problems) / (time.perf_counter() - t0))
    med = {k: statistics.median(v) for k, v in rates.items()}
    return {"programs_per_round": 2 * len(problems), "rounds": rounds, "workers": workers,
            "before_programs_per_s": med["before"], "today_programs_per_s": med["today"],
            "cost_ratio_today_vs_before": med["before"] / med["today"], **counts}


def ladder(workers: int, per_level: int) -> dict:
    lad = CodeLadder(DataConfig(source="code_ladder"), seed=0)
    problems = [lad.train_problem(i, level) for level in LEVELS for i in range(per_level)]
    refs = _today([(p.code.solution, p.code.tests, p.code.entry_point, "") for p in problems], workers)
    stubs = _today([(f"def {p.code.entry_point}(*args, **kwargs):\n    return None\n", p.code.tests,
                     p.code.entry_point, "") for p in problems], workers)
    return {"problems": len(problems), "references": _counts(refs), "return_none": _counts(stubs)}


def reward_step(workers: int, timeout_s: float) -> dict:
    problems = CodeLadder(DataConfig(source="code_ladder", levels=[2, 4, 6, 7]), seed=0).batch(0, 4)
    completions, owners = [], []
    for p in problems:
        ref = f"```python\n{p.code.solution}\n```"
        wrong = f"```python\ndef {p.code.entry_point}(*args):\n    return None\n```"
        kinds = [ref, ref, wrong, wrong, "```python\ndef broken(:\n```", "I do not know.",
                 f"```python\ndef {p.code.entry_point}(*args):\n    return args[0]\n```",
                 f"```python\ndef {p.code.entry_point}(*args):\n    while True:\n        pass\n```"]
        completions += kinds
        owners += [p] * len(kinds)
    verifier = CodeVerifier(CodeRewardConfig(timeout_s=timeout_s, workers=workers))
    t0 = time.perf_counter()
    verdicts = verifier.check(completions, owners)
    wall = time.perf_counter() - t0
    return {"completions": len(completions), "wall_s": wall, "timeout_s": timeout_s, "workers": workers,
            "correct": sum(v.correct for v in verdicts), "statuses": verifier.pop_metrics(),
            "isolation": verifier.describe()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--he-rounds", type=int, default=3)
    p.add_argument("--workers", type=int, default=0, help="0: one per core")
    p.add_argument("--timeout", type=float, default=4.0, help="reward step: per-program timeout")
    p.add_argument("--before", default="9201d24", help="the commit whose sandbox ran program and tests together")
    p.add_argument("--out", default="benchmarks/results/code_cpu.jsonl")
    args = p.parse_args()
    workers = args.workers or os.cpu_count() or 1
    before = load_before(args.before)
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, check=False,
                            text=True).stdout.strip()
    unshare = subprocess.run(["unshare", "--version"], capture_output=True, text=True, check=False).stdout.strip()
    row = {"bench": "code_checker", "time": time.strftime("%Y-%m-%dT%H:%M:%S"), "commit": commit,
           "before": args.before, "machine": {**versions(), "kernel": platform.release(), "unshare": unshare},
           "loadavg_start": os.getloadavg()}
    for name, fn in (("start_cost", lambda: start_cost(before, args.rounds)),
                     ("humaneval", lambda: humaneval(before, args.he_rounds, workers)),
                     ("ladder", lambda: ladder(workers, 6)),
                     ("reward_step", lambda: reward_step(args.workers, args.timeout))):
        row[name] = fn()
        print(json.dumps({name: row[name]}), flush=True)
    row["loadavg_end"] = os.getloadavg()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "a") as f:
        f.write(json.dumps(row) + "\n")
    print(f"appended to {args.out}")


if __name__ == "__main__":
    main()
