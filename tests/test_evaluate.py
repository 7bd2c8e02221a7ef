"""Evaluation: the unbiased pass@k estimator, the per-problem JSONL and the summary it is averaged into."""

from __future__ import annotations

import json
import math

import pytest

from mentor_fast.config import DataConfig, RolloutConfig
from mentor_fast.data import PromptBuilder, build_source
from mentor_fast.evaluate import evaluate, main, pass_at_k
from mentor_fast.models import load_policy, load_tokenizer
from mentor_fast.rewards import verify
from mentor_fast.rollout.base import SamplingParams
from mentor_fast.rollout.hf import HFEngine
from mentor_fast.tasks.math import SYSTEM_PROMPT as MATH_SYSTEM_PROMPT
from mentor_fast.types import Problem, Sample

RECORD_FIELDS = {"id", "question", "gold", "level", "source", "n", "correct", "completions", "correct_flags",
                 "extracted", "notes", "tokens", "finish_reasons"}


def verify_batch(completions: list[str], problems: list[Problem]):
    """The real math checker, in-process (no worker pool to start in a unit test)."""
    return [verify(c, p.gold, timeout_s=None) for c, p in zip(completions, problems, strict=True)]


def test_pass_at_k_hand_values():
    assert pass_at_k(10, 3, 1) == pytest.approx(0.3, abs=1e-12)
    assert pass_at_k(10, 3, 5) == pytest.approx(1 - 21 / 252, abs=1e-12)  # 1 - C(7,5)/C(10,5) = 0.91666...
    assert pass_at_k(10, 0, 5) == 0.0
    assert pass_at_k(10, 8, 3) == 1.0  # n - c = 2 < k: every 3-subset holds a correct sample
    assert pass_at_k(4, 4, 4) == 1.0 and pass_at_k(1, 0, 1) == 0.0


def test_pass_at_k_matches_binomials_and_rejects_bad_input():
    for n in (1, 5, 16, 64):
        for c in range(n + 1):
            for k in range(1, n + 1):
                exact = 1 - math.comb(n - c, k) / math.comb(n, k)
                assert pass_at_k(n, c, k) == pytest.approx(exact, abs=1e-12), (n, c, k)
    assert pass_at_k(1000, 1, 500) == pytest.approx(0.5, abs=1e-12)  # C(1000, 500) overflows a float
    for bad in [(4, 5, 1), (4, -1, 1), (4, 1, 0), (4, 1, 5)]:
        with pytest.raises(ValueError):
            pass_at_k(*bad)


class ScriptedEngine:
    """Answers problem i correctly in its first `correct[i]` samples (by \\boxed{gold}), wrongly after."""

    def __init__(self, tok, golds: list[str], correct: list[int], max_context_tokens: int = 10_000):
        self.tok, self.golds, self.correct = tok, golds, correct
        self.max_context_tokens, self.policy_version = max_context_tokens, 0
        self.calls: list[SamplingParams] = []

    def generate(self, prompts, params):
        self.calls.append(params)
        out = []
        for i in range(len(prompts)):
            group = []
            for j in range(params.n):
                good = j < self.correct[i] if not params.greedy else self.correct[i] > 0
                text = f"The answer is \\boxed{{{self.golds[i]}}}." if good else "Hmm. " * 120 + "\\boxed{-1}"
                ids = self.tok(text, add_special_tokens=False)["input_ids"]
                group.append(Sample(ids, [-1.0] * len(ids), "stop", 0))
            out.append(group)
        return out


def test_evaluate_known_counts_give_exact_pass_at_k(tiny_model_path, tmp_path):
    tok = load_tokenizer(tiny_model_path)
    problems = [Problem(f"p{i}", f"What is {i} + {i}?", str(2 * i)) for i in range(4)]
    problems.append(Problem("long", "What is " + " + ".join(["1"] * 400) + "?", "400"))
    correct = [0, 1, 3, 8]
    engine = ScriptedEngine(tok, [p.gold for p in problems], correct, max_context_tokens=8 + 300)
    builder = PromptBuilder(tok, "Answer in \\boxed{}.", max_prompt_tokens=10_000)
    out = tmp_path / "problems.jsonl"
    summary = evaluate(engine, builder, verify_batch, problems, n=8, ks=[4, 8, 16], max_new_tokens=8,
                       greedy=True, seed=3, out_jsonl=out)
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["id"] for r in records] == ["p0", "p1", "p2", "p3"]  # "long" does not fit 300 tokens
    assert summary["skipped_too_long"] == 1 and summary["count"] == 4
    assert [r["correct"] for r in records] == correct
    assert summary["ks"] == [1, 4, 8]  # k = 16 > n is not reported
    assert summary["pass@1"] == pytest.approx((0 + 1 / 8 + 3 / 8 + 1) / 4)
    assert summary["pass@4"] == pytest.approx((0 + 0.5 + (1 - math.comb(5, 4) / math.comb(8, 4)) + 1) / 4)
    assert summary["pass@8"] == pytest.approx(3 / 4)
    assert summary["greedy_acc"] == pytest.approx(3 / 4)
    assert records[1]["extracted"] == ["2"] + ["-1"] * 7 and records[1]["correct_flags"] == [True] + [False] * 7
    assert len(records[1]["completions"][1]) == 503 and records[1]["completions"][1].endswith("...")  # cut
    sampled, greedy = engine.calls
    assert (sampled.n, sampled.seed, sampled.greedy) == (8, 3, False) and (greedy.n, greedy.greedy) == (1, True)


