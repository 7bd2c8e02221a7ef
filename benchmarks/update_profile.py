"""The update of one GRPO step on fixed rollouts (no generation): today's settings against the new
path, per micro-batch budget and gradient-checkpointing choice; one table, one JSON.

    python benchmarks/update_profile.py                  # GPU mode when torch sees CUDA, else CPU mode
    python benchmarks/update_profile.py --cpu            # the tiny Llama on the CPU (under a minute)
        [--budget-s S] [--reps N] [--out FILE.json] [--no-profile]    (S: 110 GPU / 50 CPU; N: 5 / 3)

GPU mode: the 0.51B Llama of benchmarks/gpu_check.sh's build_model.py `0p5b` (SmolLM2's 49,152-token
vocabulary, tied embeddings, 24 layers of width 1024, 16 heads of 64, MLP 4864), built in code with
random weights, fp32 master weights under bf16 autocast, the fused loss (loss.is_cap 2), Liger's
kernels where liger-kernel is installed (as the trainer applies them); 4 prompts x G = 8, 49 prompt
tokens and 128 completion tokens each (5,664 tokens), micro_batch_tokens 4096 and 8192. CPU mode: the
tiny test model's shape, 2 x 8 rows of 49 + 16 tokens, budgets 640 and 1280 (the same two-or-one
micro-batches split).

Variants (the update's settings; `today` is the first H200 run's: gradient checkpointing on, padded
rows, torch's foreach AdamW. Its host reads are gone whatever the settings, so `today` here is
today's shapes and work without them):
  today                  model.gradient_checkpointing=true  trainer.packing=false  optim.implementation=foreach
  ckpt on, packed        =true   packing=true
  ckpt off, rows         =false  packing=false  trainer.shared_prompt_forward=false
  ckpt off, shared       =false  packing=false  (each prompt once, completions on its keys/values)
  ckpt off, packed       =false  packing=true
  defaults               =auto   packing=auto   (what a run gets; the table says what auto chose)
Rounds alternate the variants (A/B/C..., medians of --reps rounds; on a GPU after one warm-up call
each, whose first-call costs - Triton compiles, allocator growth - are left out). The CPU mode skips
the warm-up and the churn rows and profiles one variant: it is the script's smoke test for CI. Each timed call ends with a
device synchronize. `churn` rows: today and defaults at the small budget on three further batches
whose completion lengths vary (64-128), each seen once: what a shape the run has not seen costs (Triton
kernels specialised on a new shape compile; Liger's RoPE kernel takes the batch size as a constexpr).

The profile (torch.profiler, one update of today, defaults at both budgets): the top kernels by CUDA
time, cudaStreamSynchronize / cudaDeviceSynchronize calls, device-to-host copies, kernel launches and
aten ops per update (the CPU mode has the ops only). The optimizer rows time one AdamW step alone on the
model's parameters (torch fp32: for_loop / foreach / fused; bf16 moments: loop / foreach). Peak memory
per variant beside the activation estimate that model.gradient_checkpointing=auto uses.
--budget-s: no new round starts after 60% of it, no churn or profile row after 85%, no optimizer row after
it (an H200 run fits ~2 min).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import tempfile
import time
from pathlib import Path

import torch

MODES = {
    "gpu": {"dims": {"hidden_size": 1024, "intermediate_size": 4864, "num_hidden_layers": 24,
                     "num_attention_heads": 16, "num_key_value_heads": 16}, "prompts": 4, "group": 8, "prompt_len": 49, "new": 128,
            "budgets": (4096, 8192)},
    "cpu": {"dims": {"hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2,
                     "num_attention_heads": 2, "num_key_value_heads": 2}, "prompts": 2, "group": 8, "prompt_len": 49, "new": 16,
            "budgets": (640, 1280)},
}
# name -> (model.gradient_checkpointing, trainer.packing, trainer.shared_prompt_forward, optim.implementation)
VARIANTS = {
    "today": (True, False, True, "foreach"),
    "ckpt on, packed": (True, True, True, "auto"),
    "ckpt off, rows": (False, False, False, "auto"),
    "ckpt off, shared": (False, False, True, "auto"),
    "ckpt off, packed": (False, True, True, "auto"),
    "defaults": ("auto", "auto", True, "auto"),
}
PROFILED = [("today", 0), ("defaults", 0), ("defaults", 1)]  # (variant, budget index)
RUNTIME_EVENTS = {"syncs": ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize"),
                  "launches": ("cudaLaunchKernel", "cuLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernelEx")}


def build_model(mode: str, device: torch.device):
    """The gpu_check build_model.py model (random init, seed 0): SmolLM2's tokenizer sets the vocabulary
    and special ids where it is at hand, else its known values (49,152 tokens; bos 1, eos = pad 2)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    ids = {"vocab_size": 49152, "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 2}
    tok_dir = Path(__file__).parent / "wheels" / "smollm2-tokenizer"
    if (tok_dir / "tokenizer.json").is_file():
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(tok_dir)
        ids = {"vocab_size": len(tok), "bos_token_id": tok.bos_token_id, "eos_token_id": tok.eos_token_id,
               "pad_token_id": tok.pad_token_id}
    config = LlamaConfig(head_dim=64, max_position_embeddings=2048, tie_word_embeddings=True,
                         attn_implementation="sdpa", **ids, **MODES[mode]["dims"])
    torch.manual_seed(0)
    with torch.device(device):
        model = LlamaForCausalLM(config)
    model.config.use_cache = False
    return model.train()


def make_batch(mode: str, vocab: int, seed: int, lengths: tuple[int, int] | None = None):
    """Fixed rollouts: per prompt G completions of `new` tokens (or lengths drawn in `lengths`), random
    tokens, rewards and sampler log-probs (pi_old is the sampler's with one optimizer step a batch)."""
    from mentor_fast.algo.batch import build_train_batch
    from mentor_fast.config import AdvantageConfig
    from mentor_fast.types import Group, Problem, Rollout

    m, rng = MODES[mode], random.Random(seed)
    groups = []
    for g in range(m["prompts"]):
        prompt = [rng.randrange(3, vocab) for _ in range(m["prompt_len"])]
        problem = Problem(id=f"p{g}", question="", gold="")
        rollouts = []
        for _ in range(m["group"]):
            n = m["new"] if lengths is None else rng.randint(*lengths)
            comp = [rng.randrange(3, vocab) for _ in range(n)]
            rollouts.append(Rollout(problem=problem, group_id=g, prompt_ids=prompt, completion_ids=comp,
                                    sampler_logprobs=[-rng.uniform(5.0, 15.0) for _ in comp], text="",
                                    finish_reason="length", policy_version=0, reward=rng.random(), correct=False))
        groups.append(Group(group_id=g, problem=problem, prompt_ids=prompt, rollouts=rollouts))
    return build_train_batch(groups, AdvantageConfig())


def make_updaters(model, mode: str, device: torch.device, bf16: bool):
    """One PolicyUpdater per (variant, budget); one optimizer per optim.implementation, shared."""
    from mentor_fast.kernels import GRPOOptions

    from mentor_fast.config import OptimConfig, TrainerConfig
    from mentor_fast.update import PolicyUpdater, build_optimizer

    optimizers = {impl: build_optimizer(model, OptimConfig(lr=1e-6, implementation=impl), 10)
                  for impl in {v[3] for v in VARIANTS.values()}}
    options = GRPOOptions(impl="fused", is_cap=2.0, max_completion_len=MODES[mode]["new"],
                          compute_dtype=torch.bfloat16 if bf16 else None)
    updaters = {}
    for name, (ckpt, packing, shared, impl) in VARIANTS.items():
        for budget in MODES[mode]["budgets"]:
            trainer = TrainerConfig(micro_batch_tokens=budget, packing=packing, shared_prompt_forward=shared)
            opt, sched = optimizers[impl]
            updaters[name, budget] = PolicyUpdater(model, opt, sched, options, trainer, OptimConfig(lr=1e-6),
                                                   pad_id=2, checkpointing="auto" if ckpt == "auto" else False)
            updaters[name, budget].wanted_ckpt = ckpt
    return updaters, optimizers


def select(upd) -> None:
    """The model's checkpointing as this variant has it (auto: as its first update decided)."""
    upd.set_checkpointing((upd.wanted_ckpt if upd.wanted_ckpt != "auto" else upd.checkpointing) is True)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed_update(upd, batch, device) -> float:
    select(upd)
    sync(device)
    t0 = time.perf_counter()
    out = upd.update(batch, 0)
    sync(device)
    dt = time.perf_counter() - t0
    float(out["loss"]), float(out["grad_norm"])  # the trainer reads the metrics once, after the update
    return dt


def triton_compiles(cache: Path) -> int:
    return sum(1 for p in cache.rglob("*.json") if not p.name.startswith("__grp__")) if cache.is_dir() else 0


def profile_update(upd, batch, device) -> dict:
    """One update under torch.profiler: per-update counts and the top kernels by device time."""
    from torch.profiler import ProfilerActivity, profile

    select(upd)
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    sync(device)
    with profile(activities=acts) as prof:
        upd.update(batch, 0)
        sync(device)
    avg = prof.key_averages()
    count = lambda names: sum(e.count for e in avg if e.key in names)
    dev_time = lambda e: getattr(e, "self_device_time_total", getattr(e, "self_cuda_time_total", 0.0))
    kernels = sorted((e for e in avg if dev_time(e) > 0 and not e.key.startswith(("Memcpy", "Memset"))),
                     key=dev_time, reverse=True)
    total = sum(dev_time(e) for e in kernels)
    return {
        "stream_syncs": count(set(RUNTIME_EVENTS["syncs"])),
        "memcpy_dtoh": sum(e.count for e in avg if e.key.startswith("Memcpy DtoH")),
        "kernel_launches": count(set(RUNTIME_EVENTS["launches"])),
        "aten_ops": sum(e.count for e in avg if e.key.startswith("aten::")),
        "device_ms": total / 1e3,
        "top_kernels": [{"name": e.key[:90], "ms": dev_time(e) / 1e3, "calls": e.count,
                         "share": dev_time(e) / total if total else 0.0} for e in kernels[:10]],
    }


def optimizer_rows(model, device, deadline: float) -> list[dict]:
    """One AdamW step alone on the model's parameters with random gradients (median of 5 after 2)."""
    from mentor_fast.config import OptimConfig
    from mentor_fast.optim import build_optimizer

    for p in model.parameters():
        p.grad = torch.randn_like(p) * 1e-3
    rows = []
    for state, impl in [("float32", "for_loop"), ("float32", "foreach"), ("float32", "fused"),
                        ("bfloat16", "for_loop"), ("bfloat16", "foreach")]:
        if time.time() > deadline:
            rows.append({"optimizer": f"{state} {impl}", "skipped": "time budget"})
            continue
        try:
            opt, _ = build_optimizer(model, OptimConfig(lr=1e-9, state_dtype=state, implementation=impl), 10)
            times = []
            for _ in range(7):
                sync(device)
                t0 = time.perf_counter()
                opt.step()
                sync(device)
                times.append(time.perf_counter() - t0)
            rows.append({"optimizer": f"{state} {impl}", "median_ms": 1e3 * statistics.median(times[2:])})
        except (RuntimeError, ValueError) as e:  # fused AdamW where this torch has none for the device
            rows.append({"optimizer": f"{state} {impl}", "error": f"{type(e).__name__}: {str(e)[:120]}"})
        finally:
            opt = None
    model.zero_grad(set_to_none=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cpu", action="store_true", help="the tiny model on the CPU (automatic without CUDA)")
    ap.add_argument("--reps", type=int, default=None)
    ap.add_argument("--budget-s", type=float, default=None)
    ap.add_argument("--out", default="")
    ap.add_argument("--no-profile", action="store_true")
    args = ap.parse_args()
    mode = "cpu" if args.cpu or not torch.cuda.is_available() else "gpu"
    args.reps = args.reps or (5 if mode == "gpu" else 3)
    args.budget_s = args.budget_s or (110.0 if mode == "gpu" else 50.0)
    cache = Path(tempfile.mkdtemp(prefix="update_profile_triton."))
    os.environ.setdefault("TRITON_CACHE_DIR", str(cache))  # a cold cache, counted: compiles show up
    cache = Path(os.environ["TRITON_CACHE_DIR"])
    t_start = time.time()
    # the rounds stop at 60% of the budget, churn and profiles at 85%, so every section gets its turn
    deadline, late, end = (t_start + f * args.budget_s for f in (0.6, 0.85, 1.0))
    device = torch.device("cuda" if mode == "gpu" else "cpu")
    if mode == "gpu":
        torch.set_float32_matmul_precision("high")  # model.tf32, as the recipes run
    from mentor_fast.models import activation_bytes, apply_liger

    model = build_model(mode, device)
    liger = apply_liger(model, "auto", device)
    updaters, _ = make_updaters(model, mode, device, bf16=True)
    batch = make_batch(mode, model.config.vocab_size, seed=0)
    budgets = MODES[mode]["budgets"]
    order = list(updaters)
    times: dict[tuple, list[float]] = {k: [] for k in order}
    peaks: dict[tuple, float] = {}
    # GPU: one call each first (Triton compiles, allocator growth); the CPU has neither
    warm = {k: timed_update(updaters[k], batch, device) if mode == "gpu" else 0.0 for k in order}
    compiles_before = triton_compiles(cache)
    for rep in range(args.reps):
        if time.time() > deadline:
            break
        for k in (order if rep % 2 == 0 else order[::-1]):  # alternate the order round by round
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
            times[k].append(timed_update(updaters[k], batch, device))
            if device.type == "cuda":
                peaks[k] = max(peaks.get(k, 0.0), torch.cuda.max_memory_allocated(device) / 2**30)
    compiles_timed = triton_compiles(cache) - compiles_before
    churn = {}
    for name in ("today", "defaults") if mode == "gpu" else ():  # new shapes cost compiles on a GPU only
        key = (name, budgets[0])
        if time.time() > late:
            break
        before = triton_compiles(cache)
        runs = [timed_update(updaters[key], make_batch(mode, model.config.vocab_size, seed=s, lengths=(
            MODES[mode]["new"] // 2, MODES[mode]["new"])), device) for s in (1, 2, 3)]
        churn[name] = {"ms": [1e3 * t for t in runs], "triton_compiles": triton_compiles(cache) - before}
    profiles = {}
    for name, b in ([] if args.no_profile else PROFILED if mode == "gpu" else PROFILED[1:2]):
        if time.time() > late:
            profiles[f"{name}@{budgets[b]}"] = {"skipped": "time budget"}
            continue
        profiles[f"{name}@{budgets[b]}"] = profile_update(updaters[name, budgets[b]], batch, device)
    opt_rows = optimizer_rows(model, device, end)

    rows = []
    for name, budget in order:
        upd, ts = updaters[name, budget], times[name, budget]
        plan = upd.micro_batches(batch, list(range(batch.num_seqs)))
        fwd = upd.forward_settings
        form = "packed" if fwd.packed else "shared" if fwd.share_prompts else "rows"
        rows.append({"variant": name, "micro_batch_tokens": budget, "median_ms": 1e3 * statistics.median(ts) if ts else None,
                     "min_ms": 1e3 * min(ts) if ts else None, "max_ms": 1e3 * max(ts) if ts else None, "reps": len(ts),
                     "warmup_ms": 1e3 * warm[name, budget],
                     "checkpointing": upd.checkpointing if upd.wanted_ckpt == "auto" else upd.wanted_ckpt,
                     "form": form, "varlen": fwd.varlen and fwd.packed, "micro_batches": len(plan),
                     "peak_gb": peaks.get((name, budget))})
        base = next(r for r in rows if r["variant"] == "today" and r["micro_batch_tokens"] == budget)
        if rows[-1]["median_ms"] and base["median_ms"]:
            rows[-1]["speedup_vs_today"] = base["median_ms"] / rows[-1]["median_ms"]
    est = {b: activation_bytes(model.config, b, torch.bfloat16) / 2**30 for b in budgets}
    result = {"mode": mode, "device": torch.cuda.get_device_name(device) if mode == "gpu" else "cpu",
              "torch": torch.__version__, "liger": liger, "tokens": int(batch.completion_lens.sum() + batch.prompt_lens.sum()),
              "params": sum(p.numel() for p in model.parameters()), "rows": rows, "churn": churn,
              "triton_compiles_in_timed_rounds": compiles_timed, "profiles": profiles, "optimizer": opt_rows,
              "activation_estimate_gb": est, "wall_s": time.time() - t_start}
    print_table(result)
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1))


def print_table(r: dict) -> None:
    print(f"update_profile ({r['mode']}: {r['device']}, torch {r['torch']}, liger {r['liger']}; "
          f"{r['params'] / 1e9:.3f}B params, {r['tokens']} tokens, fp32 master + bf16 autocast, fused loss)")
    head = f"{'variant':18s} {'budget':>6s} {'ckpt':>5s} {'form':>7s} {'mb':>3s} {'median ms':>10s} {'min-max ms':>15s} " \
           f"{'peak GB':>8s} {'x today':>8s}"
    print(head)
    print("-" * len(head))
    for x in r["rows"]:
        med = f"{x['median_ms']:.1f}" if x["median_ms"] else "-"
        span = f"{x['min_ms']:.0f}-{x['max_ms']:.0f}" if x["median_ms"] else "-"
        form = x["form"] + ("/vl" if x["varlen"] else "")
        peak = f"{x['peak_gb']:.2f}" if x["peak_gb"] else "-"
        speed = f"{x['speedup_vs_today']:.2f}" if x.get("speedup_vs_today") else "-"
        print(f"{x['variant']:18s} {x['micro_batch_tokens']:6d} {x['checkpointing']!s:>5s} {form:>7s} "
              f"{x['micro_batches']:3d} {med:>10s} {span:>15s} {peak:>8s} {speed:>8s}")
    for name, c in r["churn"].items():
        print(f"churn {name}: new shapes {', '.join(f'{t:.0f}' for t in c['ms'])} ms, {c['triton_compiles']} Triton compiles")
    print(f"Triton compiles during the timed rounds: {r['triton_compiles_in_timed_rounds']}; activation estimate "
          + ", ".join(f"{b} tokens {gb:.2f} GB" for b, gb in r["activation_estimate_gb"].items()))
    for name, p in r["profiles"].items():
        if "skipped" in p:
            print(f"profile {name}: skipped ({p['skipped']})")
            continue
        print(f"profile {name}: {p['kernel_launches']} launches, {p['stream_syncs']} syncs, {p['memcpy_dtoh']} DtoH, "
              f"{p['aten_ops']} aten ops, {p['device_ms']:.1f} ms on the device; top: "
              + "; ".join(f"{k['name'][:40]} {k['ms']:.1f} ms" for k in p["top_kernels"][:3]))
    print("optimizer step: " + ", ".join(
        f"{o['optimizer']} {o['median_ms']:.1f} ms" if "median_ms" in o else f"{o['optimizer']} {o.get('error') or o.get('skipped')}"
        for o in r["optimizer"]))
    print(f"wall {r['wall_s']:.0f} s")


if __name__ == "__main__":
    main()
