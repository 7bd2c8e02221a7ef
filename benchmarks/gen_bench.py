"""Generation time of the HF engine's decode modes against transformers' own `generate`, one batch.

    python benchmarks/gen_bench.py [--out FILE]          # CPU: the tiny Llama, 4 prompts x 2 x 24 tokens
    python benchmarks/gen_bench.py --shapes smollm2      # CPU: the real SmolLM2-135M, the same batch
    python benchmarks/gen_bench.py --gpu [--out FILE]    # CUDA: a 0.51B Llama, 4 prompts x 8 x 128 tokens
                                                         # (bf16), then a Qwen2.5-1.5B shape, 64 x 8 x 512

Rows, each on the same prompts, sampled at T = 1 (the random models never pick EOS, so every row
decodes the same number of tokens):
- loop: the HF engine's eager loop (`rollout.hf_decode=loop`), what a GRPO step runs today;
- static: its static-cache, compiled decode (`hf_decode=static`, `hf_compile=auto`: CUDA graphs on a
  GPU); "first" includes the compile;
- static_eager (CPU only): the same decoder uncompiled (`hf_compile=none`);
- hf_eager / hf_static: `model.generate` with the dynamic cache / `cache_implementation="static"`
  (transformers compiles that decode step on CUDA only, so on the CPU it runs uncompiled);
- hf_batching: transformers' continuous batching (`generate_batch`), one global seed.
Steady-state times are medians over calls alternated across rows (A/B/A/B), after a first call
each. Budget (--budget-s): static and the loop always run (a first call and one steady call
each; on the Qwen shape static only), the other rows and calls only while time is left; the
Qwen-shaped section starts only with 80 s left (from a budget of 160 s or more the 0.51B section
leaves it those). The JSON is written after each section. Checks (exit 1 if one fails): static had
a steady-state call, compiled nothing after its first call, ran no graph without its CUDA graph
(inductor's cudagraph_skips; the log says why), and its sampler log-probs agree with a full
forward of the same tokens (the trainer's `rollout/logp_mismatch`: mean |logp_sampler -
logp_forward|) within 2x of the loop's own gap + 1e-4 (a stale CUDA graph decodes from the wrong
context: it would be off by far more). The table gives tokens/s and each row's speed-up over the
loop.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from types import SimpleNamespace

import torch

from mentor_fast.config import RolloutConfig
from mentor_fast.rollout.base import SamplingParams
from mentor_fast.rollout.hf import HFEngine

SHAPES = {  # name -> (model dims, prompts, n, new tokens); the 0p5b dims are gpu_check.sh's build_model.py 0p5b
    "0p5b": ({"arch": "llama", "vocab_size": 49152, "hidden_size": 1024, "intermediate_size": 4864,
              "num_hidden_layers": 24, "num_attention_heads": 16, "num_key_value_heads": 16, "head_dim": 64}, 4, 8, 128),
    "qwen1p5b": ({"arch": "qwen2", "vocab_size": 151936, "hidden_size": 1536, "intermediate_size": 8960,
                  "num_hidden_layers": 28, "num_attention_heads": 12, "num_key_value_heads": 2}, 64, 8, 512),
    "tiny": ("tiny-llama", 4, 2, 24),  # built-in models: the tiny test model, the real SmolLM2-135M
    "smollm2": ("smollm2-135m-instruct", 4, 4, 32),
}


QWEN_RESERVE_S = 80.0  # the Qwen-shaped section starts with this much of the budget left, or not at all


def build(shape: str, device: str):
    """(model, tokenizer-like) for a shape: random weights, bf16 on a GPU."""
    if isinstance(SHAPES[shape][0], str):
        from mentor_fast.models import load_policy, load_tokenizer, resolve_model_path

        path = resolve_model_path(SHAPES[shape][0])
        return load_policy(path, "float32").to(device), load_tokenizer(path)
    dims = dict(SHAPES[shape][0])
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    cls, cfg_cls = {"llama": (LlamaForCausalLM, LlamaConfig), "qwen2": (Qwen2ForCausalLM, Qwen2Config)}[dims.pop("arch")]
    config = cfg_cls(max_position_embeddings=4096, tie_word_embeddings=True, bos_token_id=1, eos_token_id=2,
                     pad_token_id=0, **dims)
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    with torch.device(device):
        model = cls(config)
    model = model.to(torch.bfloat16 if device == "cuda" else torch.float32).eval()
    return model, SimpleNamespace(eos_token_id=2, pad_token_id=0)  # the engine reads only these two


def make_prompts(shape: str, vocab: int) -> list[list[int]]:
    """Prompt lengths 24-88 tokens (chat-templated questions), ids away from the special tokens."""
    g = torch.Generator().manual_seed(1)
    n = SHAPES[shape][1]
    return [torch.randint(3, vocab, (int(torch.randint(24, 89, (1,), generator=g)),), generator=g).tolist()
            for _ in range(n)]


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


class Row:
    """One way to generate the batch: run() -> (generated tokens, samples or None)."""

    def __init__(self, name: str, run):
        self.name, self.run = name, run
        self.first_s: float | None = None
        self.times: list[float] = []
        self.tokens = 0
        self.samples = None
        self.compiles_after_first = 0
        self.cudagraph_skips = 0  # graphs inductor ran without a CUDA graph (reduce-overhead asked for one)
        self.peak_gb: float | None = None


def engine_row(name, model, tok, prompts, params, **cfg) -> Row:
    engine = HFEngine(model, tok, RolloutConfig(hf_batch_size=len(prompts) * params.n, **cfg))

    def run():
        out = engine.generate(prompts, params)
        return sum(len(s.token_ids) for g in out for s in g), out

    return Row(name, run)


def generate_row(name, model, prompts, params, device, **kw) -> Row:
    """transformers' generate on the same rows: each prompt repeated n times, left-padded."""
    rows = [p for p in prompts for _ in range(params.n)]
    width = max(map(len, rows))
    ids = torch.tensor([[0] * (width - len(p)) + p for p in rows], device=device)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in rows], device=device)

    def run():
        with torch.no_grad():
            out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=params.max_new_tokens,
                                 do_sample=True, temperature=1.0, top_p=1.0, top_k=0, pad_token_id=0, **kw)
        return (out[:, width:] != 0).sum().item(), None

    return Row(name, run)


