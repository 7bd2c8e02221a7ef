"""GPU comparison of the fused GRPO kernels (one H200 in under 8 minutes), with a CPU smoke mode.

    .venv/bin/python benchmarks/gpu_kernels.py [--out benchmarks/results/kernels_gpu.json]
    .venv/bin/python benchmarks/gpu_kernels.py --tiny     # tiny shapes on the CPU (automatic without CUDA)

Shape: N=16,384 packed tokens, H=2,048, V=151,936 (Qwen2.5-1.5B-like head), bf16 inputs, fp32 logits
inside. Rows: the bare 3 GEMMs (floor, 6NHV), K2 fused (ours) hidden -> loss, dH, dW, the naive
autograd path (materialised logits), Liger's LigerFusedLinearGRPOLoss if installed (compiled=True),
K1 log-probs against the bare forward GEMM (2NHV), and the logits-level row kernel's bandwidth
(2 reads + 1 write of the bf16 logits) against a measured device copy. Timing: CUDA events, median
(and p20/p80) of >= 20 iterations after warm-up; memory: torch.cuda.max_memory_allocated minus the
allocation before the call (inputs excluded). Prints one table and writes JSON.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from kernel_peak_mem import EPS_HIGH, EPS_LOW, fused, liger_compiled, naive
from mentor_fast.kernels import grpo_loss_from_logits, token_logprobs, token_logprobs_ref

BUDGET_S = 450.0  # stop starting new rows after this (the whole run must stay under 8 minutes)


def make_inputs(n, h, v, device, dtype, seqs=64, seed=0):
    g = torch.Generator(device="cpu").manual_seed(seed)
    hid = (torch.randn(n, h, generator=g) * 0.5).to(device, dtype)
    w = (torch.randn(v, h, generator=g) * 0.02).to(device, dtype)
    y = torch.randint(0, v, (n,), generator=g).to(device)
    old = token_logprobs(hid, w, y) + (torch.rand(n, generator=g).to(device) - 0.5) * 0.6
    adv_seq = torch.randn(seqs, generator=g).to(device)
    seq_ids = (torch.arange(n, device=device) * seqs) // n
    return {"hidden": hid, "weight": w, "targets": y, "old_logp": old, "adv_seq": adv_seq, "seq_ids": seq_ids,
                "advantages": adv_seq[seq_ids], "token_weights": torch.full((n,), 1.0 / n, device=device)}


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def time_fn(fn, device, iters, warmup):
    """Median / p20 / p80 in ms (CUDA events on GPU, perf_counter on CPU)."""
    for _ in range(warmup):
        fn()
    _sync(device)
    ms = []
    for _ in range(iters):
        if device.type == "cuda":
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            ms.append(a.elapsed_time(b))
        else:
            t = time.perf_counter()
            fn()
            ms.append((time.perf_counter() - t) * 1e3)
    q = statistics.quantiles(ms, n=5) if len(ms) >= 5 else [min(ms)] * 4
    return {"median_ms": statistics.median(ms), "p20_ms": q[0], "p80_ms": q[3]}


def peak_extra_gb(fn, device):
    if device.type != "cuda":
        return None
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    out = fn()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    del out
    return peak / 2**30


def floor3(x):
    h, w = x["hidden"], x["weight"]
    z = h @ w.T
    return z @ w, z.T @ h


def rows(x, device, args, out):
    """(name, fn, flops) rows of the comparison."""
    n, h, v = args.n, args.h, args.v
    nhv = 2.0 * n * h * v
    logits = None
    if device.type == "cuda" or n * v <= 2**26:  # requires grad, so the op computes the gradient
        logits = (x["hidden"] @ x["weight"].T).requires_grad_()
    lw = (x["targets"], x["old_logp"], x["advantages"], x["token_weights"])

    def k1():
        return token_logprobs(x["hidden"], x["weight"], x["targets"])

    def row_kernel():  # logits-level op: the forward writes d loss / d logits in place (no backward call)
        return grpo_loss_from_logits(logits, *lw, eps_low=EPS_LOW, eps_high=EPS_HIGH, inplace=True).loss

    if logits is not None:
        copy_src, copy_dst = logits.detach(), torch.empty_like(logits, requires_grad=False)
        t = time_fn(lambda: copy_dst.copy_(copy_src), device, args.iters, 3)
        out["copy_GBps"] = 2 * logits.numel() * logits.element_size() / (t["median_ms"] * 1e6)
        del copy_dst
    return [("floor_3gemm", lambda: floor3(x), 3 * nhv), ("k2_fused", lambda: fused(x), 3 * nhv),
            ("naive", lambda: naive(x), 3 * nhv), ("liger_grpo_compiled", lambda: liger_compiled(x), 4 * nhv),
            ("floor_fwd_gemm", lambda: x["hidden"] @ x["weight"].T, nhv), ("k1_logprobs", k1, nhv),
            ("logits_row_kernel", row_kernel if logits is not None else None,
             3 * n * v * (logits.element_size() if logits is not None else 2))]


def logp_error(x, rows_=512):
    """max |K1 logp - fp64| on the first rows (first-class accuracy metric, research/kernels.md)."""
    sl = slice(0, min(rows_, x["hidden"].shape[0]))
    got = token_logprobs(x["hidden"][sl], x["weight"], x["targets"][sl])
    ref = token_logprobs_ref(x["hidden"][sl].double(), x["weight"].double(), x["targets"][sl]).logp
    return float((got.double() - ref).abs().max())


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tiny", action="store_true", help="tiny shapes (automatic without CUDA)")
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--out", default=str(Path(__file__).resolve().parent / "results" / "kernels_gpu.json"))
    args = p.parse_args(argv)
    cuda = torch.cuda.is_available() and not args.tiny
    device = torch.device("cuda" if cuda else "cpu")
    args.n, args.h, args.v = (16384, 2048, 151936) if cuda else (256, 64, 1000)
    if not cuda:
        args.iters = min(args.iters, 5)
        args.out = args.out.replace(".json", "_tiny.json")
    t0 = time.time()
    x = make_inputs(args.n, args.h, args.v, device, torch.bfloat16)
    meta = {"device": torch.cuda.get_device_name() if cuda else platform.processor() or "cpu",
                "n": args.n, "h": args.h, "v": args.v, "dtype": "bfloat16", "iters": args.iters, "torch": torch.__version__,
                "cuda": torch.version.cuda, "python": platform.python_version()}
    results, extra = [], {}
    for name, fn, flops in rows(x, device, args, extra):
        if fn is None or time.time() - t0 > BUDGET_S:
            results.append({"variant": name, "skipped": "time budget" if fn else "not applicable"})
            continue
        try:
            mem = peak_extra_gb(fn, device)
            t = time_fn(fn, device, args.iters, warmup=3)
        except Exception as e:  # noqa: BLE001 - e.g. Liger not installed: report it, keep going
            results.append({"variant": name, "skipped": f"{type(e).__name__}: {str(e)[:160]}"})
            continue
        results.append(dict(variant=name, **t, peak_extra_gb=mem, tflops=flops / (t["median_ms"] * 1e9),
                            gbps=flops / (t["median_ms"] * 1e6) if name == "logits_row_kernel" else None))
    _report(results, meta, extra, x, args, time.time() - t0)
    return 0


def _report(results, meta, extra, x, args, wall):
    by = {r["variant"]: r for r in results if "median_ms" in r}
    floors = {"floor_3gemm": "floor_3gemm", "k2_fused": "floor_3gemm", "naive": "floor_3gemm",
                  "liger_grpo_compiled": "floor_3gemm", "floor_fwd_gemm": "floor_fwd_gemm", "k1_logprobs": "floor_fwd_gemm"}
    for r in results:
        base = by.get(floors.get(r["variant"], ""))
        if "median_ms" in r and base:
            r["x_floor"] = r["median_ms"] / base["median_ms"]
    if "logits_row_kernel" in by and "copy_GBps" in extra:
        by["logits_row_kernel"]["pct_of_copy_bw"] = 100 * by["logits_row_kernel"]["gbps"] / extra["copy_GBps"]
    extra["logp_max_abs_err_vs_fp64"] = logp_error(x)
    print(f"{meta['device']}  N={args.n} H={args.h} V={args.v} bf16  ({wall:.0f} s)")
    print(f"{'variant':22s} {'median ms':>10s} {'p20':>8s} {'p80':>8s} {'x floor':>8s} {'TFLOP/s':>8s} "
          f"{'peak GB':>8s}  note")
    for r in results:
        if "median_ms" not in r:
            print(f"{r['variant']:22s} skipped: {r['skipped']}")
            continue
        note = f"{r['gbps']:.0f} GB/s ({r.get('pct_of_copy_bw', 0):.0f}% of copy)" if r.get("gbps") else ""
        mem = f"{r['peak_extra_gb']:.2f}" if r["peak_extra_gb"] is not None else "-"
        print(f"{r['variant']:22s} {r['median_ms']:10.2f} {r['p20_ms']:8.2f} {r['p80_ms']:8.2f} "
              f"{r.get('x_floor', float('nan')):8.3f} {r['tflops']:8.1f} {mem:>8s}  {note}")
    print(json.dumps(extra))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"meta": meta, "extra": extra, "results": results}, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    sys.exit(main())
