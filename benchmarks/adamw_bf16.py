"""bf16 AdamW moments (optim.state_dtype=bfloat16) against fp32 AdamW, on the same gradients.

    python benchmarks/adamw_bf16.py [--steps 300] [--lr 1e-3] [--out FILE]

The tiny Llama trains on next-token loss over ladder prompts with torch's fp32 AdamW; every
step's gradients are also handed to two copies of the weights stepped by AdamWBF16States, with
stochastic rounding and with round-to-nearest. Reported: the optimizer-state bytes per parameter,
and per copy the drift ||theta - theta_fp32|| / ||theta_fp32 - theta_0|| at the end, and the median
relative error of one step's update against fp32 AdamW's over the last half of the run. Same
gradients for all three, so what differs is only how the moments are stored.
"""

from __future__ import annotations

import argparse
import copy
import json
import random

import torch

from mentor_fast.data.chat import PromptBuilder
from mentor_fast.data.ladder import make_problem
from mentor_fast.models import load_policy, load_tokenizer, resolve_model_path
from mentor_fast.optim import AdamWBF16States
from mentor_fast.tasks.math import SYSTEM_PROMPT as MATH_SYSTEM_PROMPT


def _flat(model) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    torch.manual_seed(0)
    path = resolve_model_path("tiny-llama")
    builder = PromptBuilder(load_tokenizer(path), MATH_SYSTEM_PROMPT, 512)
    rng = random.Random(0)
    ref = load_policy(path).train()
    copies = {"bf16 stochastic": copy.deepcopy(ref), "bf16 nearest": copy.deepcopy(ref)}
    opts = {"fp32": torch.optim.AdamW(ref.parameters(), lr=args.lr),
            "bf16 stochastic": AdamWBF16States(copies["bf16 stochastic"].parameters(), lr=args.lr),
            "bf16 nearest": AdamWBF16States(copies["bf16 nearest"].parameters(), lr=args.lr, stochastic=False)}
    stream = torch.tensor([t for _ in range(400) for t in builder.encode(make_problem(rng.choice([1, 2, 3]), rng))])
    theta0 = _flat(ref)
    errors: dict[str, list[float]] = {k: [] for k in copies}
    for step in range(args.steps):
        ids = torch.stack([stream[s : s + 64] for s in torch.randint(0, len(stream) - 64, (4,)).tolist()])
        loss = ref(input_ids=ids, labels=ids).loss
        ref.zero_grad(set_to_none=True)
        loss.backward()
        before = {k: _flat(m) for k, m in copies.items()}
        prev_ref = _flat(ref)
        for name, model in copies.items():
            for p, q in zip(model.parameters(), ref.parameters()):
                p.grad = q.grad.clone()
        opts["fp32"].step()
        update_ref = _flat(ref) - prev_ref
        for name, model in copies.items():
            opts[name].step()
            if step >= args.steps // 2:
                upd = _flat(model) - before[name]
                errors[name].append(float((upd - update_ref).norm() / update_ref.norm()))
    moved = float((_flat(ref) - theta0).norm())
    n = theta0.numel()
    rows = [{"optimizer": "fp32 AdamW", "state_bytes_per_param": 8.0, "drift": 0.0, "update_rel_err": 0.0}]
    for name, model in copies.items():
        state = sum(t.numel() * t.element_size() for s in opts[name].state.values() for t in s.values() if t.dim())
        rows.append({"optimizer": f"AdamWBF16States ({name})", "state_bytes_per_param": state / n,
                     "drift": float((_flat(model) - _flat(ref)).norm()) / moved,
                     "update_rel_err": float(torch.tensor(errors[name]).median())})
    meta = {"model": "tiny-llama", "params": n, "steps": args.steps, "lr": args.lr, "torch": torch.__version__}
    for row in rows:
        print(json.dumps(row))
    if args.out:
        with open(args.out, "w") as f:
            for row in rows:
                f.write(json.dumps(meta | row) + "\n")


if __name__ == "__main__":
    main()
