#!/usr/bin/env python
"""Whether two runs are the same run: their metrics.jsonl step for step (timings aside) and, where
there is one, their mentor.jsonl row for row (latency aside).

    .venv/bin/python experiments/same_run.py RUN_A RUN_B [--keys 5]

RUN_A and RUN_B are trainer run folders (output_dir), e.g. the same arm of two collapse.py runs
(DIR/seed0/mentor). Prints "same run" with the number of steps and mentor rows compared, or the first
step where they part, the metrics that differ there, and per metric the largest difference over the
steps: on a GPU, where bitwise equality does not hold, that is the run-to-run spread
(docs/experiments/reproducibility.md). Exit status 0 when they are the same run, 1 when not.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from arm_results import post_jump_rows

from mentor_fast.metrics import read_metrics
from mentor_fast.trainer import TIMING_PREFIXES


def comparable(row: dict) -> dict:
    """A metrics row without what depends on wall-clock time or the machine's state."""
    return {k: v for k, v in row.items() if not k.startswith(TIMING_PREFIXES)}


def metric_rows(run: Path) -> list[dict]:
    """The run's rows, the last of each step (a resumed run appends to the file)."""
    rows = read_metrics(run / "metrics.jsonl")
    return post_jump_rows(rows, max((r["step"] for r in rows), default=0))


def mentor_rows(run: Path) -> list[dict] | None:
    """The run's mentor.jsonl rows, the last of each (step, group), without their latency."""
    path = run / "mentor.jsonl"
    if not path.exists():
        return None
    last: dict = {}  # a resumed run writes again the rows of the steps after its checkpoint: the last count
    for line in path.read_text().splitlines():
        if line.strip():
            r = json.loads(line)
            last[(r["step"], r["group_id"])] = {k: v for k, v in r.items() if k != "latency_s"}
    return list(last.values())


def differing(a: dict, b: dict) -> list[str]:
    return sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))


def compare_rows(rows_a: list[dict], rows_b: list[dict]) -> dict:
    """Two runs' metrics rows, step by step, timings aside: {"steps": n, "first_step": step or None,
    "first_keys": [...], "max_abs_diff": {metric: largest |a - b| over the common steps}}."""
    out: dict = {"steps": min(len(rows_a), len(rows_b)), "first_step": None, "first_keys": [], "max_abs_diff": {}}
    if [r["step"] for r in rows_a] != [r["step"] for r in rows_b]:
        out["first_keys"] = ["step"]
    for x, y in zip(rows_a, rows_b):
        x, y = comparable(x), comparable(y)
        keys = differing(x, y)
        if keys and out["first_step"] is None:
            out["first_step"], out["first_keys"] = x["step"], keys
        for k in keys:
            if isinstance(x.get(k), (int, float)) and isinstance(y.get(k), (int, float)):
                out["max_abs_diff"][k] = max(out["max_abs_diff"].get(k, 0.0), abs(x[k] - y[k]))
    return out


def compare(run_a: Path, run_b: Path) -> dict:
    """`compare_rows` of the two run folders' metrics, and {"mentor_rows": n or None, "mentor_same": bool,
    "same": bool}."""
    out = compare_rows(metric_rows(run_a), metric_rows(run_b))
    hints_a, hints_b = mentor_rows(run_a), mentor_rows(run_b)
    out["mentor_rows"] = None if hints_a is None else len(hints_a)
    out["mentor_same"] = hints_a == hints_b
    out["same"] = out["first_step"] is None and not out["first_keys"] and out["mentor_same"]
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run_a", type=Path)
    p.add_argument("run_b", type=Path)
    p.add_argument("--keys", type=int, default=8, help="how many differing metrics to list")
    args = p.parse_args(argv)
    r = compare(args.run_a, args.run_b)
    hints = "" if r["mentor_rows"] is None else f", {r['mentor_rows']} mentor.jsonl rows"
    if r["same"]:
        print(f"same run: {r['steps']} steps{hints}, every metric equal (timings aside)")
        return 0
    if r["first_step"] is not None:
        print(f"the runs part at step {r['first_step']}: {', '.join(r['first_keys'][:args.keys])}")
    elif r["first_keys"]:
        print("the runs logged different steps")
    if not r["mentor_same"]:
        print("mentor.jsonl differs")
    spread = sorted(r["max_abs_diff"].items(), key=lambda kv: -kv[1])[:args.keys]
    for k, d in spread:
        print(f"  max |a - b| over the steps  {k}: {d:.6g}")
    return 1


if __name__ == "__main__":
    sys.exit(main())
