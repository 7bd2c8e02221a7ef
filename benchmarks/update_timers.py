#!/usr/bin/env python
"""Where a MENTOR update's time goes: wall-clock timers around the updater's calls, step by step.

    .venv/bin/python benchmarks/update_timers.py --start runs/collapseCut/seed0/warmup/checkpoints/step_000004/policy

Runs the MENTOR arm of `collapse.py` as README's run I configures it (level 7, async, `replace`,
level-2 hints, 2 groups x 2 re-rolls, `reroll_horizon=1`, distillation `--distill`) for `--steps`
steps from `--start`, and prints per step the update time and the seconds spent in the GRPO
micro-steps, the distillation term and the optimizer step.
"""

from __future__ import annotations

import argparse
import collections
import tempfile
import time

from mentor_fast.config import load_config
from mentor_fast.trainer import Trainer


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--start", required=True, help="policy folder to start from (an HF checkpoint)")
    p.add_argument("--distill", type=float, default=1.0, help="mentor.distill_coef")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--level", type=int, default=7)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as out:
        cfg = load_config([], [
            f"output_dir={out}", "seed=0", "rollout.prompts_per_step=4", "rollout.num_generations=8",
            "rollout.max_new_tokens=96", "optim.lr=2e-5", "trainer.tensorboard=false", "trainer.threads=2",
            "trainer.save_every=0", "loss.impl=fused", "optim.step_without_signal=false",
            "mentor.enable=true", "mentor.backend=reference", "mentor.async=true", "mentor.start_level=2",
            "mentor.max_rounds=1", "mentor.rerolls=2", "mentor.loss_mode=replace",
            f"mentor.distill_coef={args.distill}", "mentor.reroll_horizon=1", "mentor.max_groups_frac=0.5",
            "mentor.surge_groups_frac=0.5", f"model.path={args.start}", f"data.levels=[{args.level}]",
            f"trainer.max_steps={args.steps}",
        ])
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
