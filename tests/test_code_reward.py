"""The `code` reward kind: completions -> programs -> sandboxed tests -> verdicts, through the same
scorer as math; the config rules around it; isolation that is missing or switched off."""

from __future__ import annotations

import logging

import pytest

from mentor_fast.config import CodeRewardConfig, ConfigError, RewardConfig, load_config
from mentor_fast.rewards import RewardScorer
from mentor_fast.rewards import sandbox as sandbox_mod
from mentor_fast.rewards.code import CodeResult, CodeVerifier
from mentor_fast.rewards.sandbox import SandboxError
from mentor_fast.types import CodeTask, Problem, Rollout

TESTS = "assert add3(1) == 4\nassert add3(-3) == 0\nassert add3(10) == 13\n"
TASK = CodeTask(tests=TESTS, entry_point="add3", solution="def add3(x):\n    return x + 3\n")
PROBLEM = Problem("add3", "Write a Python function `add3(x: int) -> int` that returns x plus 3.", TASK.solution,
                  ("Add 3 to the argument and return it.",), source="test", code=TASK)

COMPLETIONS = {
    "right": "Here it is:\n```python\ndef add3(x):\n    return x + 3\n```",
    "bare": "def add3(x):\n    return 3 + x\n",  # no fence: the whole completion is the program
    "wrong": "```python\ndef add3(x):\n    return x + 2\n```",
    "name": "```python\ndef add_three(x):\n    return x + 3\n```",
    "syntax": "```python\ndef add3(x)\n    return x + 3\n```",
    "loop": "```python\ndef add3(x):\n    while True:\n        pass\n```",
    "fake": "```python\nimport os\nos._exit(0)\n```",
    "empty": "   \n",
}


def _rollouts(names: list[str], problem: Problem = PROBLEM) -> list[Rollout]:
    return [Rollout(problem, i, [1], [2], [0.0], COMPLETIONS[n], "stop", 0) for i, n in enumerate(names)]


@pytest.fixture(scope="module")
def scorer():
    with RewardScorer(RewardConfig(code=CodeRewardConfig(timeout_s=2.0, workers=2)), task="code") as s:
        yield s


def test_verdicts_scores_and_notes(scorer):
    names = list(COMPLETIONS)
    rollouts = _rollouts(names)
    metrics = scorer.score(rollouts)
    by = dict(zip(names, rollouts, strict=True))
    assert [n for n, r in by.items() if r.correct] == ["right", "bare"]
    assert [r.reward for r in rollouts] == [1.0, 1.0] + [0.0] * 6
    wrong = by["wrong"].verifier_detail
    assert isinstance(wrong, CodeResult) and wrong.status == "failed"
    assert wrong.test_line.strip() == "assert add3(1) == 4"
    assert by["wrong"].verifier_note.startswith("failed assert add3(1) == 4")
    assert by["name"].verifier_detail.exception == "NameError"
    assert by["syntax"].verifier_detail.exception == "SyntaxError"
    assert by["loop"].verifier_detail.status == "timeout"
    assert by["fake"].verifier_detail.status == "crashed"  # exit(0) before the tests is never a pass
    assert by["empty"].verifier_detail is None and by["empty"].verifier_note == "no code in the completion"
    assert metrics["reward/code/mean"] == pytest.approx(2 / 8)
    assert metrics["reward/timeouts"] == 1.0
    assert metrics["reward/parse_error_rate"] == pytest.approx(1 / 8)  # the syntax error
    statuses = {k.rsplit("/", 1)[1]: v for k, v in metrics.items() if k.startswith("reward/code/status/")}
    assert statuses == {"passed": 2, "failed": 1, "error": 2, "timeout": 1, "crashed": 1, "no_code": 1}
    assert not any(k.startswith("reward/errors/") for k in metrics)