def batching_row(model, prompts, params) -> Row:
    """transformers' continuous batching (`generate_batch`), its KV pages sized for this batch (left
    to itself it takes most of the free memory: on a CPU, the machine's). One global seed, no
    per-sequence streams: a reference for speed, not a mode the engine could use."""
    from transformers import ContinuousBatchingConfig, GenerationConfig

    rows = [p for p in prompts for _ in range(params.n)]
    page = 256
    pages = sum(-(-(len(p) + params.max_new_tokens) // page) for p in rows)
    cb = ContinuousBatchingConfig(page_size=page, num_blocks=pages + 8, max_batch_tokens=max(2048, sum(map(len, rows))))
    gen = GenerationConfig(max_new_tokens=params.max_new_tokens, do_sample=True, temperature=1.0, top_p=1.0, top_k=0,
                           eos_token_id=2, pad_token_id=0)

    def run():
        out = model.generate_batch(inputs=rows, generation_config=gen, continuous_batching_config=cb,
                                   progress_bar=False)
        return sum(len(o.generated_tokens) for o in out.values()), None

    return Row("hf_batching", run)


def compile_counts() -> tuple[int, int]:
    """(graphs dynamo compiled, CUDA graphs inductor skipped) so far in this process."""
    from torch._dynamo.utils import counters

    return counters["stats"]["unique_graphs"], counters["inductor"]["cudagraph_skips"]


def timed(row: Row, device: str) -> None:
    graphs, skips = compile_counts()
    sync(device)
    t0 = time.perf_counter()
    row.tokens, samples = row.run()
    sync(device)
    dt = time.perf_counter() - t0
    row.cudagraph_skips += compile_counts()[1] - skips
    if row.first_s is None:
        row.first_s, row.samples = dt, samples
    else:
        row.times.append(dt)
        row.compiles_after_first += compile_counts()[0] - graphs


def logp_gap(model, prompts, samples, limit: int = 8) -> float:
    """Mean |sampler log-prob - full-forward log-prob| over the first `limit` sequences' tokens: the
    trainer's rollout/logp_mismatch, recomputed here with one unpadded forward per sequence."""
    from mentor_fast.kernels import token_logprobs

    device = next(model.parameters()).device
    diffs = []
    seqs = [(p, s) for p, group in zip(prompts, samples) for s in group][:limit]
    with torch.no_grad():
        for prompt, s in seqs:
            ids = torch.tensor([prompt + s.token_ids], device=device)
            hidden = model.model(input_ids=ids).last_hidden_state[0, len(prompt) - 1: -1]
            lp = token_logprobs(hidden.float(), model.lm_head.weight.float(), torch.tensor(s.token_ids, device=device),
                                1.0)
            diffs.append((lp.double().cpu() - torch.tensor(s.logprobs, dtype=torch.float64)).abs())
    return torch.cat(diffs).mean().item()


def section(shape: str, device: str, deadline: float, reps: int, hf_rows: bool) -> dict:
    t_start = time.perf_counter()
    model, tok = build(shape, device)
    _, _, n, t = SHAPES[shape]
    prompts = make_prompts(shape, model.config.vocab_size)
    params = SamplingParams(n=n, max_new_tokens=t, temperature=1.0, seed=0)
    rows = [engine_row("static", model, tok, prompts, params, hf_decode="static"),  # in priority order
            engine_row("loop", model, tok, prompts, params, hf_decode="loop")]
    if hf_rows:
        rows += [generate_row("hf_static", model, prompts, params, device, cache_implementation="static"),
                 generate_row("hf_eager", model, prompts, params, device), batching_row(model, prompts, params)]
    if device == "cpu":
        rows.append(engine_row("static_eager", model, tok, prompts, params, hf_decode="static", hf_compile="none"))
    skipped = {}
    # the comparison the section is for runs whatever the budget: static and the loop (on the large
    # shape only static: its loop alone can take a minute, so it starts with a minute to spare)
    forced = {"static"} if shape == "qwen1p5b" else {"static", "loop"}

    def first_call(row: Row) -> None:
        if row.name not in forced and time.perf_counter() + (60 if shape == "qwen1p5b" else 0) > deadline:
            skipped[row.name] = "time budget"
            return
        if device == "cuda":
            torch.cuda.reset_peak_memory_stats()
        try:
            timed(row, device)
        except Exception as e:  # noqa: BLE001 - transformers' APIs move between versions: a row, not a crash
            skipped[row.name] = f"{type(e).__name__}: {str(e)[:150]}"
            return
        if device == "cuda":
            row.peak_gb = torch.cuda.max_memory_allocated() / 1e9
        print(f"[{shape}] {row.name}: first call {row.first_s:.2f} s", flush=True)

    def steady(group: list[Row]) -> None:  # one call each, alternated, while time is left (a forced row's first)
        for row in group:
            left = deadline - time.perf_counter()
            if row.first_s is not None and ((statistics.median(row.times) if row.times else 0) < left
                                            or (row.name in forced and not row.times)):
                timed(row, device)

    for row in rows[:2]:
        first_call(row)
    steady(rows[:2])
    for row in rows[2:]:
        first_call(row)
    ran = [r for r in rows if r.first_s is not None]
    for _ in range(reps - 1):
        steady(ran)
    steady(rows[2:])  # the later rows' remaining call
    base = next((r for r in ran if r.name == "loop" and r.times), None)
    out = {"shape": shape, "prompts": len(prompts), "n": n, "max_new_tokens": t, "rows": [], "skipped": skipped,
           "prompt_lens": [len(p) for p in prompts]}
    gaps = {r.name: logp_gap(model, prompts, r.samples) for r in ran if r.samples is not None}
    for r in ran:
        steady = statistics.median(r.times) if r.times else None
        out["rows"].append({
            "row": r.name, "first_s": r.first_s, "steady_s": steady, "calls": len(r.times), "tokens": r.tokens,
            "tokens_per_s": r.tokens / steady if steady else None,
            "x_loop": base and steady and statistics.median(base.times) / steady,
            "compiles_after_first": r.compiles_after_first, "cudagraph_skips": r.cudagraph_skips, "peak_gb": r.peak_gb,
            "logp_gap": gaps.get(r.name)})
    out["section_s"] = time.perf_counter() - t_start
    del model
    if device == "cuda":
        torch.cuda.empty_cache()
    return out


def checks(sections: list[dict]) -> list[str]:
    bad = []
    for sec in sections:
        rows = {r["row"]: r for r in sec["rows"]}
        st, lp = rows.get("static"), rows.get("loop")
        if not sec["rows"] and sec["skipped"] == {"all rows": "time budget"}:
            continue  # a section the budget left out is a skipped row, not a failure
        if st is None:
            bad.append(f"{sec['shape']}: the static row did not run")
            continue
        if st["compiles_after_first"]:
            bad.append(f"{sec['shape']}: static compiled {st['compiles_after_first']} graph(s) after its first call")
        if st["cudagraph_skips"]:
            bad.append(f"{sec['shape']}: static ran {st['cudagraph_skips']} graph(s) without CUDA graphs (see the log)")
        if not st["calls"]:
            bad.append(f"{sec['shape']}: static had no steady-state call within the budget")
        if lp is not None and st["logp_gap"] > 2 * lp["logp_gap"] + 1e-4:
            bad.append(f"{sec['shape']}: static logp gap {st['logp_gap']:.2e} > 2 x loop's {lp['logp_gap']:.2e} + 1e-4")
    return bad


def table(sections: list[dict]) -> str:
    fmt = lambda v, f: "-" if v is None else format(v, f)
    head = "| shape | row | first call s | steady s (calls) | tokens/s | x loop | compiles after 1st | logp gap | peak GB |"
    lines = [head, "|---|---|---|---|---|---|---|---|---|"]
    for sec in sections:
        for r in sec["rows"]:
            lines.append(f"| {sec['shape']} {sec['prompts']}x{sec['n']}x{sec['max_new_tokens']} | {r['row']} | "
                         f"{r['first_s']:.2f} | {fmt(r['steady_s'], '.3f')} ({r['calls']}) | "
                         f"{fmt(r['tokens_per_s'], ',.0f')} | {fmt(r['x_loop'], '.2f')} | {r['compiles_after_first']} | "
                         f"{fmt(r['logp_gap'], '.1e')} | {fmt(r['peak_gb'], '.2f')} |")
        for name, why in sec["skipped"].items():
            lines.append(f"| {sec['shape']} | {name} | skipped: {why} | | | | | | |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpu", action="store_true", help="the GPU shapes (needs CUDA)")
    ap.add_argument("--shapes", default="", help="comma-separated shapes (default: tiny; with --gpu 0p5b,qwen1p5b)")
    ap.add_argument("--reps", type=int, default=0, help="steady-state calls per row (default: 3 with --gpu, 2 on the CPU)")
    ap.add_argument("--budget-s", type=float, default=0.0,
                    help="no row starts after this many seconds of the run (default: 150 with --gpu, 50 on the CPU); "
                         "a row started in time runs to its end, so allow ~60 s more")
    ap.add_argument("--no-hf", action="store_true", help="skip transformers' generate rows")
    ap.add_argument("--out", default="", help="write the results as JSON here")
    args = ap.parse_args()
    t0 = time.perf_counter()
    if args.gpu and not torch.cuda.is_available():
        sys.exit("gen_bench: --gpu needs CUDA")
    device = "cuda" if args.gpu else "cpu"
    shapes = args.shapes.split(",") if args.shapes else (["0p5b", "qwen1p5b"] if args.gpu else ["tiny"])
    budget = args.budget_s or (150.0 if args.gpu else 50.0)
    reps = args.reps or (3 if args.gpu else 2)
    deadline = t0 + budget
    meta = {"device": torch.cuda.get_device_name() if args.gpu else platform.processor() or platform.machine(),
            "torch": torch.__version__, "transformers": __import__("transformers").__version__,
            "threads": torch.get_num_threads(), "budget_s": budget}
    sections, bad = [], []
    for i, shape in enumerate(shapes):
        hf_rows = not args.no_hf and shape != "qwen1p5b"  # the large shape: the engine's rows only
        if shape == "qwen1p5b" and time.perf_counter() + QWEN_RESERVE_S > deadline:
            sections.append({"shape": shape, "prompts": SHAPES[shape][1], "n": SHAPES[shape][2],
                             "max_new_tokens": SHAPES[shape][3], "rows": [], "skipped": {"all rows": "time budget"}})
            continue
        # the large shape's static row (its compile and 512 steps) keeps QWEN_RESERVE_S of a budget that has it
        later = QWEN_RESERVE_S if "qwen1p5b" in shapes[i + 1:] and budget >= 2 * QWEN_RESERVE_S else 0.0
        sections.append(section(shape, device, deadline - later, reps, hf_rows))
        bad = checks(sections)
        if args.out:  # after each section: a stage killed at its time limit keeps what had finished
            with open(args.out, "w") as f:
                json.dump({"meta": meta | {"wall_s": time.perf_counter() - t0}, "sections": sections, "failed": bad},
                          f, indent=1)
    print(table(sections))
    print("checks: " + ("ok" if not bad else "FAILED: " + "; ".join(bad)))
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
