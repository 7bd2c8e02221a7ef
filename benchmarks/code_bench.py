#!/usr/bin/env python
"""The code reward's costs: this checkout's sandbox and checker against a base checkout's, measured in
the same run, alternating.

    git worktree add /tmp/base 53203c9      # the checkout to compare against (any commit with run_tests)
    .venv/bin/python benchmarks/code_bench.py --base /tmp/base [--rounds 30] [--he-rounds 3]
                                              [--out benchmarks/results/code_cpu.jsonl]

Both sides run in worker subprocesses of the same shape (this file's WORKER, importing mentor_fast
from its checkout), so neither pays for the other's imports, and the rounds alternate which goes
first.

- start cost: one program at a time, `pass` with tests `pass`, today's and the base's in rotating
  rounds with a bare `python3 -c pass` and the interpreter's floor `python3 -I -S -c pass`; medians.
  The target: today's at most 1.3x the base's.
- calls: one program answering 300 calls on a 100-item list (the channel's cost per call).
- humaneval: the 164 canonical solutions and the 164 `return None` stubs (the prompt as the
  checker's setup), one per core; median programs/s. Every canonical solution must pass, no stub.
- humaneval detail: the same programs through today's path, with the statuses, the calls, and the
  programs whose calls changed an argument in place (it comes back changed).
- ladder: every code-ladder level's references and `return None` stubs through today's path (the
  repo's MBPP-style data: plain asserts), with their statuses.
- reward step: the code verifier's `check` on 4 ladder problems x 8 completions (the references,
  wrong programs, a syntax error, a program with no code and an infinite loop that hits the
  timeout), timed as the trainer's reward stage would see it.

The machine may be shared: each row records the load average before and after, and every figure
that matters is a ratio of interleaved measurements.
"""

from __future__ import annotations

import argparse
import collections
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
from mentor_fast.rewards.code import CodeVerifier, Job, classify, run_many
from mentor_fast.rewards.judge import judge
from mentor_fast.rewards.program import assemble_program
from mentor_fast.rewards.sandbox import Limits

ROOT = Path(__file__).resolve().parents[1]
CALLS = "xs = list(range(100))\nfor _ in range(300):\n    assert f(xs) == 4950\n"

# One side of the comparison: mentor_fast imported from the checkout in argv[1]; a JSON command per
# line on stdin, its timing and counts per line on stdout.
WORKER = r'''
import json, sys, time
sys.path.insert(0, sys.argv[1])
from mentor_fast.rewards.code import Job, run_many, run_tests
from mentor_fast.data.code_sources import humaneval_problems
from mentor_fast.rewards.program import assemble_program
run_tests("pass", "pass", 10.0)  # the checker's zygote starts once per trainer, not per program
problems = humaneval_problems()
jobs = [Job(p.code.solution, p.code.tests, p.code.entry_point, p.code.prompt) for p in problems]
jobs += [Job(assemble_program("    return None\n", p.code), p.code.tests, p.code.entry_point, p.code.prompt)
         for p in problems]
for line in sys.stdin:
    cmd = json.loads(line)
    t0 = time.perf_counter()
    if cmd["op"] == "humaneval":
        results = run_many(jobs, 20.0, workers=cmd["workers"])
        out = {"canonical": sum(r.passed for r in results[:164]), "return_none": sum(r.passed for r in results[164:])}
    else:
        r = run_tests(cmd["program"], cmd["tests"], 20.0)
        out = {"passed": r.passed, "status": r.status}
    print(json.dumps({**out, "s": time.perf_counter() - t0}), flush=True)
'''


