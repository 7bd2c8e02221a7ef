#!/usr/bin/env python
"""What this CPU gives a training step: fp32 vs bf16 GEMM throughput and streaming bandwidth.

    .venv/bin/python benchmarks/cpu_gemm.py [--threads 2]

Two facts decide the CPU settings: whether bf16 pays (it does only with native bf16 instructions,
AVX-512-BF16 or AMX; elsewhere torch converts and bf16 runs several times slower than fp32), and
the memory bandwidth, which bounds decoding (every decode step streams all weights once). Shapes
are SmolLM2-135M's MLP (576 -> 1536): M = 2048 rows is the update, M = 32 a decode step whose
weights come from DRAM (120 distinct matrices, 424 MB in fp32).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch


def _rate(fn, min_s: float = 1.0) -> float:
    """Seconds per call: warm up, then repeat for at least min_s."""
    for _ in range(2):
        fn()
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < min_s:
        fn()
        n += 1
    return (time.perf_counter() - t0) / n


def cpu_flags() -> list[str]:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return sorted(f for f in line.split(":", 1)[1].split() if f.startswith(("avx", "amx", "fma")))
    except OSError:
        pass
    return []


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    rows = {"torch": torch.__version__, "threads": args.threads, "flags": cpu_flags()}
    x, w = torch.randn(2048, 576), torch.randn(1536, 576)
    flops = 2 * 2048 * 576 * 1536
    rows["gemm_fp32_gflops"] = flops / _rate(lambda: x @ w.t()) / 1e9
    xb, wb = x.bfloat16(), w.bfloat16()
    rows["gemm_bf16_gflops"] = flops / _rate(lambda: xb @ wb.t()) / 1e9
    big = [torch.randn(1536, 576) for _ in range(120)]
    x32 = torch.randn(32, 576)

    def decode_like():
        for m in big:
            x32 @ m.t()

    dt = _rate(decode_like)
    rows["decode_m32_gflops"] = 2 * 32 * 576 * 1536 * len(big) / dt / 1e9
    rows["decode_m32_weight_gb_per_s"] = sum(m.numel() * 4 for m in big) / dt / 1e9
    a = torch.ones(100_000_000)
    rows["stream_gb_per_s"] = a.numel() * 4 / _rate(lambda: a.sum(), 0.5) / 1e9
    print(json.dumps({k: round(v, 1) if isinstance(v, float) else v for k, v in rows.items()}))


if __name__ == "__main__":
    main()
