"""Backend registry, the `self` backend (policy through the rollout engine) and the `local` backend
(a second HF model via generate), on the tiny random Llama with SmolLM2's real tokenizer."""

import json
import typing

import pytest

from mentor_fast.algo.assemble import ASSEMBLERS, LossMode
from mentor_fast.config import AgentsConfig, MentorLossConfig, RerollConfig, RolloutConfig
from mentor_fast.config.recovery import RerollSchedule
from mentor_fast.mentor import (
    BACKENDS,
    SCHEDULES,
    BackendKind,
    LLMAgents,
    LocalBackend,
    Mentor,
    OpenAIBackend,
    SelfBackend,
    WorkedSolutions,
    build_backend,
)
from mentor_fast.mentor.testing import (
    CharPromptBuilder,
    exact_score,
    ladder_problem,
    make_group,
    mentor_configs,
    scripted_generate,
)
from mentor_fast.rollout.base import SamplingParams
from mentor_fast.types import Sample


def test_registries_cover_the_config_choices():
    assert typing.get_type_hints(AgentsConfig)["backend"] is BackendKind and set(BACKENDS) == set(BackendKind)
    assert typing.get_type_hints(RerollConfig)["schedule"] is RerollSchedule and set(SCHEDULES) == set(RerollSchedule)
    modes = set(typing.get_args(typing.get_type_hints(MentorLossConfig)["mode"]))
    assert modes == {str(m) for m in ASSEMBLERS} == {str(m) for m in LossMode}


def test_build_backend_by_kind():
    assert isinstance(build_backend(AgentsConfig()), WorkedSolutions)
    b = build_backend(AgentsConfig(backend="openai", model="m", base_url="http://127.0.0.1:9/v1", retries=3))
    assert (
        isinstance(b, OpenAIBackend) and b.retries == 3 and b.url == "http://127.0.0.1:9/v1/chat/completions"
    )
    assert isinstance(build_backend(AgentsConfig(backend="local", model_path="tiny-llama")), LocalBackend)
    with pytest.raises(ValueError, match="engine"):
        build_backend(AgentsConfig(backend="self"))
    with pytest.raises(ValueError, match="model_path"):
        build_backend(AgentsConfig(backend="local"))
    with pytest.raises(ValueError, match="mentor.agents.model"):
        build_backend(AgentsConfig(backend="openai"))
    assert BackendKind("self") is BackendKind.SELF and str(BackendKind.SELF) == "self"


@pytest.fixture(scope="module")
def tokenizer(tiny_model_path):
    from mentor_fast.models import load_tokenizer

    return load_tokenizer(tiny_model_path)


class FakeEngine:
    """A RolloutEngine that replies with scripted text (token ids from the real tokenizer)."""

    def __init__(self, tokenizer, reply, max_context=4096):
        self.tok, self.reply, self.max_context_tokens, self.policy_version = tokenizer, reply, max_context, 3
        self.calls = []

    def generate(self, prompts, params):
        self.calls.append((prompts, params))
        ids = self.tok(self.reply, add_special_tokens=False)["input_ids"] + [self.tok.eos_token_id]
        return [[Sample(ids, [-0.1] * len(ids), "stop", 3)] * params.n for _ in prompts]


def test_self_backend_uses_the_chat_template_and_the_engine(tokenizer):
    reply = json.dumps(
        {"diagnosis": {"failure_type": "arithmetic slip"}, "hint_l1": "Recheck the subtraction."}
    )
    engine = FakeEngine(tokenizer, reply)
    backend = SelfBackend(engine, tokenizer, seed=11)
    msgs = [
        [{"role": "system", "content": "s"}, {"role": "user", "content": f"question {i}"}] for i in range(3)
    ]
    assert backend.complete(msgs, max_tokens=40, temperature=0.0) == [reply] * 3
    prompts, params = engine.calls[0]
    expected = tokenizer.apply_chat_template(msgs[1], add_generation_prompt=True, tokenize=False)
    assert tokenizer.decode(prompts[1]) == expected  # the template, with the generation prompt
    assert params.n == 1 and params.greedy and params.max_new_tokens == 40 and len(prompts) == 3
    backend.complete(msgs[:1], 40, 0.7)
    assert not engine.calls[1][1].greedy and engine.calls[1][1].temperature == 0.7
    assert engine.calls[1][1].seed != params.seed  # each call samples afresh
    short = SelfBackend(FakeEngine(tokenizer, reply, max_context=len(prompts[0]) + 10), tokenizer)
    assert short.complete(msgs[:1], max_tokens=40, temperature=0.0) == [None]
    assert short.counts.snapshot() == {"errors/too_long": 1}


def test_self_backend_mentor_on_the_real_hf_engine(tiny_model_path, tokenizer):
    """The tiny random policy as its own mentor through HFEngine: real generate calls, noise out,
    so the diagnosis is garbage (one retry) and the group goes on without a hint."""
    from mentor_fast.models import load_policy
    from mentor_fast.rollout.hf import HFEngine

    engine = HFEngine(load_policy(tiny_model_path), tokenizer, RolloutConfig())
    backend = SelfBackend(engine, tokenizer)
    out = backend.complete([[{"role": "user", "content": "Say hi."}]], max_tokens=6, temperature=0.0)
    assert isinstance(out[0], str) and out == backend.complete(
        [[{"role": "user", "content": "Say hi."}]], 6, 0.0
    )
    agents = LLMAgents(backend, max_tokens=8, hint_max_tokens=4, temperature=0.0)
    mentor = Mentor(
        *mentor_configs("agents.backend=self", "trigger.max_groups_frac=1.0", "trigger.collapse_abs=1.0"),
        agents,
        CharPromptBuilder(),
    )
    groups = [make_group(ladder_problem(), ["\\boxed{1}"] * 2)]
    res = mentor.intervene(
        groups, 0, scripted_generate(lambda p, k: "\\boxed{1}"), exact_score, SamplingParams(n=2)
    )
    assert (
        res.metrics["mentor/garbage"] == 1
        and res.metrics["mentor/no_hint"] == 1
        and res.groups[0] is groups[0]
    )


def test_local_backend_generates_with_a_second_model(tiny_model_path):
    backend = LocalBackend(str(tiny_model_path), seed=0, batch_size=2)
    msgs = [[{"role": "user", "content": f"Count to {i}."}] for i in range(3)]
    greedy = backend.complete(msgs, max_tokens=5, temperature=0.0)
    assert len(greedy) == 3 and all(isinstance(t, str) and t for t in greedy)
    assert backend.complete(msgs, max_tokens=5, temperature=0.0) == greedy  # greedy is deterministic
    import torch

    before = torch.random.get_rng_state()
    sampled = backend.complete(msgs[:1], max_tokens=5, temperature=1.0)
    assert torch.equal(before, torch.random.get_rng_state())  # the trainer's RNG stream is untouched
    assert sampled == backend.complete(msgs[:1], max_tokens=5, temperature=1.0)  # seeded
