"""benchmarks/trl_baseline.py, the TRL runner of `mentor-fast bench`: its CLI loads without trl, and
TRL sees exactly the prompts our trainer builds for the same step (no trl needed for either check)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "benchmarks" / "trl_baseline.py"


@pytest.fixture(scope="module")
def runner():
    spec = importlib.util.spec_from_file_location("trl_baseline", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_help_needs_no_trl():
    # Importing any of these would fail: --help must parse before trl and torch are imported.
    code = (
        "import runpy, sys\n"
        "for name in ('trl', 'torch', 'transformers', 'datasets', 'accelerate'):\n"
        "    sys.modules[name] = None\n"
        f"sys.argv = [{str(SCRIPT)!r}, '--help']\n"
        f"runpy.run_path({str(SCRIPT)!r}, run_name='__main__')\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    for flag in ("--model", "--out", "--name", "--max-steps", "--no-gc", "--bf16", "--max-new-tokens", "--threads"):
        assert flag in proc.stdout


def test_defaults(runner):
    args = runner.parse_args(["--model", "m", "--out", "o"])
    assert (args.max_new_tokens, args.threads, args.no_gc, args.bf16) == (128, 2, False, False)


def test_prompts_are_our_trainers(runner, smollm2_path):
    """Step k's rows, tokenized as GRPOTrainer tokenizes conversational prompts, are our PromptBuilder's
    ids for source.batch(k, prompts_per_step) under the bench's config."""
    from mentor_fast.bench import BASE
    from mentor_fast.config import load_config
    from mentor_fast.data import PromptBuilder, build_source
    from mentor_fast.models import load_tokenizer

    ours = load_config([], BASE)
    tok = load_tokenizer(smollm2_path)
    builder = PromptBuilder(tok, ours.data.system_prompt, ours.data.max_prompt_tokens)
    source = build_source(ours.data, ours.seed)

    cfg = runner.run_config(128)
    assert (cfg.data, cfg.seed, cfg.rollout) == (ours.data, ours.seed, ours.rollout)
    rows = runner.prompt_rows(cfg, steps=2)
    b = ours.rollout.prompts_per_step
    assert [r["step"] for r in rows] == [1] * b + [2] * b  # TRL reads the dataset in order, b rows a step
    for step in (1, 2):
        problems = source.batch(step, b)
        step_rows = rows[(step - 1) * b : step * b]
        # GRPOTrainer._tokenize_prompts: one batched apply_chat_template over the step's messages
        enc = tok.apply_chat_template([r["prompt"] for r in step_rows], add_generation_prompt=True,
                                      tokenize=True, return_dict=True)
        assert [list(ids) for ids in enc["input_ids"]] == [builder.encode(p) for p in problems]
        texts = [tok.apply_chat_template(r["prompt"], tokenize=False, add_generation_prompt=True) for r in step_rows]
        assert texts == [builder.render(p) for p in problems]
        assert [(r["problem_id"], r["gold"]) for r in step_rows] == [(p.id, p.gold) for p in problems]

    expected = runner.expected_prompt_ids(tok, cfg, steps=1)
    g = ours.rollout.num_generations
    assert expected[1] == [builder.encode(p) for p in source.batch(1, b) for _ in range(g)]


def test_reward_and_step_record(runner):
    reward = runner.make_reward(timeout_s=5)
    completions = [[{"role": "assistant", "content": "16 + 72 = 88, so \\boxed{88}"}],
                   [{"role": "assistant", "content": "\\boxed{87}"}], "plain text \\boxed{88}"]
    assert reward(completions, gold=["88", "88", "88"]) == [1.0, 0.0, 1.0]

    phases = {"rollout": 5.0, "generate": 4.0, "reward": 0.5, "train": 4.0}
    rec = runner.step_record(1, 10.0, phases, [16, 12, 16], [1.0, 0.0, 0.0], 16, True)
    for key in ("wall_s", "generate_s", "reward_s", "train_s", "step_tok_per_s", "completion_tokens"):
        assert key in rec  # what mentor_fast.bench.run_trl reads
    assert rec["completion_tokens"] == 44 and rec["n_truncated"] == 2
    assert rec["step_tok_per_s"] == pytest.approx(4.4) and rec["other_s"] == pytest.approx(1.0)
