#!/usr/bin/env python
"""Where a training step's generation time goes, call by call (HF engine).

    .venv/bin/python benchmarks/decode_trace.py --variant mentor_async_fp32 --steps 5 [key=value ...]

Runs `--steps` training steps of one `mentor-fast bench` variant (its settings plus the overrides)
and prints, for every decode chunk: rows (initial / re-roll), decode steps, row-steps (the sum of
live rows over the steps), the steps that ran with at most 8 live rows (the tail, where a step
costs about as much as a full one: the weights are read either way), the completion lengths of
each kind of row, and the chunk's time. A merged MENTOR call decodes until its longest row ends,
so a few long re-rolls can keep it going long after the initial rows are done.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

from mentor_fast.bench import BASE, VARIANTS
from mentor_fast.config import load_config
from mentor_fast.rollout import hf
from mentor_fast.trainer import Trainer

TAIL_ROWS = 8


def _lengths(xs: list[int]) -> str:
    return f"{statistics.median(xs):.0f}, {max(xs)}" if xs else "-"


def traced_decode(records: list[dict]):
    """Wraps HFEngine._decode_chunk: one record per chunk."""
    plain = hf.HFEngine._decode_chunk

    def decode(self, chunk, params):
        model, live = self._model, []
        forward = model.forward

        def counting_forward(*args, **kwargs):
            if kwargs["input_ids"].shape[1] == 1:
                live.append(kwargs["input_ids"].shape[0])
            return forward(*args, **kwargs)

        model.forward = counting_forward
        start = time.perf_counter()
        try:
            out = plain(self, chunk, params)
        finally:
            del model.forward  # the instance attribute goes; the class's forward is back
        lens = {0: [], 1: []}
        for ((request, _), _, _), sample in zip(chunk, out):
            lens[min(request, 1)].append(len(sample.token_ids))
        records.append({"s": time.perf_counter() - start, "live": live, "lens": lens})
        return out

    return decode


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--variant", default="mentor_async_fp32", choices=list(VARIANTS))
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("overrides", nargs="*", help="key=value overrides on top of the variant's")
    args = p.parse_args()
    records: list[dict] = []
    hf.HFEngine._decode_chunk = traced_decode(records)
    print("| step | gen s | chunk s | rows (initial + re-roll) | decode steps | row-steps "
          f"| steps with <= {TAIL_ROWS} live | initial lengths (median, max) | re-roll lengths (median, max) |")
    print("|---|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory(prefix="mf-trace-") as tmp:
        overrides = BASE + VARIANTS[args.variant] + args.overrides + [
            f"output_dir={tmp}", f"trainer.max_steps={args.steps}"]
        trainer = Trainer(load_config([], overrides))
        try:
            for step in range(1, args.steps + 1):
                records.clear()
                row = trainer.step(step)
                for r in records:
                    init, rer = r["lens"][0], r["lens"][1]
                    print(f"| {step} | {row['timing_s/gen']:.1f} | {r['s']:.1f} | {len(init)} + {len(rer)} "
                          f"| {len(r['live'])} | {sum(r['live'])} | {sum(x <= TAIL_ROWS for x in r['live'])} "
                          f"| {_lengths(init)} | {_lengths(rer)} |", flush=True)
        finally:
            trainer.close()


if __name__ == "__main__":
    main()