def test_humaneval_style_prompt_is_assembled(scorer):
    prompt = 'import math\n\n\ndef hyp(a: float, b: float) -> float:\n    """The hypotenuse."""\n'
    task = CodeTask(tests="assert abs(hyp(3, 4) - 5) < 1e-9\n", entry_point="hyp", prompt=prompt)
    problem = Problem("hyp", "Complete hyp.", "", code=task)
    body = "    return math.sqrt(a * a + b * b)\n"  # a continuation of the prompt, as base models write
    whole = "```python\ndef hyp(a, b):\n    return math.hypot(a, b)\n```"  # the whole function, as chat models do
    rollouts = [Rollout(problem, i, [1], [2], [0.0], t, "stop", 0) for i, t in enumerate([body, whole])]
    scorer.score(rollouts)
    assert [r.correct for r in rollouts] == [True, True]  # `import math` comes from the prompt in both


def test_forgeries_score_zero_and_are_counted_by_cause(scorer):
    """Through the scorer, as training sees it: each forgery scores 0 under a status of its own, and
    the prompt is the checker's trusted setup, so a completion that redefines its helper gains nothing."""
    spray = ("```python\nimport os\nfor fd in range(1024):\n    try:\n        os.write(fd, b'{\"passed\": true}\\n')\n"
             "    except OSError:\n        pass\ndef add3(x):\n    return x + 3\n```")
    always = ("```python\nclass R(int):\n    def __eq__(self, other):\n        return True\n"
              "    __hash__ = int.__hash__\ndef add3(x):\n    return R(0)\n```")
    prompt = 'def unit(x):\n    return x + 3\n\n\ndef add3(x: int) -> int:\n    """x plus 3."""\n'
    helper = CodeTask(tests="assert add3(1) == unit(1)\nassert add3(5) == unit(5)\n", entry_point="add3", prompt=prompt)
    shadow = "```python\ndef unit(x):\n    return 0\n\n\ndef add3(x):\n    return 0\n```"
    rollouts = _rollouts(["right"]) + [Rollout(PROBLEM, 1, [1], [2], [0.0], spray, "stop", 0),
                                       Rollout(PROBLEM, 2, [1], [2], [0.0], always, "stop", 0)]
    rollouts.append(Rollout(Problem("h", "q", "", code=helper), 3, [1], [2], [0.0], shadow, "stop", 0))
    metrics = scorer.score(rollouts)
    assert [r.correct for r in rollouts] == [True, False, False, False]
    assert [r.verifier_detail.status for r in rollouts] == ["passed", "forged_output", "unsupported", "failed"]
    assert {k.rsplit("/", 1)[1]: v for k, v in metrics.items() if k.startswith("reward/code/status/")} == {
        "passed": 1, "forged_output": 1, "unsupported": 1, "failed": 1}
    assert rollouts[2].verifier_detail.test_line == "assert add3(1) == 4"
    assert rollouts[2].verifier_note.startswith("unsupported: add3() returned a __main__.R")
    assert rollouts[3].verifier_detail.test_line == "assert add3(1) == unit(1)"


def test_a_problem_whose_prompt_does_not_compile_is_an_error_of_the_problem(scorer):
    """A prompt whose stub has no body is not dropped (the tests' helpers would then bind to the
    program's): every completion is bad_problem, counted as a verifier error, and scores 0."""
    prompt = 'def unit(x):\n    return x + 3\n\n\ndef add3(x: int) -> int:\n'
    task = CodeTask(tests="assert add3(1) == unit(1)\n", entry_point="add3", prompt=prompt)
    problem = Problem("bad", "q", "", code=task)
    texts = ["```python\ndef add3(x):\n    return x + 3\n```", ("```python\ndef unit(x):\n    return 0\n\n\n"
             "def add3(x):\n    return 0\n```")]
    rollouts = [Rollout(problem, i, [1], [2], [0.0], t, "stop", 0) for i, t in enumerate(texts)]
    metrics = scorer.score(rollouts)
    assert [(r.correct, r.reward, r.verifier_detail.status) for r in rollouts] == [(False, 0.0, "bad_problem")] * 2
    assert metrics["reward/errors/code/BadProblem"] == 2
    assert "setup does not compile" in rollouts[0].verifier_note


