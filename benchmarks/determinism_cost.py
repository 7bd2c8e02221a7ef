"""What trainer.deterministic costs: one GRPO update on fixed rollouts with torch's deterministic
algorithms off and on, alternated, and how many different gradients each setting gives when the same
update is repeated (docs/experiments/reproducibility.md says why they differ).

    python benchmarks/determinism_cost.py            # CPU: SmolLM2-135M-Instruct; CUDA: update_profile's 0.51B Llama
    python benchmarks/determinism_cost.py --tiny     # the tiny Llama (seconds: the smoke test gpu_check --cpu runs)
        [--model PATH] [--reps N] [--budget-s S] [--out FILE.json]

The rollouts are update_profile.py's: 4 prompts x 8 completions of random tokens (49 prompt and 128
completion tokens each; the tiny mode 2 x 8 of 49 + 16), so the shared-prompt forward hands each
prompt's last row and keys/values to 8 completions, the gather whose backward adds with atomics. The
update is the trainer's (PolicyUpdater: the fused head, default micro-batch budget; bf16 autocast over
fp32 weights on CUDA, fp32 on the CPU). Before every call the weights and the mini-batch shuffle's
generator are put back, so each call computes the same gradient in exact arithmetic; a hook hashes every
parameter's gradient just before the optimizer step (GradientHashes; the weights after it would hide a
last-bit difference: AdamW's first step is about lr * sign(g)). The hash's time is taken out of the call's.

One untimed call per setting first (allocator growth, Triton compiles), then --reps rounds, each timing
off and on, the order flipping every round (A/B, B/A); medians, the on/off ratio, and per setting the
number of distinct gradients over all its calls. --budget-s: no new round after it.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import update_profile  # the same model builder and rollouts as the update profile

SETTINGS = ("off", "on")
BITS = {4: torch.int32, 2: torch.int16}  # a float's bit pattern as the integer of its width


def load_model(args, device: torch.device):
    """(model, pad id, what it is): the tiny or 0.51B Llama built in code, or a pretrained folder."""
    if args.tiny:
        return update_profile.build_model("cpu", device), 2, "tiny Llama (random)"
    if args.model is None and device.type == "cuda":
        return update_profile.build_model("gpu", device), 2, "0.51B Llama (random)"
    from mentor_fast.models import SMOLLM2, load_policy, resolve_model_path

    path = resolve_model_path(args.model or SMOLLM2)
    model = load_policy(path).to(device).train()
    pad = model.config.pad_token_id if model.config.pad_token_id is not None else model.config.eos_token_id
    return model, int(pad), args.model or SMOLLM2


class GradientHashes:
    """A fingerprint of every parameter's gradient before each optimizer step, and the seconds it took.

    Per tensor the sum of its elements' bit patterns (as integers) and of their squares: integer sums
    are exact in any order, so the fingerprint itself cannot vary, and a change in the last bit of one
    element changes it. Computed where the gradient lives (a GPU's would take seconds to copy out)."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, device: torch.device):
        self.model, self.device, self.seen, self.seconds = model, device, [], 0.0
        optimizer.register_step_pre_hook(self._hook)

    def _hook(self, optimizer, args, kwargs) -> None:
        update_profile.sync(self.device)  # the backward's pending work stays in the update's time
        t0 = time.perf_counter()
        sums = []
        for p in self.model.parameters():
            if p.grad is not None:
                x = p.grad.detach().contiguous().view(BITS[p.grad.element_size()]).long()
                sums.append(torch.stack([x.sum(), (x * x).sum()]))
        self.seen.append(hashlib.blake2b(torch.stack(sums).cpu().numpy().tobytes(), digest_size=16).hexdigest())
        self.seconds += time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tiny", action="store_true", help="the tiny Llama on the CPU (the smoke test)")
    ap.add_argument("--model", default=None, help="a HF model folder or a built-in name (default: see above)")
    ap.add_argument("--reps", type=int, default=None, help="timed rounds (default 3 tiny, 6 otherwise)")
    ap.add_argument("--budget-s", type=float, default=None, help="no new round after this many seconds")
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    from mentor_fast.kernels import GRPOOptions

    from mentor_fast.bench import versions
    from mentor_fast.config import OptimConfig, TrainerConfig
    from mentor_fast.determinism import deterministic_algorithms
    from mentor_fast.optim import build_optimizer
    from mentor_fast.update import PolicyUpdater

    t_start = time.time()
    # cuBLAS reads its workspace setting when its first handle is made, before the first call of either
    # setting here: both run with the deterministic one (the trainer sets it when the setting is on)
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    device = torch.device("cuda" if torch.cuda.is_available() and not args.tiny else "cpu")
    reps = args.reps or (3 if args.tiny else 6)
    model, pad, what = load_model(args, device)
    shape = "cpu" if args.tiny else "gpu"  # update_profile's rollout shapes
    batch = update_profile.make_batch(shape, model.config.vocab_size, seed=0)
    options = GRPOOptions(
        impl="fused",
        is_cap=2.0,
        max_completion_len=update_profile.MODES[shape]["new"],
        compute_dtype=torch.bfloat16 if device.type == "cuda" else None,
    )
    optimizer, scheduler = build_optimizer(model, OptimConfig(lr=1e-6), 10)
    upd = PolicyUpdater(
        model, optimizer, scheduler, options, TrainerConfig(), OptimConfig(lr=1e-6), pad_id=pad
    )
    hashes = GradientHashes(model, optimizer, device)
    start = {k: v.detach().clone() for k, v in model.state_dict().items()}

    def call(setting: str) -> float:
        with torch.no_grad():
            for k, v in model.state_dict().items():
                v.copy_(start[k])
        upd.generator.manual_seed(0)
        before = hashes.seconds
        with deterministic_algorithms(setting == "on"):
            update_profile.sync(device)
            t0 = time.perf_counter()
            out = upd.update(batch, 0)
            float(out["loss"])
            update_profile.sync(device)
            dt = time.perf_counter() - t0
        seen[setting].append(hashes.seen[-1])
        return dt - (hashes.seconds - before)

    seen = {s: [] for s in SETTINGS}
    times = {s: [] for s in SETTINGS}
    for s in SETTINGS:  # untimed first calls
        call(s)
    for rep in range(reps):
        if args.budget_s and time.time() - t_start > args.budget_s:
            break
        for s in SETTINGS if rep % 2 == 0 else SETTINGS[::-1]:
            times[s].append(call(s))
    rows = {
        s: {
            "median_s": statistics.median(times[s]) if times[s] else None,
            "min_s": min(times[s], default=None),
            "max_s": max(times[s], default=None),
            "timed_calls": len(times[s]),
            "calls": len(seen[s]),
            "distinct_gradients": len(set(seen[s])),
        }
        for s in SETTINGS
    }
    ratio = (
        rows["on"]["median_s"] / rows["off"]["median_s"]
        if rows["off"]["median_s"] and rows["on"]["median_s"]
        else None
    )
    result = {
        "model": what,
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "machine": versions(),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "tokens": int(batch.completion_lens.sum() + batch.prompt_lens.sum()),
        "rollouts": batch.num_seqs,
        "rows": rows,
        "on_over_off": ratio,
        "wall_s": time.time() - t_start,
    }
    print(
        f"determinism_cost: {what} on {result['device']} ({result['machine'].get('cpu', '?')}, {result['threads']} threads), "
        f"torch {result['torch']}; one update of {result['rollouts']} rollouts, {result['tokens']} tokens"
    )
    for s in SETTINGS:
        r = rows[s]
        med = f"{r['median_s'] * 1e3:.1f} ms" if r["median_s"] else "-"
        span = f"{r['min_s'] * 1e3:.0f}-{r['max_s'] * 1e3:.0f} ms" if r["median_s"] else "-"
        print(
            f"  deterministic {s:3s}: median {med:>12s} ({span}, {r['timed_calls']} timed); "
            f"{r['distinct_gradients']} distinct gradient(s) in {r['calls']} calls"
        )
    print(f"  on / off: {ratio:.2f}x" if ratio else "  on / off: -")
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
