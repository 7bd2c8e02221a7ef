"""HFEngine: sampling, seeding, log-probs, EOS handling and what it leaves behind, on the tiny Llama.

The engine's promises are tested for both decode modes where they could differ: "loop" and "static"
(the static-cache decoder, here uncompiled: `hf_compile=none`, the compiled step's code run eagerly;
tests/test_hf_static.py compiles it). The static runs look for ended rows every 2 steps, so
compaction into smaller buckets happens in them."""

from __future__ import annotations

import copy
import dataclasses
import math
from types import SimpleNamespace

import pytest
import torch
from helpers import EOS, eos_bias_hook

from mentor_fast.config import RolloutConfig
from mentor_fast.models import load_policy, load_tokenizer
from mentor_fast.rollout.base import RolloutEngine, SamplingParams, refuse_horizon
from mentor_fast.rollout.hf import CPU_GQA_ATTENTION, HFEngine, eos_token_ids
from mentor_fast.rollout.sampling import sample_tokens

QUESTIONS = ["What is 2 + 2?", "Tom has 17 apples and gives away 5. How many apples are left? Explain."]


@pytest.fixture(scope="module")
def tok(tiny_model_path):
    return load_tokenizer(tiny_model_path)


@pytest.fixture(scope="module")
def model(tiny_model_path):
    return load_policy(tiny_model_path, "float32")


@pytest.fixture(scope="module")
def prompts(tok):
    texts = [tok.apply_chat_template([{"role": "user", "content": q}], tokenize=False, add_generation_prompt=True)
             for q in QUESTIONS]
    ids = [tok(t, add_special_tokens=False)["input_ids"] for t in texts]
    assert len(ids[0]) < len(ids[1])  # prompt 0 gets left padding in a batch with prompt 1
    return ids


DECODES = ["loop", "static"]


def engine(model, tok, batch_size: int = 64, decode: str = "loop") -> HFEngine:
    return HFEngine(model, tok, RolloutConfig(hf_batch_size=batch_size, hf_decode=decode, hf_compile="none",
                                              hf_sync_every=2))


def teacher_forced_logprobs(model, prompt: list[int], completion: list[int], temperature: float) -> torch.Tensor:
    """log_softmax(logits / T)[token] for each completion token, from one full unpadded forward."""
    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1]
    z = logits.double() if logits.dtype == torch.float64 else logits.float()  # the engine's fp32 math
    return torch.log_softmax(z / temperature, -1).double().gather(-1, torch.tensor(completion)[:, None]).squeeze(-1)


def assert_close_to_ref(got: torch.Tensor, same_precision: torch.Tensor, ref: torch.Tensor, atol: float) -> None:
    """STYLE.md tolerance rule: |got - ref64| <= 2 * |torch same precision - ref64| + atol, elementwise max."""
    err, base = (got - ref).abs(), (same_precision - ref).abs()
    bound = 2 * base.max().item() + atol
    print(f"max err {err.max().item():.3e} mean {err.mean().item():.3e}; "
          f"same-precision max {base.max().item():.3e}; bound {bound:.3e}")
    bad = (err > bound).nonzero()
    assert bad.numel() == 0, f"first bad index {bad[0].tolist()}: got {got[tuple(bad[0])]}, ref {ref[tuple(bad[0])]}"


def test_engine_follows_protocol(model, tok):
    eng = engine(model, tok)
    assert isinstance(eng, RolloutEngine)
    assert eng.max_context_tokens == 2048 and eng.policy_version == 0


def test_n_samples_per_prompt_and_version(model, tok, prompts):
    eng = engine(model, tok)
    out = eng.generate(prompts, SamplingParams(n=3, max_new_tokens=5, seed=1))
    assert [len(g) for g in out] == [3, 3]
    for group in out:
        for s in group:
            # the random model puts ~1/49k on EOS: every row runs to the limit
            assert len(s.token_ids) == len(s.logprobs) == 5 and s.finish_reason == "length"
            assert all(-math.log(49152) - 3 < lp < 0 for lp in s.logprobs)
            assert s.policy_version == 0
        assert len({tuple(s.token_ids) for s in group}) == 3  # the n samples differ
    eng.update_weights(model, 3)
    again = eng.generate(prompts[:1], SamplingParams(n=2, max_new_tokens=2, seed=1))
    assert eng.policy_version == 3 and {s.policy_version for s in again[0]} == {3}


