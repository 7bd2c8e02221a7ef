#!/usr/bin/env python
"""HF-engine decode on CPU: transformers' "sdpa" attention against the engine's grouped-K/V attention.

    .venv/bin/python benchmarks/decode_attention.py --checkpoint PATH [--reps 2]

Two tables, A/B alternated within each repetition, medians printed:
1. one decode step of the policy (S sequences, a context of L tokens, a few rows left-padded);
2. `HFEngine.generate_many` on ladder prompts with and without the reference mentor's level-3 hint
   (the hint makes the prompt ~37 tokens longer), as MENTOR's merged re-rolls do.
The second table shows that a hinted row costs more than a plain one: it pads every row of the
call to its longer prompt. The larger part of MENTOR's generation cost is its extra row-steps
(re-roll rows, which also run longer); see benchmarks/decode_trace.py.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from mentor_fast.config import load_config
from mentor_fast.data import PromptBuilder, build_source
from mentor_fast.mentor.reference import cold_hint
from mentor_fast.models import load_policy, load_tokenizer, resolve_model_path
from mentor_fast.rollout.base import SamplingParams
from mentor_fast.rollout.hf import HFEngine


def decode_step_ms(model, rows: int, context: int, steps: int = 12) -> float:
    torch.manual_seed(rows + context)
    ids = torch.randint(100, 1000, (rows, context))
    mask = torch.ones(rows, context, dtype=torch.long)
    mask[: max(1, rows // 8), : context // 3] = 0  # some left padding, as in a real batch
    times = []
    with torch.no_grad():
        cache = model(input_ids=ids, attention_mask=mask, use_cache=True).past_key_values
        tok = ids[:, -1:]
        for k in range(steps):
            mask = torch.cat([mask, mask.new_ones(rows, 1)], 1)
            t = time.perf_counter()
            model(input_ids=tok, attention_mask=mask, position_ids=torch.full((rows, 1), context + k),
                  past_key_values=cache, use_cache=True)
            times.append(time.perf_counter() - t)
    return 1000 * statistics.median(times)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", default="smollm2-135m-instruct", help="HF model folder or model name")
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--max-new-tokens", type=int, default=96)
    args = p.parse_args()
    torch.set_num_threads(2)
    path = resolve_model_path(args.checkpoint)
    tok, model = load_tokenizer(path), load_policy(path, "float32").eval()
    engines = {on: HFEngine(model, tok, load_config([], [f"rollout.hf_gqa_attention={str(on).lower()}"]).rollout)
               for on in (False, True)}
    name = {False: "transformers sdpa", True: "grouped K/V"}

    print("| rows | context | " + " | ".join(f"{name[on]} ms/step" for on in (False, True)) + " |")
    print("|---|---|---|---|")
    for rows, context in ((4, 55), (4, 92), (32, 55), (32, 92)):
        ms = {on: [] for on in (False, True)}
        for _ in range(args.reps):
            for on in (False, True):
                with engines[on].attention():
                    ms[on].append(decode_step_ms(model, rows, context))
        print(f"| {rows} | {context} | " + " | ".join(f"{statistics.median(ms[on]):.0f}" for on in (False, True))
              + " |", flush=True)

    cfg = load_config([], ["data.levels=[3]"])
    builder = PromptBuilder(tok, cfg.data.system_prompt, cfg.data.max_prompt_tokens)
    problems = build_source(cfg.data, 0).eval_problems(8, levels=[3])
    plain = [builder.encode(q) for q in problems[:4]]
    hinted = [builder.encode(q, cold_hint(q, 3)) for q in problems[4:]]

    def params(n: int, seed: int) -> SamplingParams:
        return SamplingParams(n=n, max_new_tokens=args.max_new_tokens, seed=seed)

    cases = {
        "4 prompts x 8": lambda r: [(plain, params(8, r))],
        "4 prompts x 9": lambda r: [(plain, params(9, r))],
        "4 hinted prompts x 8": lambda r: [(hinted, params(8, r))],
        "4 prompts x 8 + 4 hinted x 1": lambda r: [(plain, params(8, r)), (hinted, params(1, 100 + r))],
        "4 prompts x 8 + 4 hinted x 4": lambda r: [(plain, params(8, r)), (hinted, params(4, 100 + r))],
    }
    print("\n| generate_many | rows | longest completion | " + " | ".join(f"{name[on]} s" for on in (False, True))
          + " |")
    print("|---|---|---|---|---|")
    for case, requests in cases.items():
        secs = {on: [] for on in (False, True)}
        for r in range(args.reps):
            for on in (False, True):
                t = time.perf_counter()
                out = engines[on].generate_many(requests(r))
                secs[on].append(time.perf_counter() - t)
        lens = [len(s.token_ids) for req in out for group in req for s in group]
        print(f"| {case} | {len(lens)} | {max(lens)} | "
              + " | ".join(f"{statistics.median(secs[on]):.1f}" for on in (False, True)) + " |", flush=True)


if __name__ == "__main__":
    main()