class Side:
    """A worker subprocess for one checkout."""

    def __init__(self, checkout: Path):
        self.proc = subprocess.Popen([sys.executable, "-c", WORKER, str(checkout)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, cwd=checkout)

    def ask(self, **cmd) -> dict:
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait()


def _alternate(sides: dict[str, Side], rounds: int, measure) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {k: [] for k in sides}
    order = list(sides)
    for i in range(rounds):
        for which in order[i % len(order):] + order[:i % len(order)]:
            times[which].append(measure(which, sides[which]))
    return times


def start_cost(sides: dict[str, Side], rounds: int) -> dict:
    commands = {"bare": [sys.executable, "-c", "pass"], "floor": [sys.executable, "-I", "-S", "-c", "pass"]}

    def measure(which, side):
        if side is None:
            t0 = time.perf_counter()
            subprocess.run(commands[which], check=True)
            return time.perf_counter() - t0
        out = side.ask(op="run", program="pass", tests="pass")
        assert out["passed"], (which, out)
        return out["s"]

    med = {k: statistics.median(v) for k, v in _alternate({**sides, "bare": None, "floor": None}, rounds,
                                                           measure).items()}
    row = {"rounds": rounds, **{f"{k}_median_s": v for k, v in med.items()}, "target_ratio_today_vs_base": 1.3}
    if "base" in med:
        row["ratio_today_vs_base"] = med["today"] / med["base"]
    return row


def calls_cost(sides: dict[str, Side], rounds: int) -> dict:
    program = "def f(xs):\n    return sum(xs)\n"

    def measure(which, side):
        out = side.ask(op="run", program=program, tests=CALLS)
        assert out["passed"], (which, out)
        return out["s"]

    med = {k: statistics.median(v) for k, v in _alternate(sides, rounds, measure).items()}
    row = {"calls_per_program": 300, **{f"{k}_median_s": v for k, v in med.items()}}
    if "base" in med:
        row["ratio_today_vs_base"] = med["today"] / med["base"]
    return row


def humaneval(sides: dict[str, Side], rounds: int, workers: int) -> dict:
    def measure(which, side):
        out = side.ask(op="humaneval", workers=workers)
        assert (out["canonical"], out["return_none"]) == (164, 0), (which, out)
        return out["s"]

    rates = {k: [328 / s for s in v] for k, v in _alternate(sides, rounds, measure).items()}
    med = {k: statistics.median(v) for k, v in rates.items()}
    row = {"programs_per_round": 328, "rounds": rounds, "workers": workers, "canonical_passed": 164,
           "return_none_passed": 0, **{f"{k}_programs_per_s": v for k, v in med.items()}}
    if "base" in med:
        row["cost_ratio_today_vs_base"] = med["base"] / med["today"]
    return row


def _statuses(results: list) -> dict:
    return {"passed": sum(r.passed for r in results), "statuses": dict(collections.Counter(r.status for r in results))}


def humaneval_detail(workers: int) -> dict:
    """Today's path on HumanEval with the checker's own counts: calls, and the programs whose calls
    changed a container they were given (what comes back changed)."""
    problems = humaneval_problems()
    stub = [assemble_program("    return None\n", p.code) for p in problems]
    out = {}
    for name, programs in (("canonical", [p.code.solution for p in problems]), ("return_none", stub)):
        def one(args):
            run = judge(args[0], args[1].code.tests, 20.0, Limits(), entry_point=args[1].code.entry_point,
                        setup=args[1].code.prompt)
            return classify(run), run.verdict or {}

        with ThreadPoolExecutor(max_workers=workers) as pool:
            done = list(pool.map(one, zip(programs, problems, strict=True)))
        out[name] = {**_statuses([r for r, _ in done]), "calls": sum(v.get("calls", 0) for _, v in done),
                     "programs_whose_calls_changed_an_argument": [p.id for p, (_, v) in zip(problems, done, strict=True)
                                                                  if v.get("synced", 0)]}
    return out


def ladder(workers: int, per_level: int) -> dict:
    lad = CodeLadder(DataConfig(source="code_ladder"), seed=0)
    problems = [lad.train_problem(i, level) for level in LEVELS for i in range(per_level)]
    refs = run_many([Job(p.code.solution, p.code.tests, p.code.entry_point) for p in problems], 20.0, workers=workers)
    stubs = run_many([Job(f"def {p.code.entry_point}(*args, **kwargs):\n    return None\n", p.code.tests,
                          p.code.entry_point) for p in problems], 20.0, workers=workers)
    return {"problems": len(problems), "references": _statuses(refs), "return_none": _statuses(stubs)}


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
    p.add_argument("--base", type=Path, help="a checkout to compare against (e.g. a git worktree of an older commit)")
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--he-rounds", type=int, default=3)
    p.add_argument("--workers", type=int, default=0, help="0: one per core")
    p.add_argument("--timeout", type=float, default=4.0, help="reward step: per-program timeout")
    p.add_argument("--out", default="benchmarks/results/code_cpu.jsonl")
    args = p.parse_args()
    workers = args.workers or os.cpu_count() or 1
    git = ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"]
    commit = subprocess.run(git, capture_output=True, check=False, text=True).stdout.strip()
    base = (subprocess.run(["git", "-C", str(args.base), "rev-parse", "--short", "HEAD"], capture_output=True,
                           check=False, text=True).stdout.strip() if args.base else None)
    unshare = subprocess.run(["unshare", "--version"], capture_output=True, text=True, check=False).stdout.strip()
    row = {"bench": "code_checker", "time": time.strftime("%Y-%m-%dT%H:%M:%S"), "commit": commit, "base": base,
           "machine": {**versions(), "kernel": platform.release(), "unshare": unshare},
           "loadavg_start": os.getloadavg()}
    sides = {"today": Side(ROOT), **({"base": Side(args.base)} if args.base else {})}
    try:
        for name, fn in (("start_cost", lambda: start_cost(sides, args.rounds)),
                         ("calls", lambda: calls_cost(sides, max(3, args.rounds // 3))),
                         ("humaneval", lambda: humaneval(sides, args.he_rounds, workers)),
                         ("humaneval_detail", lambda: humaneval_detail(workers)),
                         ("ladder", lambda: ladder(workers, 6)),
                         ("reward_step", lambda: reward_step(args.workers, args.timeout))):
            row[name] = fn()
            print(json.dumps({name: row[name]}), flush=True)
    finally:
        for side in sides.values():
            side.close()
    row["loadavg_end"] = os.getloadavg()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "a") as f:
        f.write(json.dumps(row) + "\n")
    print(f"appended to {args.out}")


if __name__ == "__main__":
    main()