def test_same_seed_same_tokens_other_seed_other_tokens(model, tok, prompts):
    eng = engine(model, tok)
    params = SamplingParams(n=2, max_new_tokens=6, seed=7)
    a, b = eng.generate(prompts, params), eng.generate(prompts, params)
    c = eng.generate(prompts, SamplingParams(n=2, max_new_tokens=6, seed=8))
    ids = lambda out: [s.token_ids for g in out for s in g]
    assert ids(a) == ids(b)
    assert [s.logprobs for g in a for s in g] == [s.logprobs for g in b for s in g]
    assert all(x != y for x, y in zip(ids(a), ids(c)))


@pytest.mark.parametrize("decode", DECODES)
def test_merged_requests_give_what_separate_calls_give(model, tok, prompts, decode):
    """generate_many decodes several requests in one loop (the async mentor merges its first re-roll
    round into the next step's call); every sequence keeps the stream of its own request."""
    a = SamplingParams(n=3, max_new_tokens=6, seed=3)
    b = SamplingParams(n=2, max_new_tokens=6, seed=11)
    eng = engine(model, tok, decode=decode)
    merged = eng.generate_many([(prompts, a), (prompts[1:], b)])
    separate = [eng.generate(prompts, a), eng.generate(prompts[1:], b)]
    ids = lambda out: [[[s.token_ids for s in g] for g in req] for req in out]
    assert ids(merged) == ids(separate)
    assert [len(g) for g in merged[1]] == [2]
    for x, y in zip(merged[0][0], separate[0][0]):
        assert max(abs(p - q) for p, q in zip(x.logprobs, y.logprobs)) < 1e-4
    with pytest.raises(ValueError, match="may differ in n, seed and keys"):
        eng.generate_many([(prompts, a), (prompts, SamplingParams(n=2, max_new_tokens=7, seed=3))])


@pytest.mark.parametrize("decode", DECODES)
def test_samples_do_not_depend_on_padding_neighbours_or_chunking(model, tok, prompts, decode):
    """Static: 6 rows and 3 rows share a batch bucket (8), chunks of 2 another; padding slots too."""
    params = SamplingParams(n=3, max_new_tokens=6, seed=3)
    together = engine(model, tok, decode=decode).generate(prompts, params)  # prompt 0 left-padded next to prompt 1
    alone = engine(model, tok, decode=decode).generate(prompts[:1], params)
    chunked = engine(model, tok, batch_size=2, decode=decode).generate(prompts, params)  # a group split over chunks
    assert [s.token_ids for s in together[0]] == [s.token_ids for s in alone[0]]
    for x, y in zip(together[0], alone[0]):
        assert max(abs(p - q) for p, q in zip(x.logprobs, y.logprobs)) < 1e-4
    assert [[s.token_ids for s in g] for g in together] == [[s.token_ids for s in g] for g in chunked]


