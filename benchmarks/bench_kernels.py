"""CPU microbenchmark of the fused GRPO loss head (K2) against the bare 3-GEMM floor, the naive
autograd path, a TRL-style selective log-softmax, Liger's chunked GRPO loss and torch.compile.

    .venv/bin/pytest benchmarks/bench_kernels.py --benchmark-only -s

Shape N=2048 tokens, H=576, V=49,152 (SmolLM2-135M head), fp32, 2 threads, forward + backward
(loss -> dH, dW). The machine is shared, so every variant is timed *alternating* with the floor:
each round runs the 3 bare GEMMs (timed in the setup) and then the variant (timed by
pytest-benchmark), and the ratio is median(variant) / median(floor of the same test). Peak extra
memory comes from a separate process per variant (kernel_peak_mem.py). Rows are appended to
benchmarks/results/kernels_cpu.jsonl; RESULTS.md summarises them. KERNEL_BENCH_ROUNDS (default 5).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from kernel_peak_mem import VARIANTS, floor, make_inputs

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results" / "kernels_cpu.jsonl"
SHAPE = {"n": 2048, "h": 576, "v": 49152}
if os.environ.get("KERNEL_BENCH_TINY"):  # a quick smoke run of the harness itself
    SHAPE = {"n": 256, "h": 64, "v": 4096}
    RESULTS = RESULTS.with_name("kernels_cpu_tiny.jsonl")
ROUNDS = int(os.environ.get("KERNEL_BENCH_ROUNDS", "5"))
NV_FP32_MB = SHAPE["n"] * SHAPE["v"] * 4 / 2**20
_ROWS: list[dict] = []


def _version(pkg: str) -> str | None:
    try:
        return importlib.metadata.version(pkg)
    except importlib.metadata.PackageNotFoundError:
        return None


def _hardware() -> dict:
    model = platform.processor()
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
        model = next(ln.split(":", 1)[1].strip() for ln in out.splitlines() if ln.startswith("Model name"))
    except (OSError, subprocess.CalledProcessError, StopIteration):
        pass
    return {"cpu": model, "cores": os.cpu_count(), "threads": torch.get_num_threads(),
                "load_avg_1m": os.getloadavg()[0], "torch": torch.__version__, "triton": _version("triton"),
                "liger_kernel": _version("liger-kernel"), "python": platform.python_version()}


def _code_sha() -> str:
    """Short hash of the kernel sources, so rows from different code versions can be told apart."""
    h = hashlib.sha1()
    for f in sorted((HERE.parent / "kernels").glob("*.py")):
        h.update(f.read_bytes())
    return h.hexdigest()[:10]


def _peak_mem(variant: str) -> dict:
    cmd = [sys.executable, str(HERE / "kernel_peak_mem.py"), "--variant", variant]
    cmd += [f"--{k}={v}" for k, v in SHAPE.items()]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, check=False)
    if res.returncode != 0:
        return {"peak_extra_mb": None, "mem_error": res.stderr.strip().splitlines()[-1:]}
    mem = json.loads(res.stdout.strip().splitlines()[-1])
    return {k: mem[k] for k in ("peak_extra_mb", "first_call_peak_extra_mb")}


@pytest.fixture(scope="module")
def inputs():
    torch.set_num_threads(2)
    return make_inputs(**SHAPE)


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_kernel_step(benchmark, inputs, variant):
    fn = VARIANTS[variant]
    try:
        fn(inputs)  # warm-up (and compilation for the compiled variants)
        if "compiled" in variant:
            fn(inputs)
    except Exception as e:  # noqa: BLE001 - a variant that cannot run here is reported, not fatal
        pytest.skip(f"{variant} does not run on this machine: {type(e).__name__}: {str(e)[:200]}")
    floor_s: list[float] = []

    def setup():
        t = time.perf_counter()
        floor(inputs)
        floor_s.append(time.perf_counter() - t)
        return (inputs,), {}

    benchmark.pedantic(fn, setup=setup, rounds=ROUNDS, iterations=1, warmup_rounds=0)
    median = benchmark.stats.stats.median
    row = dict(variant=variant, doc=(fn.__doc__ or "").strip().splitlines()[0], **SHAPE, dtype="float32",
               rounds=ROUNDS, median_s=round(median, 4), floor_median_s=round(statistics.median(floor_s), 4),
               ratio_to_floor=round(median / statistics.median(floor_s), 3),
               **_peak_mem(variant), **_hardware(), kernels_sha=_code_sha(),
               time=time.strftime("%Y-%m-%dT%H:%M:%S"))
    benchmark.extra_info.update(row)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    with RESULTS.open("a") as f:
        f.write(json.dumps(row) + "\n")
    _ROWS.append(row)


@pytest.fixture(scope="module", autouse=True)
def summary():
    """After the module: prints this run's table and how K2 stands against the targets
    (informational: timings on a shared machine are not asserted; see RESULTS.md)."""
    yield
    if _ROWS:
        _print_summary()


def _print_summary():
    by = {r["variant"]: r for r in _ROWS}
    print(f"\n{'variant':16s} {'median s':>9s} {'floor s':>8s} {'x floor':>8s} {'peak extra MB':>14s}")
    for r in _ROWS:
        print(f"{r['variant']:16s} {r['median_s']:9.3f} {r['floor_median_s']:8.3f} {r['ratio_to_floor']:8.3f} "
              f"{r.get('peak_extra_mb')!s:>14s}")
    ours = by.get("fused")
    if ours is None:
        return
    print(f"K2 vs floor: {ours['ratio_to_floor']:.3f} (target <= 1.15)")
    if by.get("naive") and ours.get("peak_extra_mb") and by["naive"].get("peak_extra_mb"):
        print(f"K2 peak extra {ours['peak_extra_mb']} MB vs naive/4 = {by['naive']['peak_extra_mb'] / 4:.0f} MB "
              f"and one [N, V] fp32 = {NV_FP32_MB:.0f} MB")
    for lig in ("liger", "liger_compiled"):
        if lig in by:
            print(f"{lig} / K2 (ratios to each test's floor): "
                  f"{by[lig]['ratio_to_floor'] / ours['ratio_to_floor']:.2f} (target >= 1.4)")