@pytest.fixture(scope="module")
def tiny_engine(tiny_model_path):
    tok = load_tokenizer(tiny_model_path)
    return HFEngine(load_policy(tiny_model_path), tok, RolloutConfig()), tok


def test_evaluate_tiny_model_on_ladder_writes_consistent_jsonl(tiny_engine, tmp_path):
    engine, tok = tiny_engine
    problems = build_source(DataConfig(levels=[1, 2]), seed=0).eval_problems(3)
    builder = PromptBuilder(tok, MATH_SYSTEM_PROMPT, 512)
    out = tmp_path / "eval_problems.jsonl"
    verdicts = []

    def checker(completions, problems):
        vs = verify_batch(completions, problems)
        verdicts.extend(vs)
        return vs

    summary = evaluate(engine, builder, checker, problems, n=3, ks=[1, 2, 3], max_new_tokens=6, greedy=True,
                       seed=0, out_jsonl=out)
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(records) == summary["count"] == 3 and len(verdicts) == 3 * 3 + 3
    for p, r in zip(problems, records):
        assert RECORD_FIELDS | {"pass@1", "pass@2", "pass@3", "greedy"} <= set(r)
        assert (r["id"], r["question"], r["gold"], r["level"], r["n"]) == (p.id, p.question, p.gold, p.level, 3)
        assert all(len(r[f]) == 3 for f in ("completions", "correct_flags", "extracted", "notes", "tokens"))
        assert r["correct"] == sum(r["correct_flags"])
        assert all(1 <= t <= 6 for t in r["tokens"]) and all(len(c) <= 503 for c in r["completions"])
        assert set(r["greedy"]) >= {"text", "correct", "extracted", "note", "tokens", "finish_reason"}
    for k in (1, 2, 3):
        assert summary[f"pass@{k}"] == pytest.approx(sum(pass_at_k(3, r["correct"], k) for r in records) / 3)
    assert summary["greedy_acc"] == pytest.approx(sum(r["greedy"]["correct"] for r in records) / 3)
    assert summary["mean_completion_tokens"] == pytest.approx(sum(sum(r["tokens"]) for r in records) / 9)


def test_cli_writes_summary_and_problems(tiny_model_path, tmp_path, capsys):
    rc = main(["--data", "ladder", "--levels", "1", "--n", "2", "--k", "1,2,8", "--limit", "2", "--greedy",
               "--out", str(tmp_path), "model.path=tiny-llama", "rollout.max_new_tokens=4", "reward.workers=1"])
    assert rc == 0
    summary = json.loads((tmp_path / "eval_summary.json").read_text())
    records = [json.loads(x) for x in (tmp_path / "eval_problems.jsonl").read_text().splitlines()]
    assert summary["count"] == len(records) == 2 and summary["ks"] == [1, 2] and "greedy_acc" in summary
    assert {r["level"] for r in records} == {1} and all(len(r["completions"]) == 2 for r in records)
    assert "pass@2" in capsys.readouterr().out


def test_hinted_prompts_carry_the_level_hint_and_never_the_answer(tiny_model_path):
    """`mentor-fast eval --hint-level L`: each prompt ends its user turn with the reference
    mentor's level-L hint for the first solution step (level 3 states that step's result)."""
    from mentor_fast.evaluate import HintedPrompts
    from mentor_fast.mentor import leaks_answer

    tok = load_tokenizer(tiny_model_path)
    builder = PromptBuilder(tok, "Answer in \\boxed{}.", max_prompt_tokens=10_000)
    problem = build_source(DataConfig(levels=[3]), 0).eval_problems(1, levels=[3])[0]
    first, _last = problem.solution_steps
    plain = tok.decode(builder.encode(problem))
    for level in (1, 2, 3):
        text = tok.decode(HintedPrompts(builder, level).encode(problem))
        hint = text[len(plain) - len("<|im_end|>\n<|im_start|>assistant\n") :]
        assert first.split(" = ")[0] in hint and not leaks_answer(hint, problem.gold)
        assert (first.split(" = ")[1] in hint) == (level == 3), (level, hint)