def test_cpu_decoding_hands_grouped_kv_to_sdpa_and_matches_transformers(tok, prompts, tmp_path):
    """A GQA model (4 query heads, 2 K/V heads) under a padding mask: inside generate the engine swaps
    in its own attention, and every sampled token's log-prob matches transformers' own "sdpa" on an
    unpadded forward. A mask dropped or a head mapped to the wrong K/V group would not."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tok), hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=2048,
                         pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
    LlamaForCausalLM(config).save_pretrained(tmp_path)
    gqa = load_policy(tmp_path, "float32")
    assert gqa.config._attn_implementation == "sdpa"
    seen = []
    gqa.model.layers[0].self_attn.register_forward_pre_hook(lambda m, a: seen.append(gqa.config._attn_implementation))
    out = engine(gqa, tok).generate(prompts, SamplingParams(n=2, max_new_tokens=6, seed=3, temperature=0.7))
    assert set(seen) == {CPU_GQA_ATTENTION} and gqa.config._attn_implementation == "sdpa"
    for prompt, group in zip(prompts, out):
        for s in group:
            ref = teacher_forced_logprobs(gqa, prompt, s.token_ids, 0.7)
            assert torch.allclose(torch.tensor(s.logprobs, dtype=torch.float64), ref, atol=1e-4, rtol=0)
    seen.clear()  # switched off: transformers' own sdpa, the same tokens
    off = HFEngine(gqa, tok, RolloutConfig(), gqa_attention=False)
    again = off.generate(prompts, SamplingParams(n=2, max_new_tokens=6, seed=3, temperature=0.7))
    assert set(seen) == {"sdpa"}
    assert [s.token_ids for g in again for s in g] == [s.token_ids for g in out for s in g]


@pytest.mark.parametrize("decode", DECODES)
def test_greedy_matches_model_generate(model, tok, prompts, decode):
    out = engine(model, tok, decode=decode).generate(prompts, SamplingParams(n=1, max_new_tokens=8, greedy=True))
    batch = tok.pad([{"input_ids": p} for p in prompts], return_tensors="pt")
    with torch.no_grad():
        ref = model.generate(**batch, max_new_tokens=8, do_sample=False, pad_token_id=tok.pad_token_id)
    assert [g[0].token_ids for g in out] == ref[:, batch["input_ids"].shape[1] :].tolist()


def eos_biased_run(model, tok, prompts, decode: str):
    """Sampled rows on an EOS-biased model (temperature 0.7, top_p 0.9): rows stop at different steps.
    -> (samples, params, the engine's metrics)."""
    handle = model.lm_head.register_forward_hook(eos_bias_hook)
    try:
        params = SamplingParams(n=6, max_new_tokens=10, temperature=0.7, top_p=0.9, seed=11)
        eng = engine(model, tok, decode=decode)
        return eng.generate(prompts, params), params, eng.pop_metrics()
    finally:
        handle.remove()


@pytest.fixture(scope="module", params=DECODES)
def eos_run(model, tok, prompts, request):
    return eos_biased_run(model, tok, prompts, request.param)[:2]


def test_static_decode_gives_the_loops_samples_row_for_row(model, tok, prompts):
    """The static decoder (12 rows in a bucket of 16, the host looking every 2 steps) against the loop,
    on rows that end at different steps: the same tokens, finish reasons and log-probs (the same fp32
    math; the attention sums over masked cache columns too, hence not bit-equal). Its rows moved to
    the bucket of 8 once 8 or fewer were live."""
    loop, _, _ = eos_biased_run(model, tok, prompts, "loop")
    static, _, counts = eos_biased_run(model, tok, prompts, "static")
    flat = lambda out: [s for g in out for s in g]
    assert [(s.token_ids, s.finish_reason) for s in flat(static)] == [(s.token_ids, s.finish_reason) for s in flat(loop)]
    gap = max(abs(p - q) for x, y in zip(flat(static), flat(loop)) for p, q in zip(x.logprobs, y.logprobs))
    assert gap < 1e-4, gap
    # 9 compiled steps after the prefill's token (some rows ran to the limit), one move to a bucket of 8
    assert counts == {"rollout/hf_static_steps": 9.0, "rollout/hf_static_compactions": 1.0}


def test_eos_stops_a_row_and_nothing_follows(eos_run):
    out, params = eos_run
    samples = [s for g in out for s in g]
    reasons = {s.finish_reason for s in samples}
    assert reasons == {"stop", "length"}, reasons
    for s in samples:
        assert len(s.token_ids) == len(s.logprobs)
        if s.finish_reason == "stop":
            assert s.token_ids[-1] == EOS and EOS not in s.token_ids[:-1]
        else:
            assert len(s.token_ids) == params.max_new_tokens and EOS not in s.token_ids
    assert len({len(s.token_ids) for s in samples}) >= 3  # rows really left the batch at different steps


def test_sampler_logprobs_match_teacher_forced_forward(model, tok, prompts, eos_run):
    """The rows here left the batch at different steps, so a wrong cache/row bookkeeping shows up as
    log-probs of the wrong context. T = 0.7 and top_p = 0.9: the reported value is log_softmax(z / T)
    of the raw logits, not the nucleus-renormalised one (which would be higher by ~log(1/0.9) ~ 0.1)."""
    out, params = eos_run
    model64 = copy.deepcopy(model).double()
    hooks = [m.lm_head.register_forward_hook(eos_bias_hook) for m in (model, model64)]
    try:
        got, fp32, ref = [], [], []
        for prompt, group in zip(prompts, out):
            for s in group:
                got.append(torch.tensor(s.logprobs, dtype=torch.float64))
                fp32.append(teacher_forced_logprobs(model, prompt, s.token_ids, params.temperature))
                ref.append(teacher_forced_logprobs(model64, prompt, s.token_ids, params.temperature))
    finally:
        for h in hooks:
            h.remove()
    # The cached, padded decode re-orders the same fp32 sums as the unpadded forward, so it lands
    # within 2x of that forward's own error; atol 1e-6 is one fp32 ulp at |logp| ~ 11 (49k-way
    # near-uniform). A top-p-renormalised or wrong-context value is off by > 1e-2.
    assert_close_to_ref(torch.cat(got), torch.cat(fp32), torch.cat(ref), atol=1e-6)


@pytest.mark.parametrize("decode", DECODES)
def test_generate_restores_training_mode_and_leaves_no_state(model, tok, prompts, decode):
    eng = engine(model, tok, decode=decode)
    use_cache = model.config.use_cache
    model.train()
    model.model.layers[0].eval()  # a mixed state (e.g. a frozen block) comes back as it was
    before = [m.training for m in model.modules()]
    eng.generate(prompts[:1], SamplingParams(n=2, max_new_tokens=3))
    assert [m.training for m in model.modules()] == before and model.training
    assert not model.model.layers[0].training
    assert model.config.use_cache == use_cache and all(p.grad is None for p in model.parameters())
    model.eval()
    eng.generate(prompts[:1], SamplingParams(n=1, max_new_tokens=2))
    assert not model.training
    model.train()


def test_too_long_prompt_is_rejected_not_truncated(model, tok, prompts):
    eng = engine(model, tok)
    too_long = [5] * (2048 - 4 + 1)
    with pytest.raises(ValueError, match=r"prompt 1 has 2045 tokens.*limit is 2044"):
        eng.generate([prompts[0], too_long], SamplingParams(n=1, max_new_tokens=4))
    out = eng.generate([[5] * 2044], SamplingParams(n=1, max_new_tokens=4))  # exactly at the limit
    assert len(out[0][0].token_ids) == 4
    with pytest.raises(ValueError, match="n=2"):
        eng.generate(prompts, SamplingParams(n=2, greedy=True))


def test_bf16_model_samples_with_fp32_logprobs(model, tok, prompts):
    model16 = copy.deepcopy(model).to(torch.bfloat16)
    params = SamplingParams(n=2, max_new_tokens=4, seed=5)
    out = engine(model16, tok).generate(prompts, params)
    model64 = copy.deepcopy(model).double()
    got, bf16, ref = [], [], []
    for prompt, group in zip(prompts, out):
        for s in group:
            assert len(s.token_ids) == 4 and all(isinstance(x, float) for x in s.logprobs)
            got.append(torch.tensor(s.logprobs, dtype=torch.float64))
            bf16.append(teacher_forced_logprobs(model16, prompt, s.token_ids, params.temperature))
            ref.append(teacher_forced_logprobs(model64, prompt, s.token_ids, params.temperature))
    # bf16 logits round at ~4e-3 relative; the decode path rounds differently from the full forward
    # but not worse: the same 2x rule, with the fp32 ulp as atol.
    assert_close_to_ref(torch.cat(got), torch.cat(bf16), torch.cat(ref), atol=1e-6)


def test_sample_tokens_inverse_cdf_top_p_and_reported_logprob():
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    logits = probs.log()[None].repeat(1000, 1)  # [L=1000, V=4]
    u = (torch.arange(1000, dtype=torch.float64) + 0.5) / 1000  # a uniform grid: exact frequencies
    tokens, lp = sample_tokens(logits, u, SamplingParams(temperature=1.0, top_p=1.0))
    assert torch.bincount(tokens, minlength=4).tolist() == [500, 300, 150, 50]
    assert torch.allclose(lp, probs.log()[tokens], atol=1e-6)
    # top_p = 0.7 keeps {0, 1} (mass before token 1 is 0.5 < 0.7, before token 2 is 0.8 > 0.7),
    # renormalised 5:3; the reported log-prob stays that of the full distribution.
    tokens, lp = sample_tokens(logits, u, SamplingParams(temperature=1.0, top_p=0.7))
    assert torch.bincount(tokens, minlength=4).tolist() == [625, 375, 0, 0]
    assert torch.allclose(lp, probs.log()[tokens], atol=1e-6)
    # temperature 0.5 squares the odds: p ~ [0.25, 0.09, 0.0225, 0.0025] / 0.365
    tokens, lp = sample_tokens(logits, u, SamplingParams(temperature=0.5))
    sharp = probs**2 / (probs**2).sum()
    assert torch.allclose(lp, sharp.log()[tokens], atol=1e-6)
    tokens, lp = sample_tokens(logits[:2], u[:2], SamplingParams(n=1, greedy=True))
    assert tokens.tolist() == [0, 0] and torch.allclose(lp, probs.log()[:1].expand(2), atol=1e-6)


def test_eos_ids_include_generation_config():
    tok = SimpleNamespace(eos_token_id=2)
    model = SimpleNamespace(generation_config=SimpleNamespace(eos_token_id=[2, 17]))
    assert eos_token_ids(tok, model) == {2, 17}
    assert eos_token_ids(tok, SimpleNamespace(generation_config=SimpleNamespace(eos_token_id=9))) == {2, 9}


@pytest.mark.parametrize("decode", DECODES)
@pytest.mark.parametrize("batch_size", [64, 3])  # one chunk; then requests[0]'s rows and the rest in separate chunks
def test_horizon_cuts_later_rows_once_the_first_request_has_ended(model, tok, prompts, batch_size, decode):
    """A rider's horizon (SamplingParams.horizon; the mentor's mentor.reroll.horizon): once every row
    of requests[0] has ended, a row of a later request with a horizon is cut at `horizon` times the
    longest of them. Rows that end before the limit, requests[0]'s rows and the rows of a rider
    without a horizon get the tokens they get without one; a cut row gets the first `limit` of them."""
    lead = SamplingParams(n=3, max_new_tokens=16, temperature=0.7, top_p=0.9, seed=5)
    rest = SamplingParams(n=4, max_new_tokens=16, temperature=0.7, top_p=0.9, seed=9)
    requests = [(prompts[:1], lead), (prompts, rest), (prompts, rest)]
    riders = [(prompts[:1], lead), (prompts, dataclasses.replace(rest, horizon=1.0)), (prompts, rest)]
    handle = model.lm_head.register_forward_hook(eos_bias_hook)
    try:
        full = engine(model, tok, decode=decode).generate_many(requests)
        cut = engine(model, tok, batch_size, decode=decode).generate_many(riders)
        for bad in ([(prompts[:1], dataclasses.replace(lead, horizon=1.0))],  # the lead has none
                    [requests[0], (prompts, dataclasses.replace(rest, horizon=0.5))]):
            with pytest.raises(ValueError, match="a horizon is 0 \\(off\\) or >= 1"):
                engine(model, tok).generate_many(bad)
    finally:
        handle.remove()
    assert [[s.token_ids for s in g] for g in cut[0]] == [[s.token_ids for s in g] for g in full[0]]
    assert [[s.token_ids for s in g] for g in cut[2]] == [[s.token_ids for s in g] for g in full[2]]
    limit = max(len(s.token_ids) for s in full[0][0])
    assert limit < lead.max_new_tokens  # the lead rows stopped early, so there is something to cut
    n_cut = 0
    for got, want in zip([s for g in cut[1] for s in g], [s for g in full[1] for s in g]):
        if len(want.token_ids) <= limit:
            assert (got.token_ids, got.finish_reason) == (want.token_ids, want.finish_reason)
        else:
            n_cut += 1
            assert got.finish_reason == "cut" and got.token_ids == want.token_ids[:limit]
            assert len(got.logprobs) == limit
    assert 0 < n_cut < 8, n_cut  # some later rows were cut, and some ended in time


def test_engines_that_cannot_cut_refuse_a_horizon():
    """The vLLM engines' scheduler finishes what it admitted: a request with a horizon is refused
    before anything runs (rollout/base.py refuse_horizon), one without passes."""
    plain = SamplingParams(n=2, max_new_tokens=8)
    refuse_horizon([([[1]], plain), ([[2]], plain)], "vllm")
    with pytest.raises(ValueError, match="cannot cut rows mid-call"):
        refuse_horizon([([[1]], plain), ([[2]], dataclasses.replace(plain, horizon=1.0))], "vllm")
