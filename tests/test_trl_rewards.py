"""TRL's own reward functions, as a user installs them beside the project (`pip install --no-deps trl`).

TRL's GRPOTrainer hands chat-prompt runs' functions conversational completions
([{"role": "assistant", "content": ...}]), the prompts as messages, the dataset's columns and
`completion_ids`; accuracy_reward reads the gold from `solution`. The scorer passes the same.
"""

from __future__ import annotations

import pytest

from mentor_fast.config import RewardConfig, load_config
from mentor_fast.data import PromptBuilder
from mentor_fast.metrics import read_metrics
from mentor_fast.models import load_tokenizer, resolve_model_path
from mentor_fast.rewards import RewardScorer
from mentor_fast.tasks.math import SYSTEM_PROMPT as MATH_SYSTEM_PROMPT
from mentor_fast.trainer import Trainer
from mentor_fast.types import Hint, Problem, Rollout

trl_rewards = pytest.importorskip("trl.rewards", reason="TRL is installed beside the project by `make venv`")

OVERLONG = "trl.rewards:get_soft_overlong_punishment(max_completion_len=16, soft_punish_cache=4)"
TRL_FUNCTIONS = ["trl.rewards:accuracy_reward", "trl.rewards:think_format_reward", OVERLONG]


@pytest.fixture(scope="module")
def builder():
    return PromptBuilder(load_tokenizer(resolve_model_path("tiny-llama")), MATH_SYSTEM_PROMPT, 512)


def _rollout(i: int, text: str, gold: str, n_tokens: int, hint: str | None = None) -> Rollout:
    p = Problem(f"p{i}", f"What is {gold} plus 0?", gold, columns={"difficulty": i})
    r = Rollout(p, i, [1], list(range(n_tokens)), [0.0] * n_tokens, text, "stop", 0)
    if hint is not None:
        r.origin, r.hint = "mentor", Hint(hint, 2)
    return r


def test_trl_functions_score_conversational_rollouts(builder):
    calls = []

    def recorder(prompts, completions, completion_ids, **kwargs):
        calls.append({"prompts": prompts, "completions": completions, "ids": completion_ids, **kwargs})
        return [0.0] * len(completions)

    rollouts = [
        _rollout(0, "<think>\n3 + 0 = 3\n</think>\nSo \\boxed{3}", "3", 10),
        _rollout(1, "I think it is \\boxed{\\frac{1}{2}}", "0.5", 14),
        _rollout(2, "<think>\nno\n</think> \\boxed{7}", "\\frac{7}{2}", 20, hint="Halve it."),
    ]
    with RewardScorer(RewardConfig(functions=TRL_FUNCTIONS), messages=builder.chat) as scorer:
        scorer.functions.append(recorder)
        scorer.names.append("recorder")
        scorer.weights.append(0.0)
        metrics = scorer.score(rollouts)
    assert not [k for k in metrics if k.startswith("reward/errors/")], metrics
    assert metrics["reward/accuracy_reward/mean"] == pytest.approx(2 / 3)  # 3 == 3, 1/2 == 0.5, 7 != 7/2
    assert metrics["reward/think_format_reward/mean"] == pytest.approx(2 / 3)
    # DAPO's soft punishment: 10 tokens <= 12 -> 0; 14 -> (12 - 14) / 4; 20 > 16 -> -1
    assert metrics["reward/get_soft_overlong_punishment/mean"] == pytest.approx((0 - 0.5 - 1) / 3)
    built_in = [1.0, 1.0, 0.0]
    expected = [b + a + t + o for b, a, t, o in zip(built_in, [1, 1, 0], [1, 0, 1], [0, -0.5, -1])]
    assert [r.reward for r in rollouts] == pytest.approx(expected)
    kw = calls[-1]
    assert kw["completions"][0] == [{"role": "assistant", "content": rollouts[0].text}]
    assert kw["prompts"][0] == [{"role": "system", "content": MATH_SYSTEM_PROMPT},
                                {"role": "user", "content": "What is 3 plus 0?"}]
    assert kw["prompts"][2][-1]["content"].endswith("Halve it.")  # the prompt it was sampled under
    assert kw["solution"] == kw["answer"] == kw["gold"] == ["3", "0.5", "\\frac{7}{2}"]
    assert kw["difficulty"] == [0, 1, 2]
    assert [len(x) for x in kw["ids"]] == [10, 14, 20]


def test_string_form_behind_an_option(builder):
    seen = []

    def plain(completions, prompts, **kwargs):
        seen.append((completions, prompts))
        return [float(len(c)) for c in completions]

    cfg = RewardConfig(functions=["trl.rewards:think_format_reward"], functions_format="string")
    with RewardScorer(cfg, messages=builder.chat) as scorer:
        scorer.functions[0], scorer.names[0] = plain, "plain"
        scorer.score([_rollout(0, "abc", "1", 3)])
    assert seen == [(["abc"], ["What is 1 plus 0?"])]
    # and TRL's conversational function in the string form fails the way TRL's would: counted, not fatal
    with RewardScorer(cfg, messages=builder.chat) as scorer:
        metrics = scorer.score([_rollout(0, "<think>x</think>y", "1", 3)])
    assert metrics["reward/errors/think_format_reward/TypeError"] == 1


def test_literal_factory_specs_fail_clearly():
    with pytest.raises(ValueError, match="arguments must be Python literals"):
        RewardScorer(RewardConfig(functions=["trl.rewards:get_soft_overlong_punishment(max_completion_len=n)"]))
    with pytest.raises(ValueError, match="unexpected keyword"):
        RewardScorer(RewardConfig(functions=["trl.rewards:get_soft_overlong_punishment(size=3)"]))


def test_tiny_run_with_trl_functions_has_no_errors(tmp_path):
    cfg = load_config(["configs/tiny_test.yaml"], [
        f"output_dir={tmp_path}", "trainer.max_steps=2", "trainer.tensorboard=false",
        f"reward.functions={TRL_FUNCTIONS}",
    ])
    Trainer(cfg).fit()
    rows = read_metrics(tmp_path / "metrics.jsonl")
    assert len(rows) == 2
    for row in rows:
        assert not [k for k in row if k.startswith("reward/errors/")], row
        for name in ("accuracy_reward", "think_format_reward", "get_soft_overlong_punishment"):
            assert f"reward/{name}/mean" in row
        assert row["reward/get_soft_overlong_punishment/mean"] <= 0.0  # 16 new tokens: in the soft band
