"""The HF engine's static decoder (rollout.hf_decode=static): its outputs against the loop's on the
real SmolLM2, its compiled step reused across calls and batch sizes of a bucket, the models it
refuses. tests/test_hf_engine.py runs the engine's promises (streams, EOS, horizon, log-probs)
through both decoders."""

from __future__ import annotations

import types

import pytest
import torch
from mentor_fast.kernels import token_logprobs
from mentor_fast.kernels.testing import assert_close_rule
from torch._dynamo.utils import counters

from mentor_fast.config import RolloutConfig
from mentor_fast.models import load_policy, load_tokenizer
from mentor_fast.rollout.base import EngineError, SamplingParams
from mentor_fast.rollout.hf import HFEngine
from mentor_fast.rollout.static import (
    CompileMode,
    DecodeMode,
    bucket,
    resolve_compile,
    resolve_decode,
    unsupported,
)
from mentor_fast.rollout.static_step import grouped_decode_attention

QUESTIONS = [
    "What is 2 + 2?",
    "Tom has 17 apples and gives away 5. How many apples are left?",
    "A train travels 60 km in 1.5 hours. What is its average speed in km/h?",
    "Name the largest planet in the solar system.",
    "Sara reads 12 pages a day. How many pages does she read in a week?",
]


@pytest.fixture(scope="module")
def tok_tiny(tiny_model_path):
    return load_tokenizer(tiny_model_path)


@pytest.fixture(scope="module")
def smollm2(smollm2_path):
    tok = load_tokenizer(smollm2_path)
    prompts = [tok(tok.apply_chat_template([{"role": "user", "content": q}], tokenize=False,
                                           add_generation_prompt=True), add_special_tokens=False)["input_ids"]
               for q in QUESTIONS]
    return load_policy(smollm2_path, "float32"), tok, prompts


def engine(model, tok, decode: str, compile_mode: str = "none", backend: str = "inductor", **cfg) -> HFEngine:
    return HFEngine(model, tok, RolloutConfig(hf_decode=decode, hf_compile=compile_mode, **cfg), compile_backend=backend)


def trainer_logprobs(model, prompt: list[int], s, temperature: float) -> torch.Tensor:
    """What the update recomputes for a sampled sequence (rollout/logp_mismatch's other side): the
    decoder's hidden states of prompt + completion in one unpadded forward, then the loss head's K1."""
    device = model.lm_head.weight.device
    with torch.no_grad():
        ids = torch.tensor([prompt + s.token_ids], device=device)
        hidden = model.model(input_ids=ids).last_hidden_state[0, len(prompt) - 1: -1]
    return token_logprobs(hidden, model.lm_head.weight, torch.tensor(s.token_ids, device=device), temperature).cpu()


def compare_with_loop(model, tok, prompts, compile_mode: str, backend: str = "inductor") -> None:
    """Greedy and sampled (same seeds) outputs of the static decoder equal the loop's, and its
    sampler log-probs are as close to the trainer's forward as the loop's (2x rule, max and mean)."""
    greedy = SamplingParams(n=1, max_new_tokens=24, greedy=True)
    sampled = SamplingParams(n=2, max_new_tokens=16, temperature=0.8, top_p=0.95, seed=4)
    loop, static = engine(model, tok, "loop"), engine(model, tok, "static", compile_mode, backend)
    for params in (greedy, sampled):
        want, got = loop.generate(prompts, params), static.generate(prompts, params)
        assert [[s.token_ids for s in g] for g in got] == [[s.token_ids for s in g] for g in want]
        assert [[s.finish_reason for s in g] for g in got] == [[s.finish_reason for s in g] for g in want]
        t = 1.0 if params.greedy else params.temperature
        ref = torch.cat([trainer_logprobs(model, p, s, t) for p, g in zip(prompts, want) for s in g])
        flat = lambda out: torch.tensor([lp for g in out for s in g for lp in s.logprobs])
        assert_close_rule(f"static vs trainer ({compile_mode}, greedy={params.greedy})", flat(got), ref, flat(want))
    assert any(s.finish_reason == "stop" for g in want for s in g)  # some answer ended before the limit


def test_static_decoder_matches_the_loop_on_smollm2(smollm2):
    """The decoder's own code, eager (hf_compile=none), on the real model and chat prompts."""
    compare_with_loop(*smollm2, compile_mode="none")


@pytest.mark.slow  # inductor's CPU codegen: about a minute per graph on 2 cores (greedy and sampled: two)
def test_compiled_static_decoder_matches_the_loop_on_smollm2(smollm2):
    """The step as a GPU runs it, less the CUDA graph: compiled by inductor (hf_compile=default)."""
    compare_with_loop(*smollm2, compile_mode="default")


