#!/usr/bin/env python
"""Where a MENTOR update's time goes: wall-clock timers around the updater's calls, step by step.

    .venv/bin/python benchmarks/update_timers.py --start runs/collapseShared/seed0/warmup/checkpoints/step_000004/policy

Runs the MENTOR arm of `collapse.py` (its post-jump configuration, built by the same function) for
`--steps` steps from `--start`, and prints per step the update time and the seconds spent in the
GRPO micro-steps, the distillation term and the optimizer step. Any other flag is collapse.py's:
README's run I, for instance, is `--mentor-budget extra --mentor-set mentor.max_groups_frac=0.5
mentor.surge_groups_frac=0.5`.
"""

from __future__ import annotations

import argparse
import collections
import tempfile
import time
from pathlib import Path

from collapse import arm_overrides, build_parser  # benchmarks/ is sys.path[0] when run as a script

from mentor_fast.config import load_config
from mentor_fast.trainer import Trainer


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--start", required=True, help="policy folder to start from (an HF checkpoint)")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--seed", type=int, default=0)
    args, rest = p.parse_known_args()
    with tempfile.TemporaryDirectory() as out:
        exp = build_parser().parse_args(["--out", out, *rest])
        cfg = load_config([], arm_overrides(exp, "mentor", Path(out), args.seed, args.start) + [
            "trainer.save_every=0", f"trainer.max_steps={args.steps}"])
        trainer = Trainer(cfg)
        spent: dict[str, float] = collections.defaultdict(float)
        updater = trainer.updater
        for name in ("_micro_step", "_distill", "_optimizer_step"):
            setattr(updater, name, _timed(spent, name.strip("_"), getattr(updater, name)))
        try:
            for step in range(1, args.steps + 1):
                before = dict(spent)
                row = trainer.step(step)
                parts = {k: round(v - before.get(k, 0.0), 2) for k, v in spent.items() if v - before.get(k, 0.0)}
                print(f"step {step}: update {row.get('timing_s/update', 0.0):.2f} s, "
                      f"{row['batch/sequences']:.0f} sequences, {parts}", flush=True)
        finally:
            trainer.close()


def _timed(spent: dict[str, float], name: str, fn):
    def wrapper(*a, **k):
        t0 = time.perf_counter()
        try:
            return fn(*a, **k)
        finally:
            spent[name] += time.perf_counter() - t0
    return wrapper


if __name__ == "__main__":
    main()
