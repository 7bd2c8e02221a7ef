#!/usr/bin/env python
"""The mismatch correction's cost in the fused head: grpo_loss forward + backward without the
sampler's log-probs, and with them in each loss.is_mode, at the kernel benchmark's shape.

    .venv/bin/python benchmarks/is_overhead.py [--rounds 15] [--threads 2]
                                               [--out benchmarks/results/is_overhead_cpu.jsonl]

Shape N=2048 tokens in 8 sequences, H=576, V=49,152 (SmolLM2-135M's head), fp32, the CPU's
chunked path. Each round runs every variant once, in a rotating order, so a shared machine's load
falls on all of them; a variant's overhead is median(variant) / median(without) - 1. The sampler's
log-probs are the old ones moved by up to 0.3 nats a token, so the weights are not all 1 and the
mask modes drop some tokens. A second run without them ("without_again") is the A/A control:
its distance from "without" is the noise the A/B figures sit in. The correction's own work, the
weights from the two log-probs (kernels/mismatch.py) and their product with the method's, is also
timed alone over many repeats and reported as a share of the fused step ("direct"): that figure
does not drown in the step's noise. The target: at most 2% for every mode.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from kernel_peak_mem import make_inputs
from mentor_fast.kernels import GRPOOptions, grpo_loss
from mentor_fast.kernels.mismatch import mismatch_weights

from mentor_fast.bench import versions

MODES = ["token_truncate", "token_mask", "sequence_truncate", "sequence_mask"]


def step(x: dict, options: GRPOOptions, sampler: torch.Tensor | None) -> float:
    h = x["hidden"].detach().requires_grad_()
    w = x["weight"].detach().requires_grad_()
    t0 = time.perf_counter()
    out = grpo_loss(h, w, x["targets"], x["old_logp"], x["advantages"], x["token_weights"],
                    seq_ids=x["seq_ids"], sampler_logp=sampler, options=options)
    out.loss.backward()
    return time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--n", type=int, default=2048)
    p.add_argument("--h", type=int, default=576)
    p.add_argument("--v", type=int, default=49152)
    p.add_argument("--out", type=Path, default=HERE / "results" / "is_overhead_cpu.jsonl")
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    x = make_inputs(a.n, a.h, a.v)
    g = torch.Generator().manual_seed(1)
    sampler = x["old_logp"] + (torch.rand(a.n, generator=g) - 0.5) * 0.6
    variants = {"without": (GRPOOptions(), None), "without_again": (GRPOOptions(), None)}
    variants |= {mode: (GRPOOptions(is_mode=mode, is_floor=0.5), sampler) for mode in MODES}
    for opts, s in variants.values():  # warm-up: allocator, thread pool
        step(x, opts, s)
    times: dict[str, list[float]] = {k: [] for k in variants}
    load_before = os.getloadavg()[0]
    names = list(variants)
    for r in range(a.rounds):
        for k in names[r % len(names):] + names[:r % len(names)]:
            times[k].append(step(x, *variants[k]))
    med = {k: statistics.median(v) for k, v in times.items()}
    direct = {}
    for mode in MODES:  # the correction's own ops, alone
        reps = 200
        t0 = time.perf_counter()
        for _ in range(reps):
            mismatch_weights(x["old_logp"], sampler, mode, 2.0, 0.5, x["seq_ids"]) * x["token_weights"]
        direct[mode] = (time.perf_counter() - t0) / reps / med["without"]
    row = {"bench": "is_overhead", "n": a.n, "h": a.h, "v": a.v, "rounds": a.rounds, "threads": a.threads,
           "median_s": {k: round(v, 4) for k, v in med.items()},
           "overhead": {k: round(med[k] / med["without"] - 1, 4) for k in [*MODES, "without_again"]},
           "direct": {k: float(f"{v:.3g}") for k, v in direct.items()},
           "load_avg_1m": [round(load_before, 2), round(os.getloadavg()[0], 2)], **versions()}
    for k in names:
        extra = f"{row['overhead'][k]:+.2%}" if k != "without" else ""
        if k in direct:
            extra += f"   direct {direct[k]:.4%}"
        print(f"{k:18s} {med[k] * 1e3:8.1f} ms  {extra}")
    a.out.parent.mkdir(parents=True, exist_ok=True)
    with a.out.open("a") as f:
        f.write(json.dumps(row) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
