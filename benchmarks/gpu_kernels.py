"""GPU comparison of the fused GRPO head (one H200 in a few minutes), with a tiny CPU smoke mode.

    python benchmarks/gpu_kernels.py [--out FILE.json] [--budget-s 300]
    python benchmarks/gpu_kernels.py --tiny     # tiny fp32 shapes on the CPU (automatic without CUDA)

GPU shapes: N=16,384 packed tokens, H=2,048, V=151,936 (a Qwen2.5-1.5B-like head), then N=4,096,
H=4,096, V=128,256 (the shape Liger's and QuACK's fused linear cross-entropy were measured at); bf16
inputs, fp32 accumulation. Rows, each forward + backward (hidden -> loss -> dH, dW):
- floor_3gemm: the bare 3 GEMMs, z = h W^T (fp32 out), dH = dz W, dW = dz^T h (fp32 out), dz a bf16
  [N, V] made beforehand: 6NHV FLOPs, no loss math; the floor for every row below it;
- fused: mentor_fast.kernels.grpo_loss, backend None (CUDA -> the Triton row kernels + cuBLAS);
- fused_gemm: backend "gemm" (kernels/gemm_head.py): an autotuned Triton GEMM whose epilogue takes the
  softmax statistics and writes bf16 scaled probabilities, so the fp32 logits never leave the chip;
- fused_bf16_fp32m / fused_gemm_bf16_fp32m: the same two on fp32 hidden and weight (the fp32 master
  weight of a model.autocast_bf16 run; the same draws as the bf16 inputs, unrounded) with
  compute_dtype=torch.bfloat16: bf16 GEMM operands, fp32 accumulation, an fp32 dW. Besides the
  timing, loss, dH and dW on the first CHECK_ROWS rows against grpo_loss_ref in fp64 on the
  bf16-rounded inputs, under the tests' rule (kernels/testing.py: max and mean error each within 2x
  torch's at the same precision, bf16 logits, plus a tiny atol); "within tolerance" or the run fails;
- naive: grpo_loss_ref, materialised logits (the GEMM in the input dtype, as a model returning bf16
  logits does), fp32 log-softmax, autograd;
- liger / liger_tf32: liger-kernel's LigerFusedLinearGRPOLoss (compiled=True, chunk_size = the batch's
  sequences, loss_type dapo = our token mean, beta 0, the same clip range), TF32 off / on, or a row
  saying why not;
- floor_fwd_gemm / k1_logprobs / k1_gemm: K1 (token_logprobs, no grad; the row kernel, and the GEMM
  head, which writes no logits) against the bare forward GEMM (2NHV);
- logits_inplace: grpo_loss_from_logits(inplace=True) on bf16 logits (2 reads + 1 write of them),
  against a device copy. Each timed call gets pristine logits, restored from a copy outside the
  timed region (the call overwrites them with the gradient); the restore is reported separately.
Timing: CUDA events around the call alone, median (p20/p80) of --iters calls after warm-up. Memory:
torch.cuda.max_memory_allocated after reset_peak_memory_stats, minus what was allocated before the
call (the inputs, and dz for the floor); it includes the dH and dW every row returns. Each row
carries the machine and the versions. A sanity column gives each row's loss, dH and dW against the
naive row (relative L2); a fused row more than 5% off fails the run (exit 1).

CPU (--tiny): N=256, H=64, V=1,000 in fp32, the torch paths; perf_counter timing, no memory column.
The Triton and Liger rows are skipped with the reason unless TRITON_INTERPRET=1 is set (then they run
through the interpreter / without torch.compile, slowly). fused_bf16_fp32m runs the torch path (bf16-
rounded operands, fp32 GEMMs: the same numbers). Prints one table and writes JSON.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch
from mentor_fast.kernels import (
    GRPOOptions,
    grpo_loss,
    grpo_loss_from_logits,
    grpo_loss_ref,
    token_logprobs,
    token_logprobs_ref,
)
from mentor_fast.kernels.testing import rule_check, run_loss, tiny_atol

GPU_SHAPES = [(16384, 2048, 151936), (4096, 4096, 128256)]  # a Qwen2.5-1.5B-like head; the anchors' M, H, V
TINY_SHAPE = (256, 64, 1000)
_FALLBACKS: set[str] = set()
MISMATCH = 0.05  # a fused row whose loss, dH or dW is this far from the naive row fails the run
CHECK_ROWS = 512  # rows of the fp64 check of the bf16-compute row (fp64 [rows, V] logits: 0.6 GB at V=152k)


def _version(pkg: str) -> str | None:
    try:
        return importlib.metadata.version(pkg)
    except importlib.metadata.PackageNotFoundError:
        return None


def machine_info(device: torch.device) -> dict:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else f"cpu: {cpu}",
                "cpu_threads": torch.get_num_threads(), "torch": torch.__version__, "cuda": torch.version.cuda,
                "triton": _version("triton"), "transformers": _version("transformers"),
                "liger_kernel": _version("liger-kernel"), "python": platform.python_version(),
                "triton_interpret": os.environ.get("TRITON_INTERPRET") == "1"}


def make_inputs(n, h, v, device, dtype, seqs=64, seed=0) -> dict:
    """N packed tokens = `seqs` sequences of n/seqs tokens, token-mean weights, old log-probs near the
    current ones (so ratios straddle the clip range)."""
    g = torch.Generator().manual_seed(seed)
    hid = (torch.randn(n, h, generator=g) * 0.5).to(device, dtype)
    w = (torch.randn(v, h, generator=g) * 0.02).to(device, dtype)
    y = torch.randint(0, v, (n,), generator=g).to(device)
    old = token_logprobs(hid, w, y) + (torch.rand(n, generator=g).to(device) - 0.5) * 0.6
    adv_seq = torch.randn(seqs, generator=g).to(device)
    seq_ids = (torch.arange(n, device=device) * seqs) // n
    return {"hidden": hid, "weight": w, "targets": y, "old_logp": old, "adv_seq": adv_seq, "seqs": seqs,
                "advantages": adv_seq[seq_ids], "token_weights": torch.full((n,), 1.0 / n, device=device)}


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_fn(fn, device, iters, warmup, before=None) -> dict:
    """Median / p20 / p80 ms of fn() alone (CUDA events on GPU, perf_counter on CPU); `before()` runs
    ahead of each call, outside the timed region."""
    for _ in range(warmup):
        if before:
            before()
        fn()
    _sync(device)
    ms = []
    for _ in range(iters):
        if before:
            before()
        if device.type == "cuda":
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            out = fn()
            b.record()
            b.synchronize()
            ms.append(a.elapsed_time(b))
        else:
            t = time.perf_counter()
            out = fn()
            ms.append((time.perf_counter() - t) * 1e3)
        del out
    q = statistics.quantiles(ms, n=5) if len(ms) >= 5 else [min(ms), 0, 0, max(ms)]
    return {"median_ms": statistics.median(ms), "p20_ms": q[0], "p80_ms": q[3], "iters": len(ms)}


def peak_extra(fn, device, before=None):
    """(fn's result, peak extra MiB): max_memory_allocated during the call minus what was held before
    it (CUDA); None on the CPU."""
    if before:
        before()
    if device.type != "cuda":
        return fn(), None
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    base = torch.cuda.memory_allocated(device)
    out = fn()
    torch.cuda.synchronize(device)
    return out, (torch.cuda.max_memory_allocated(device) - base) / 2**20


def _mm_f32(a, b):
    """a @ b with fp32 output: bf16 operands with fp32 accumulate and output on CUDA (torch >= 2.8)."""
    if a.dtype == torch.float32 or a.device.type != "cuda":
        return (a.float() @ b.float()) if a.dtype != torch.float32 else a @ b
    try:
        return torch.mm(a, b, out_dtype=torch.float32)
    except (TypeError, RuntimeError, NotImplementedError):  # older torch: bf16 out, then upcast (noted in the JSON)
        _FALLBACKS.add("torch.mm(out_dtype=float32) unavailable: the floors use bf16-out GEMMs")
        return (a @ b).float()


def _leaves(x):
    return x["hidden"].detach().requires_grad_(), x["weight"].detach().requires_grad_()


def _lw(x):
    return x["targets"], x["old_logp"], x["advantages"], x["token_weights"]


def variants(x, device, interpret: bool) -> list[dict]:
    """The rows: name, fn (returns (loss | None, dH | None, dW | None)) or the reason it is skipped,
    FLOPs and the floor it is compared with."""
    n, hdim = x["hidden"].shape
    v = x["weight"].shape[0]
    nhv = 2.0 * n * hdim * v
    cuda = device.type == "cuda"
    rows = []

    def floor_setup():
        dz = (torch.randn(n, v, device=device) * 1e-3).to(x["hidden"].dtype)  # made beforehand, not timed

        def floor3():
            h, w = x["hidden"], x["weight"]
            z = _mm_f32(h, w.T)
            return None, dz @ w, _mm_f32(dz.T, h), z  # z kept to the end, as a real step keeps its logits
        return {"fn": floor3}

    rows.append({"name": "floor_3gemm", "setup": floor_setup, "flops": 3 * nhv, "floor": "floor_3gemm",
                 "note": "h W^T fp32-out, dz W, dz^T h fp32-out; dz made beforehand"})

    def fused(backend=None):
        def run():
            h, w = _leaves(x)
            out = grpo_loss(h, w, *_lw(x), backend=backend)
            out.loss.backward()
            return out.loss.detach(), h.grad, w.grad
        return run

    rows.append({"name": "fused", "fn": fused(), "flops": 3 * nhv, "floor": "floor_3gemm", "ours": True,
                 "note": "grpo_loss, backend " + ("triton" if cuda else "torch (chunked)")})
    triton_ok = cuda or (interpret and _version("triton") is not None)
    triton_skip = None if triton_ok else ("triton is not installed" if _version("triton") is None
                                          else "no CUDA; set TRITON_INTERPRET=1 to interpret it")
    if not cuda:
        rows.append({"name": "fused_triton", "fn": fused("triton") if triton_ok else None, "flops": 3 * nhv,
                     "floor": "floor_3gemm", "ours": True, "slow": True,
                     "note": "grpo_loss, backend triton (interpreter)", "skip": triton_skip})
    rows.append({"name": "fused_gemm", "fn": fused("gemm") if triton_ok else None, "flops": 3 * nhv,
                 "floor": "floor_3gemm", "ours": True, "slow": not cuda, "skip": triton_skip,
                 "note": "grpo_loss, backend gemm (Triton GEMM with the statistics epilogue; bf16 P'; cuBLAS dH, dW)"})
    rows.append(_bf16_master_row(x, device))
    if triton_ok:
        rows.append(_bf16_master_row(x, device, backend="gemm"))

    def naive():
        h, w = _leaves(x)
        try:  # logits in the model dtype (a bf16 GEMM on GPU), upcast for the log-softmax, as a trainer does
            out = grpo_loss_ref(h, w, *_lw(x), logits_dtype=h.dtype)
        except TypeError:
            out = grpo_loss_ref(h, w, *_lw(x))
        out.loss.backward()
        return out.loss.detach(), h.grad, w.grad

    rows.append({"name": "naive", "fn": naive, "flops": 3 * nhv, "floor": "floor_3gemm",
                 "note": "grpo_loss_ref: [N, V] logits, autograd"})

    def fwd_gemm():
        return None, _mm_f32(x["hidden"], x["weight"].T), None

    def k1(backend=None):
        return lambda: (None, token_logprobs(x["hidden"], x["weight"], x["targets"], backend=backend), None)

    rows.append({"name": "floor_fwd_gemm", "fn": fwd_gemm, "flops": nhv, "floor": "floor_fwd_gemm",
                 "note": "h W^T fp32-out"})
    rows.append({"name": "k1_logprobs", "fn": k1(), "flops": nhv, "floor": "floor_fwd_gemm",
                 "note": "token_logprobs, no grad"})
    rows.append({"name": "k1_gemm", "fn": k1("gemm") if triton_ok else None, "flops": nhv, "floor": "floor_fwd_gemm",
                 "slow": not cuda, "skip": triton_skip, "note": "token_logprobs, backend gemm: no logits written"})
    rows.append(_inplace_row(x, device))
    for tf32 in (False, True):  # last: torch.compile takes the longest
        rows.append(_liger_row(x, device, interpret, nhv, tf32))
    return rows


def _master_weights(x, device, seed=0):
    """fp32 hidden and weight as a bf16-compute run holds them: make_inputs' draws before the rounding
    (so they round to exactly x's bf16 inputs, and the naive row is the same problem)."""
    if x["hidden"].dtype == torch.float32:
        return x["hidden"], x["weight"]
    (n, h), v = x["hidden"].shape, x["weight"].shape[0]
    g = torch.Generator().manual_seed(seed)
    hid = (torch.randn(n, h, generator=g) * 0.5).to(device)
    w = (torch.randn(v, h, generator=g) * 0.02).to(device)
    if not torch.equal(hid.to(x["hidden"].dtype), x["hidden"]):
        raise RuntimeError("_master_weights: make_inputs' draws changed; keep the two in step")
    return hid, w


def _bf16_master_row(x, device, backend: str | None = None) -> dict:
    """grpo_loss on fp32 hidden + weight with compute_dtype=bf16 (bf16 operands, fp32 accumulation
    and logits, fp32 dW for the master weight), and its check against fp64 on the bf16-rounded
    inputs (tests/test_kernels.py::test_grpo_loss_bf16_compute_fp32_master builds it the same way)."""
    bf = torch.bfloat16
    n, hdim = x["hidden"].shape
    v = x["weight"].shape[0]

    def setup():
        hid32, w32 = _master_weights(x, device)

        def run():
            h, w = hid32.detach().requires_grad_(), w32.detach().requires_grad_()
            out = grpo_loss(h, w, *_lw(x), compute_dtype=bf, backend=backend)
            out.loss.backward()
            return out.loss.detach(), h.grad, w.grad

        def check():
            rows = min(CHECK_ROWS, n)
            b = {"hidden": hid32[:rows], "weight": w32, "targets": x["targets"][:rows],
                 "old_logp": x["old_logp"][:rows], "advantages": x["advantages"][:rows],
                 "token_weights": torch.full((rows,), 1.0 / rows, device=device)}
            fp64 = {**b, "hidden": b["hidden"].to(bf).double(), "weight": w32.to(bf).double()}
            r64, dh64, dw64 = run_loss(grpo_loss_ref, fp64, torch.float64)
            del fp64
            rs, dhs, dws = run_loss(grpo_loss_ref, b, torch.float32, compute_dtype=bf, logits_dtype=bf)
            out, dh, dw = run_loss(grpo_loss, b, torch.float32, compute_dtype=bf, backend=backend)
            res, ok = {}, dh.dtype == torch.float32 and dw.dtype == torch.float32
            for name, got, ref, same in (("loss", out.loss, r64.loss, rs.loss), ("dH", dh, dh64, dhs),
                                         ("dW", dw, dw64, dws)):
                r = rule_check(got, ref, same, tiny_atol(torch.float32, ref))
                res[name] = {"max_err": r["max_err"], "mean_err": r["mean_err"], "same_precision_max_err":
                             r["torch_max_err"], "same_precision_mean_err": r["torch_mean_err"], "ok": not r["bad"]}
                ok &= not r["bad"]
            # an fp32 dW is well below one bf16 rounding of dW (a dW rounded to bf16 is at 1); reported
            rounding = float((dw64.to(bf).double() - dw64).abs_().max())
            res["dW_err_over_bf16_rounding"] = res["dW"]["max_err"] / max(rounding, 1e-300)
            grads = f"dH {str(dh.dtype).replace('torch.', '')}, dW {str(dw.dtype).replace('torch.', '')}"
            return {"vs_fp64": res, "within_tolerance": ok, "check_rows": rows, "grad_dtypes": grads}
        return {"fn": run, "check": check}

    name = backend or ("triton" if device.type == "cuda" else "torch (chunked)")
    return {"name": "fused_gemm_bf16_fp32m" if backend == "gemm" else "fused_bf16_fp32m", "setup": setup,
            "flops": 6.0 * n * hdim * v, "floor": "floor_3gemm", "ours": True, "inputs": "float32 in, bf16 compute",
            "slow": device.type != "cuda" and backend is not None,
            "note": f"grpo_loss(compute_dtype=bf16) on fp32 hidden + weight, backend {name}; fp32 dW"}


def _liger_row(x, device, interpret, nhv, tf32: bool) -> dict:
    """Liger's fused linear GRPO loss with chunk_size = the batch's sequences (one chunk: its fastest
    setting here; its default, 1, runs a chunk per sequence), TF32 off or on for its fp32 matmuls."""
    row = {"name": "liger_tf32" if tf32 else "liger", "flops": 4 * nhv, "floor": "floor_3gemm", "fn": None}
    if _version("liger-kernel") is None:
        return row | {"skip": "liger-kernel not installed"}
    if device.type != "cuda" and not interpret:
        return row | {"skip": "no CUDA; set TRITON_INTERPRET=1 to run it uncompiled on the CPU"}
    from liger_kernel.chunked_loss import LigerFusedLinearGRPOLoss

    d = GRPOOptions()
    compiled = device.type == "cuda"
    b = x["seqs"]
    t = x["hidden"].shape[0] // b
    loss_fn = LigerFusedLinearGRPOLoss(beta=0.0, compiled=compiled, use_ref_model=False, chunk_size=b,
                                       epsilon_low=d.eps_low, epsilon_high=d.eps_high, loss_type="dapo")
    mask = torch.ones(b, t, dtype=torch.long, device=device)  # on the inputs' device (Liger needs it there)

    def run():
        saved = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = tf32
        try:
            h, w = _leaves(x)
            loss, _ = loss_fn(h.view(b, t, -1), w, x["targets"].view(b, t), mask, x["adv_seq"],
                              old_per_token_logps=x["old_logp"].view(b, t))
            loss.backward()
        finally:
            torch.backends.cuda.matmul.allow_tf32 = saved
        return loss.detach(), h.grad, w.grad

    return row | {"fn": run, "slow": device.type != "cuda",
                  "note": (f"LigerFusedLinearGRPOLoss compiled={compiled}, chunk_size={b} (all sequences), TF32 "
                           f"{'on' if tf32 else 'off'}, dapo, beta 0 (recomputes logits: 8NHV)")}


def _inplace_row(x, device) -> dict:
    """grpo_loss_from_logits(inplace=True) on [N, V] logits in the input dtype, pristine for every call."""
    nbytes = x["hidden"].shape[0] * x["weight"].shape[0] * x["hidden"].element_size()

    def setup():
        with torch.no_grad():
            pristine = _mm_f32(x["hidden"], x["weight"].T).to(x["hidden"].dtype)
        buf = torch.empty_like(pristine).requires_grad_()  # requires grad: the op writes d loss / d logits

        def restore():
            with torch.no_grad():
                buf.copy_(pristine)

        def run():
            out = grpo_loss_from_logits(buf, *_lw(x), inplace=True)
            return out.loss.detach(), None, None
        return {"fn": run, "before": restore, "copy_src": pristine}

    backend = "triton" if device.type == "cuda" else "torch"
    return {"name": "logits_inplace", "setup": setup, "bytes": 3 * nbytes, "copy_bytes": 2 * nbytes,
            "note": f"grpo_loss_from_logits(inplace=True), backend {backend}"}


def _rel(a, b) -> float | None:
    if a is None or b is None:
        return None
    a, b = a.detach().double(), b.detach().double()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def run_rows(rows, device, args, machine, t0) -> list[dict]:
    results, outs = [], {}
    for r in rows:
        res = {"variant": r["name"], "note": r.get("note", ""), **machine}
        if (r.get("fn") is None and r.get("setup") is None) or time.time() - t0 > args.budget_s:
            res["skipped"] = r.get("skip") or "time budget"
            results.append(res)
            continue
        iters, warmup = (2, 1) if r.get("slow") else (args.iters, args.warmup)
        try:
            r |= r["setup"]() if r.get("setup") else {}
            fn, before = r["fn"], r.get("before")
            for _ in range(warmup):  # compile / autotune before the memory and the timing
                if before:
                    before()
                fn()
            out, mem = peak_extra(fn, device, before)
            if r["name"] in ("fused", "naive", "liger", "liger_tf32", "fused_triton", "fused_gemm", "fused_bf16_fp32m",
                             "fused_gemm_bf16_fp32m"):
                outs[r["name"]] = out
            del out
            res |= time_fn(fn, device, iters, 0, before)
            res["peak_extra_mib"] = mem
            if r.get("flops"):
                res["tflops"] = r["flops"] / (res["median_ms"] * 1e9)
            if r.get("bytes"):
                src = r["copy_src"]
                dst = torch.empty_like(src)
                c = time_fn(lambda: dst.copy_(src), device, iters, 1)  # noqa: B023 - used at once
                res["gbps"] = r["bytes"] / (res["median_ms"] * 1e6)
                res["restore_copy_ms"] = c["median_ms"]
                res["copy_gbps"] = r["copy_bytes"] / (c["median_ms"] * 1e6)
                del dst, src
            if r.get("check"):  # accuracy against fp64, after the timing
                res |= r["check"]()
                if not res["within_tolerance"]:
                    res["error"] = "OUT OF TOLERANCE vs fp64: " + ", ".join([
                        f"{k} max err {v['max_err']:.2e} (same-precision torch {v['same_precision_max_err']:.2e})"
                        for k, v in res["vs_fp64"].items() if isinstance(v, dict) and not v["ok"]]
                        + [f"gradients {res['grad_dtypes']} (want float32)"])
            if r.get("inputs"):
                res["inputs"] = r["inputs"]
            res["_floor"] = r.get("floor")
            res["_ours"] = bool(r.get("ours"))
        except Exception as e:  # noqa: BLE001 - report it in the row and go on
            res["error"] = f"{type(e).__name__}: {str(e)[:200]}"
        for k in ("fn", "before", "copy_src", "setup", "check"):  # free the row's buffers before the next one
            r.pop(k, None)
        results.append(res)
        if device.type == "cuda":
            torch.cuda.empty_cache()
    _agreement(results, outs)
    return results


def _agreement(results, outs) -> None:
    """Loss, dH and dW of each row against the naive row (relative; L2 for the gradients)."""
    ref = outs.get("naive")
    if ref is None:
        return
    for res in results:
        o = outs.get(res["variant"])
        if o is None or res["variant"] == "naive":
            continue
        res["vs_naive"] = {"loss": abs(float(o[0]) - float(ref[0])) / max(abs(float(ref[0])), 1e-30),
                           "dH": _rel(o[1], ref[1]), "dW": _rel(o[2], ref[2])}
        if res.get("_ours") and max(v for v in res["vs_naive"].values() if v is not None) > MISMATCH:
            res["error"] = "; ".join(filter(None, (res.get("error"), f"MISMATCH vs naive: {res['vs_naive']}")))


def logp_error(x, rows=512) -> float:
    """max |K1 logp - fp64| on the first rows."""
    sl = slice(0, min(rows, x["hidden"].shape[0]))
    got = token_logprobs(x["hidden"][sl], x["weight"], x["targets"][sl])
    ref = token_logprobs_ref(x["hidden"][sl].double(), x["weight"].double(), x["targets"][sl]).logp
    return float((got.double() - ref).abs().max())


def fp64_summary(r: dict) -> str:
    """One line for a row with an fp64 check (gpu_check.sh's table prints the same words)."""
    v = r["vs_fp64"]
    return (f"vs fp64 on bf16-rounded inputs ({r['check_rows']} rows): max err loss {v['loss']['max_err']:.1e}, "
            f"dH {v['dH']['max_err']:.1e}, dW {v['dW']['max_err']:.1e} ({v['dW_err_over_bf16_rounding']:.2f} of one "
            f"bf16 rounding of dW; {r['grad_dtypes']}): "
            + ("within tolerance" if r["within_tolerance"] else "OUT OF TOLERANCE"))


def report(results, machine, shape, dtype, wall, extra) -> str:
    by = {r["variant"]: r for r in results if "median_ms" in r}
    for r in results:
        base = by.get(r.pop("_floor", None) or "")
        if "median_ms" in r and base:
            r["x_floor"] = r["median_ms"] / base["median_ms"]
        r.pop("_ours", None)
    n, h, v = shape
    lines = [(f"{machine['device']} | torch {machine['torch']} cuda {machine['cuda']} triton {machine['triton']} "
              f"transformers {machine['transformers']} liger-kernel {machine['liger_kernel'] or '-'}"),
             f"N={n} H={h} V={v} {dtype}  ({wall:.0f} s)  K1 max|logp - fp64| {extra['logp_max_abs_err_vs_fp64']:.2e}",
             (f"{'variant':16s} {'median ms':>10s} {'p20':>8s} {'p80':>8s} {'x floor':>8s} {'TFLOP/s':>8s} "
              f"{'peak MiB':>9s}  {'vs naive (loss/dH/dW)':22s} note")]
    for r in results:
        if "median_ms" not in r:
            why = r.get("skipped") or r.get("error")
            lines.append(f"{r['variant']:16s} {'skipped' if 'skipped' in r else 'ERROR'}: {why}")
            continue
        mem = f"{r['peak_extra_mib']:.0f}" if r.get("peak_extra_mib") is not None else "-"
        agree = "-"
        if r.get("vs_naive"):
            agree = "/".join("-" if x is None else f"{x:.1e}" for x in r["vs_naive"].values())
        note = r["note"]
        if r.get("gbps"):
            note = (f"{r['gbps']:.3g} GB/s ({100 * r['gbps'] / r['copy_gbps']:.0f}% of a copy's "
                    f"{r['copy_gbps']:.3g}); restore {r['restore_copy_ms']:.2f} ms untimed; {note}")
        tfl = f"{r['tflops']:8.3g}" if r.get("tflops") else f"{'-':>8s}"
        xf = f"{r['x_floor']:8.3f}" if r.get("x_floor") else f"{'-':>8s}"
        lines.append(f"{r['variant']:16s} {r['median_ms']:10.2f} {r['p20_ms']:8.2f} {r['p80_ms']:8.2f} {xf} {tfl} "
                     f"{mem:>9s}  {agree:22s} {note}")
        if r.get("vs_fp64"):
            lines.append(f"{'':16s} {fp64_summary(r)}")
        if r.get("error"):
            lines.append(f"{'':16s} ERROR: {r['error']}")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tiny", action="store_true", help="tiny fp32 shapes on the CPU (automatic without CUDA)")
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--budget-s", type=float, default=300.0, help="start no new row after this many seconds")
    p.add_argument("--out", default=str(Path(__file__).resolve().parent / "results" / "kernels_gpu.json"))
    args = p.parse_args(argv)
    cuda = torch.cuda.is_available() and not args.tiny
    device = torch.device("cuda" if cuda else "cpu")
    shapes, dtype = (GPU_SHAPES, torch.bfloat16) if cuda else ([TINY_SHAPE], torch.float32)
    if not cuda:
        args.iters = min(args.iters, 5)
        args.out = args.out.replace(".json", "_tiny.json") if args.out.endswith("kernels_gpu.json") else args.out
    t0 = time.time()
    machine = machine_info(device)
    interpret = os.environ.get("TRITON_INTERPRET") == "1"
    runs, texts = [], []
    for shape in shapes:
        x = make_inputs(*shape, device, dtype, seqs=64 if cuda else 8)
        results = run_rows(variants(x, device, interpret and not cuda), device, args, machine, t0)
        extra = {"logp_max_abs_err_vs_fp64": logp_error(x), "fallbacks": sorted(_FALLBACKS)}
        texts.append(report(results, machine, shape, str(dtype).replace("torch.", ""), time.time() - t0, extra))
        runs.append({"shape": dict(zip("nhv", shape)), "extra": extra, "results": results})
        del x
        if cuda:
            torch.cuda.empty_cache()
    print("\n\n".join(texts) + "".join(f"\nnote: {f}" for f in sorted(_FALLBACKS)))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"machine": machine, "dtype": str(dtype), "runs": runs}, indent=1))
    print(f"wrote {args.out}")
    return 1 if any("error" in r for run in runs for r in run["results"]) else 0


if __name__ == "__main__":
    sys.exit(main())