def test_a_problem_without_tests_is_a_clear_error(scorer):
    plain = Problem("m", "What is 1 + 1?", "2")
    with pytest.raises(ValueError, match="problem 'm'.*no code task"):
        scorer.score([Rollout(plain, 0, [1], [2], [0.0], "2", "stop", 0)])


def test_describe_names_the_isolation(scorer):
    line = scorer.verifier.describe()
    assert "unshare" in line and "--net" in line and "--pid" in line


def test_fault_injection_no_namespaces_stops_with_the_way_out(monkeypatch):
    monkeypatch.setattr("mentor_fast.rewards.code.detect", lambda: (sandbox_mod.Isolation.NONE, [], "no unshare"))
    with pytest.raises(SandboxError, match="reward.code.sandbox=none"):
        CodeVerifier(CodeRewardConfig())


def test_sandbox_none_warns_at_every_step(caplog):
    with RewardScorer(RewardConfig(code=CodeRewardConfig(sandbox="none", timeout_s=5.0)), task="code") as s:
        assert "NOT isolated" in s.verifier.describe()
        with caplog.at_level(logging.WARNING, logger="mentor_fast.rewards.registry"):
            for _ in range(2):
                rollouts = _rollouts(["right", "wrong"])
                s.score(rollouts)
                assert [r.correct for r in rollouts] == [True, False]
    warnings = [r for r in caplog.records if "WITHOUT isolation" in r.getMessage()]
    assert len(warnings) == 2


def test_the_task_follows_the_data_and_its_rules_name_the_keys():
    for source in ("code_ladder", "humaneval"):
        cfg = load_config([], [f"data.source={source}"])
        assert cfg.task == "code" and "```python" in cfg.data.system_prompt
    assert load_config([], ["data.source=jsonl", "data.path=x.jsonl", "data.format=code"]).task == "code"
    assert load_config([], ["data.source=jsonl", "data.path=x.jsonl"]).task == "math"
    cfg = load_config([], [])
    assert cfg.task == "math" and "\\boxed" in cfg.data.system_prompt
    with pytest.raises(ConfigError, match=r"task=code needs data.source=code_ladder or humaneval, or data.format=code"):
        load_config([], ["task=code"])
    with pytest.raises(ConfigError, match=r"task=math needs data.source=ladder.*code_ladder.*leave task at auto"):
        load_config([], ["data.source=code_ladder", "task=math"])
    with pytest.raises(ConfigError, match="data.format=code reads JSONL files"):
        load_config([], ["data.source=file", "data.path=x.parquet", "data.format=code"])
    with pytest.raises(ConfigError, match="sandbox"):
        load_config([], ["data.source=code_ladder", "reward.code.sandbox=off"])


def test_the_old_task_keys_are_read_as_task(tmp_path):
    """reward.kind and mentor.task were one setting under two names: both are read as `task`."""
    assert load_config([], ["data.source=code_ladder", "reward.kind=code"]).task == "code"
    assert load_config([], ["data.source=code_ladder", "mentor.task=code"]).task == "code"
    old = tmp_path / "old.yaml"
    old.write_text("data:\n  source: code_ladder\nreward:\n  kind: code\nmentor:\n  task: auto\n")
    assert load_config([old]).task == "code"
    with pytest.raises(ConfigError, match="task=math needs"):
        load_config([], ["data.source=code_ladder", "reward.kind=math"])
    both = tmp_path / "both.yaml"
    both.write_text("task: code\nreward:\n  kind: code\n")
    with pytest.raises(ConfigError, match=f"{both}: 'reward.kind' is read as 'task', which is set too"):
        load_config([both])