def test_compiled_step_is_reused_across_calls_and_batch_sizes_of_a_bucket(tiny_model_path):
    """dynamo (backend "eager": its tracing, guards and recompiles, without inductor's codegen)
    compiles one graph per (batch bucket, cache length, sampling setting), and later calls reuse it:
    another seed, another batch size in the bucket, another prompt width under the same power of
    two. The cache length only grows, so a short prompt after a long one reuses the long one's graph."""
    model, tok = load_policy(tiny_model_path, "float32"), load_tokenizer(tiny_model_path)
    torch._dynamo.reset()
    eng = engine(model, tok, "static", "default", backend="eager")
    plain = engine(model, tok, "static", "none")
    short = [[5, 6, 7, 8, 9], [10, 11, 12], list(range(20, 32))]  # widest 12: 32 prompt columns
    long = [list(range(40, 80))]  # 40 tokens: 64 prompt columns

    def graphs_added(prompts, n, seed=0, greedy=False):
        before = counters["stats"]["unique_graphs"]
        params = SamplingParams(n=n, max_new_tokens=12, seed=seed, greedy=greedy)
        out = eng.generate(prompts, params)
        assert [[s.token_ids for s in g] for g in out] == [[s.token_ids for s in g] for g in plain.generate(prompts, params)]
        return counters["stats"]["unique_graphs"] - before

    assert graphs_added(short, 3) == 1  # 9 rows: bucket 16
    assert graphs_added(short, 4, seed=7) == 0  # 12 rows, another seed: bucket 16 again
    assert graphs_added(short[:2], 3) == 1  # 6 rows: bucket 8
    assert graphs_added(short[1:2], 5) == 0  # 5 rows, a narrower prompt: bucket 8, 32 columns
    assert graphs_added(short, 1, greedy=True) == 1  # greedy: another sampling setting, its own graph
    assert graphs_added(long + short[:1], 6) == 1  # 12 rows, 64 prompt columns: a longer cache
    assert graphs_added(short, 5) == 0  # 15 rows: the longer cache's graph serves the short prompts too


def test_a_step_that_cannot_compile_stops_with_an_error_naming_the_key(tiny_model_path):
    """Fault injection: a forward hook with a graph break in it (what a hook that prints or calls an
    untraceable library does; the step's fullgraph compile refuses one, since it would cut the CUDA
    graph) stops the call with an error that names rollout.hf_decode and the way out."""

    def breaking_hook(module, args, out):
        torch._dynamo.graph_break()
        return out

    model, tok = load_policy(tiny_model_path, "float32"), load_tokenizer(tiny_model_path)
    handle = model.lm_head.register_forward_hook(breaking_hook)
    try:
        with pytest.raises(EngineError, match=r"rollout.hf_decode=static: compiling the decode step .*"
                                              r"rollout.hf_decode=loop decodes without it"):
            engine(model, tok, "static", "default", backend="eager").generate([[5, 6, 7]], SamplingParams(n=2))
    finally:
        handle.remove()


def test_grouped_decode_attention_reads_each_kv_head_once_with_the_same_scores():
    """A decode step of a GQA layer (8 query heads on 2 K/V heads, a padding and cache mask): SDPA on
    the K/V heads as they are, each head's 4 queries as 4 queries, equals transformers' SDPA with K/V
    copied to every head (2x rule against fp64); a prefill (several queries) goes to the fallback."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(3, h, 1 if h == 8 else 40, 16, generator=g) for h in (8, 2, 2))
    mask = torch.arange(40)[None, None, None, :] >= torch.tensor([0, 7, 30])[:, None, None, None]  # [B, 1, 1, L]
    module = types.SimpleNamespace(num_key_value_groups=4, is_causal=True)
    seen = []

    def fallback(*args, **kwargs):
        seen.append(args[1].shape[2])
        return sdpa_attention_forward(*args, **kwargs)

    got, _ = grouped_decode_attention(module, q, k, v, mask, scaling=0.25, fallback=fallback)
    same, _ = sdpa_attention_forward(module, q, k, v, mask, scaling=0.25)
    ref, _ = sdpa_attention_forward(module, q.double(), k.double(), v.double(), mask, scaling=0.25)
    assert got.shape == same.shape == (3, 1, 8, 16) and not seen
    assert_close_rule("grouped decode attention", got, ref, same)
    prefill = torch.randn(3, 8, 5, 16, generator=g)
    grouped_decode_attention(module, prefill, k, v, mask.expand(3, 1, 5, 40), scaling=0.25, fallback=fallback)
    assert seen == [5]


def test_grouped_query_model_decodes_static_like_the_loop(tok_tiny, tmp_path):
    """A GQA Llama (4 query heads, 2 K/V heads) through the engine: the static decoder (whose decode
    steps take the grouped attention) samples the loop's tokens, log-probs within 1e-4."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tok_tiny), hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=2048,
                         pad_token_id=tok_tiny.pad_token_id, eos_token_id=tok_tiny.eos_token_id)
    LlamaForCausalLM(config).save_pretrained(tmp_path)
    gqa = load_policy(tmp_path, "float32")
    seen = []
    gqa.model.layers[0].self_attn.register_forward_pre_hook(lambda m, a: seen.append(gqa.config._attn_implementation))
    params = SamplingParams(n=3, max_new_tokens=8, seed=2, temperature=0.7)
    prompts = [[5, 6, 7, 8, 9], list(range(10, 30))]
    want = engine(gqa, tok_tiny, "loop").generate(prompts, params)
    seen.clear()
    got = engine(gqa, tok_tiny, "static").generate(prompts, params)
    assert set(seen) == {"mentor_fast_static_mentor_fast_sdpa_gqa"} and gqa.config._attn_implementation == "sdpa"
    assert [[s.token_ids for s in g_] for g_ in got] == [[s.token_ids for s in g_] for g_ in want]
    gap = max(abs(a - b) for x, y in zip(got, want) for s, t in zip(x, y) for a, b in zip(s.logprobs, t.logprobs))
    assert gap < 1e-4, gap


