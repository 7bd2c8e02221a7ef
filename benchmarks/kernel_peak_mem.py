"""Kernel benchmark variants (hidden -> GRPO loss -> dH, dW) and their peak memory, one process each.

    .venv/bin/python benchmarks/kernel_peak_mem.py --variant fused [--n 2048 --h 576 --v 49152]

prints one JSON line: {"variant", "peak_extra_mb", "first_call_peak_extra_mb", ...}. Peak extra = the
RSS high-water mark (VmHWM, reset by writing 5 to /proc/self/clear_refs) minus VmRSS just before the
call, with the inputs already allocated; it includes the dH and dW every variant must return.
"first call" is the very first forward+backward; the steady value is a later call (after a warm-up),
which is what a training loop sees. bench_kernels.py imports VARIANTS from here for the timings.
"""

from __future__ import annotations

import argparse
import json
import sys

import torch
from mentor_fast.kernels import grpo_loss, grpo_loss_ref

EPS_LOW, EPS_HIGH = 0.2, 0.28


def make_inputs(n=2048, h=576, v=49152, seqs=8, seed=0, dtype=torch.float32):
    """N packed tokens = `seqs` sequences of n/seqs tokens (no padding), token-mean ('dapo') weights."""
    g = torch.Generator().manual_seed(seed)
    hid = (torch.randn(n, h, generator=g) * 0.5).to(dtype)
    w = (torch.randn(v, h, generator=g) * 0.02).to(dtype)
    y = torch.randint(0, v, (n,), generator=g)
    with torch.no_grad():  # old log-probs near the current ones, so ratios straddle the clip range
        logp = torch.cat([torch.log_softmax(hid[s:s + 256].float() @ w.float().T, -1)
                          .gather(1, y[s:s + 256, None])[:, 0] for s in range(0, n, 256)])
    old = logp + (torch.rand(n, generator=g) - 0.5) * 0.6
    adv_seq = torch.randn(seqs, generator=g)
    seq_ids = torch.arange(n) * seqs // n
    return {"hidden": hid, "weight": w, "targets": y, "old_logp": old, "adv_seq": adv_seq, "seq_ids": seq_ids,
                "advantages": adv_seq[seq_ids], "token_weights": torch.full((n,), 1.0 / n)}


def _leaves(x):
    return x["hidden"].detach().requires_grad_(), x["weight"].detach().requires_grad_()


def _grpo_math(logp, x):
    ratio = torch.exp((logp - x["old_logp"]).clamp(-20, 20))
    a = x["advantages"]
    pg = torch.maximum(-a * ratio, -a * ratio.clamp(1 - EPS_LOW, 1 + EPS_HIGH))
    return (x["token_weights"] * pg).sum()


def floor(x):
    """The bare 3 GEMMs of any hidden -> dH, dW step (6NHV), no loss math: the floor."""
    h, w = x["hidden"], x["weight"]
    z = h @ w.T
    return z @ w, z.T @ h


def fused(x):
    """Ours: mentor_fast.kernels.grpo_loss, CPU default (chunked torch, gradient in the forward)."""
    h, w = _leaves(x)
    grpo_loss(h, w, x["targets"], x["old_logp"], x["advantages"], x["token_weights"],
              eps_low=EPS_LOW, eps_high=EPS_HIGH).loss.backward()
    return h.grad, w.grad


def naive(x):
    """Vanilla: logits materialised, log_softmax + gather, autograd (grpo_loss_ref, no entropy)."""
    h, w = _leaves(x)
    # logits in the model dtype (bf16 GEMM on GPU), upcast for the log-softmax, as a trainer does
    grpo_loss_ref(h, w, x["targets"], x["old_logp"], x["advantages"], x["token_weights"],
                  eps_low=EPS_LOW, eps_high=EPS_HIGH, compute_entropy=False,
                  logits_dtype=h.dtype).loss.backward()
    return h.grad, w.grad


def selective(x, rows: int = 256):
    """TRL-style selective log-softmax (our own code): materialised logits, the target logit minus a
    per-sequence logsumexp (no [N, V] log-softmax output is kept), autograd."""
    h, w = _leaves(x)
    logits = h @ w.T
    tgt = logits.gather(1, x["targets"][:, None])[:, 0]
    lse = torch.cat([torch.logsumexp(logits[s:s + rows], -1) for s in range(0, logits.shape[0], rows)])
    _grpo_math(tgt - lse, x).backward()
    return h.grad, w.grad


def _liger(x, compiled: bool):
    from liger_kernel.chunked_loss import LigerFusedLinearGRPOLoss

    b = x["adv_seq"].numel()
    h, w = _leaves(x)
    t = h.shape[0] // b
    loss_fn = LigerFusedLinearGRPOLoss(beta=0.0, compiled=compiled, use_ref_model=False,
                                       epsilon_low=EPS_LOW, epsilon_high=EPS_HIGH, loss_type="dapo")
    loss, _ = loss_fn(h.view(b, t, -1), w, x["targets"].view(b, t), torch.ones(b, t, dtype=torch.long),
                      x["adv_seq"], old_per_token_logps=x["old_logp"].view(b, t))
    loss.backward()
    return h.grad, w.grad


def liger(x):
    """Liger's LigerFusedLinearGRPOLoss (chunked_loss), compiled=False, dapo = token mean, beta 0."""
    return _liger(x, False)


def liger_compiled(x):
    """Liger's LigerFusedLinearGRPOLoss with compiled=True."""
    return _liger(x, True)


_COMPILED = {}


def compiled_ref(x):
    """torch.compile of the reference (naive) loss."""
    if "fn" not in _COMPILED:
        def loss_fn(h, w, y, old, adv, tw):
            return grpo_loss_ref(h, w, y, old, adv, tw, eps_low=EPS_LOW, eps_high=EPS_HIGH,
                                 compute_entropy=False).loss
        _COMPILED["fn"] = torch.compile(loss_fn, dynamic=False)
    h, w = _leaves(x)
    _COMPILED["fn"](h, w, x["targets"], x["old_logp"], x["advantages"], x["token_weights"]).backward()
    return h.grad, w.grad


VARIANTS = {f.__name__: f for f in (floor, fused, naive, selective, liger, liger_compiled, compiled_ref)}


def _status(key: str) -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) / 1024.0  # kB -> MiB
    raise KeyError(key)


def _reset_hwm() -> None:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def peak_extra_mb(fn, x) -> float:
    _reset_hwm()
    base = _status("VmRSS")
    out = fn(x)
    peak = _status("VmHWM")
    del out
    return peak - base


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--variant", required=True, choices=sorted(VARIANTS))
    p.add_argument("--n", type=int, default=2048)
    p.add_argument("--h", type=int, default=576)
    p.add_argument("--v", type=int, default=49152)
    p.add_argument("--threads", type=int, default=2)
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    x = make_inputs(a.n, a.h, a.v)
    fn = VARIANTS[a.variant]
    first = peak_extra_mb(fn, x)
    steady = peak_extra_mb(fn, x)
    print(json.dumps({"variant": a.variant, "n": a.n, "h": a.h, "v": a.v, "peak_extra_mb": round(steady, 1),
                          "first_call_peak_extra_mb": round(first, 1),
                          "nv_fp32_mb": round(a.n * a.v * 4 / 2**20, 1)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