def test_buckets_and_modes_resolve():
    assert [bucket(n, 8) for n in (1, 8, 9, 16, 17, 64, 65)] == [8, 8, 16, 16, 32, 64, 128]
    assert [bucket(n, 32) for n in (5, 33, 200)] == [32, 64, 256]
    assert resolve_compile("auto", torch.device("cpu")) is CompileMode.DEFAULT
    assert resolve_compile("auto", torch.device("cuda")) is CompileMode.REDUCE_OVERHEAD
    assert resolve_compile("none", torch.device("cuda")) is CompileMode.NONE


def test_auto_decodes_with_the_loop_on_a_cpu_and_static_refuses_sliding_windows(tiny_model_path, tmp_path):
    """auto is the loop off CUDA; a model with sliding-window layers cannot take the static decoder's
    one full-attention mask: static says so naming the key, auto keeps the loop."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    tiny = load_policy(tiny_model_path, "float32")
    assert unsupported(tiny) is None
    tiny.config._attn_implementation = "eager"  # it would add the boolean mask to the scores
    assert "needs model.attn_implementation=sdpa" in unsupported(tiny)
    tiny.config._attn_implementation = "sdpa"
    assert resolve_decode("auto", tiny) is DecodeMode.LOOP and resolve_decode("static", tiny) is DecodeMode.STATIC
    config = Qwen2Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                         num_key_value_heads=1, use_sliding_window=True, sliding_window=16, max_window_layers=1)
    sliding = Qwen2ForCausalLM(config)
    assert "sliding_attention" in unsupported(sliding)
    with pytest.raises(ValueError, match="rollout.hf_decode=static cannot decode this model"):
        resolve_decode("static", sliding)
    assert resolve_decode("auto", sliding) is DecodeMode.LOOP


@pytest.mark.gpu
def test_static_decoder_on_cuda_graphs(tiny_model_path):
    """On CUDA, auto is the static decoder in CUDA graphs: one graph for both calls (two batch
    sizes of one bucket), no CUDA graph skipped, and its sampler log-probs as close to the trainer's
    forward as the loop's (a stale graph decodes from the wrong context, far outside that)."""
    model, tok = load_policy(tiny_model_path, "float32").cuda(), load_tokenizer(tiny_model_path)
    prompts = [[5, 6, 7, 8, 9], list(range(10, 30))]
    torch._dynamo.reset()
    eng, loop = HFEngine(model, tok, RolloutConfig()), HFEngine(model, tok, RolloutConfig(hf_decode="loop"))
    assert eng.decode_mode is DecodeMode.STATIC
    before = counters["stats"]["unique_graphs"]
    flat = lambda out: torch.tensor([lp for g in out for s in g for lp in s.logprobs])
    for n in (5, 6):  # 10 and 12 rows: bucket 16
        params = SamplingParams(n=n, max_new_tokens=32, seed=n)
        got, want = eng.generate(prompts, params), loop.generate(prompts, params)
        # each against the trainer's forward of its own tokens: near-uniform random logits can tip a draw
        gap, loop_gap = ((flat(out) - torch.cat([trainer_logprobs(model, p, s, 1.0) for p, g in zip(prompts, out)
                                                 for s in g])).abs() for out in (got, want))
        print(f"n={n}: static gap max {gap.max():.2e} mean {gap.mean():.2e}; loop {loop_gap.max():.2e} "
              f"{loop_gap.mean():.2e}")
        assert gap.mean() <= 2 * loop_gap.mean() + 1e-5 and gap.max() <= 2 * loop_gap.max() + 1e-4
    assert counters["stats"]["unique_graphs"] - before == 1
    assert not counters["inductor"]["cudagraph_skips"], dict(counters["inductor"])
