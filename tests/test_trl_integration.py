"""MENTOR inside TRL's own GRPOTrainer (mentor_fast.integrations.trl), against the TRL installed beside
the project (`pip install --no-deps trl`, tested on trl 1.16), on the CPU with the ladder toy model."""

from __future__ import annotations

import json
import random
import sys

import pytest

pytest.importorskip("trl", reason="TRL is installed beside the project by `make venv`")
datasets = pytest.importorskip("datasets")

from mentor_fast.data.chat import HINT_HEADER
from mentor_fast.data.ladder import make_problem
from mentor_fast.integrations.trl import DatasetRows, check_trl, mentor_config, mentor_rollout_func, with_hint

G = 4


def ladder_rows(n: int, solvable: list[bool]) -> list[dict]:
    """Ladder problems as a TRL dataset: standard (string) prompts, short for the CPU, a GSM8K-style
    worked solution (what the worked_solutions mentor writes its hints from) and a column the reward
    function reads."""
    rng = random.Random(7)
    rows = []
    for i in range(n):
        p = make_problem(2, rng, max_digits=2)
        rows.append({"prompt": p.question,
                     "solution": "\n".join(p.solution_steps) + f"\n#### {p.gold}", "solvable": solvable[i]})
    return rows


def solved_when_hinted(completions, mentor_hint, solvable, **kwargs):
    """A user's reward function for a policy that solves a problem only when a hint is in its prompt,
    and only the problems marked solvable (the random toy model solves nothing by itself). It logs
    how many rows it scored."""
    kwargs["log_metric"]("test/rows_scored", len(completions))
    return [1.0 if hint is not None and ok else 0.0 for hint, ok in zip(mentor_hint, solvable)]


@pytest.fixture(scope="module")
def trl():
    """TRL as an install without vLLM imports it: the CPU path needs no vLLM, and importing vLLM
    takes 7-15 s on 2 cores. Where vLLM is loaded already, TRL imports it at no cost."""
    with pytest.MonkeyPatch.context() as mp:
        if "vllm" not in sys.modules:
            mp.setitem(sys.modules, "vllm", None)  # importlib.util.find_spec("vllm") -> None
        import trl
        from trl import GRPOTrainer  # noqa: F401  (imports the trainer's modules now)

    return trl


@pytest.fixture(scope="module")
def ladder_model():
    from mentor_fast.models import resolve_model_path

    return str(resolve_model_path("ladder-llama"))


def run_trl(trl, tmp_path, model, rows, mentor, steps=2):
    """TRL's GRPOTrainer with mentor_rollout_func; returns the trainer and every batch TRL built
    from the rollout function's rows (its `_generate_and_score_completions` output)."""
    args = trl.GRPOConfig(output_dir=str(tmp_path), use_cpu=True, per_device_train_batch_size=2 * G,
                          num_generations=G, max_completion_length=4, max_steps=steps, logging_steps=1,
                          learning_rate=1e-3, report_to="none", save_strategy="no", seed=3, bf16=False)
    with pytest.warns(UserWarning, match="rollout_func"):  # TRL flags the feature as experimental
        trainer = trl.GRPOTrainer(model=model, reward_funcs=[solved_when_hinted], args=args,
                                  train_dataset=datasets.Dataset.from_list(rows), rollout_func=mentor)
    batches = []
    build = trainer._generate_and_score_completions

    def spy(inputs):
        batches.append(build(inputs))
        return batches[-1]

    trainer._generate_and_score_completions = spy
    trainer.train()
    return trainer, batches


def test_mentor_rescues_all_fail_groups_inside_trls_trainer(trl, tmp_path, ladder_model):
    """Two prompts per step, every group all-fail. The mentor hints both (a collapse opens a surge);
    the solvable prompt's hinted re-rolls succeed and one replaces a failure, in its hinted context;
    the other escalates through both rounds and stays all-fail."""
    rows = ladder_rows(2, solvable=[True, False])
    func = mentor_rollout_func({"reroll": {"count": 2, "max_rounds": 2}})
    trainer, batches = run_trl(trl, tmp_path, ladder_model, rows, func)

    logs = [h for h in trainer.state.log_history if "mentor/triggered" in h]
    assert len(logs) == 2 and all(h["mentor/triggered"] == 2 and h["mentor/rescued"] == 1 for h in logs)
    assert all(h["mentor/all_fail_frac"] == 1.0 and h["mentor/level_1"] == 1 for h in logs)
    assert all(h["mentor/level_2"] == 1 and h["groups/all_fail_frac_after_mentor"] == 0.5 for h in logs)
    assert all(h["test/rows_scored"] == 2 * G for h in logs)  # TRL's batch only, not the mentor's scoring

    dumps = [json.loads(line) for line in (tmp_path / "mentor.jsonl").read_text().splitlines()]
    assert len(dumps) == 4 and sorted(d["rescued"] for d in dumps) == [False, False, True, True]
    tok = trainer.processing_class
    for step, batch in enumerate(batches):
        rescued = next(d for d in dumps if d["rescued"] and d["step"] == step)
        hinted_ids = tok(rescued["question"] + HINT_HEADER + rescued["hint"])["input_ids"]
        prompts = [ids[mask.bool()].tolist() for ids, mask in zip(batch["prompt_ids"], batch["prompt_mask"])]
        hinted = [i for i, ids in enumerate(prompts) if ids == hinted_ids]
        assert len(hinted) == 1  # max_replace: one hinted success in place of one failure
        group = range(hinted[0] - hinted[0] % G, hinted[0] - hinted[0] % G + G)
        adv = batch["advantages"]
        assert adv[hinted[0]] > 0 and all(adv[i] < 0 for i in group if i != hinted[0])  # mixed rewards
        others = [i for i in range(len(prompts)) if i not in group]
        assert all(adv[i] == 0 for i in others)  # the unrescued group: all fail, no signal
        assert all(HINT_HEADER.strip() not in tok.decode(prompts[i]) for i in range(len(prompts)) if i != hinted[0])


def test_without_trl_the_error_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "trl", None)
    with pytest.raises(ImportError, match=r"pip install 'mentor-fast\[trl\]'"):
        mentor_rollout_func()


def test_other_trl_versions_are_refused_by_name(trl, monkeypatch):
    check_trl()  # the installed one is a tested version
    monkeypatch.setattr(trl, "__version__", "1.17.0")
    with pytest.raises(RuntimeError, match=r"tested against trl>=1.16,<1.17, and trl 1.17.0 is installed.*mentor-fast\[trl\]"):
        mentor_rollout_func()


@pytest.mark.parametrize(("overrides", "words"), [
    ({"loss": {"mode": "transfer"}}, "TRL's loss does not read"),
    ({"loss": {"distill_coef": 0.1}}, "TRL's loss does not"),
    ({"agents": {"backend": "self"}}, "rollout engine"),
])
def test_settings_trls_loss_cannot_carry_are_refused(overrides, words):
    with pytest.raises(ValueError, match=words):
        mentor_config(overrides)


def test_the_hint_goes_after_the_last_user_turn_in_both_prompt_forms():
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2 + 3?"}]
    assert with_hint(chat, "Add.") == [chat[0], {"role": "user", "content": "What is 2 + 3?" + HINT_HEADER + "Add."}]
    assert chat[1]["content"] == "What is 2 + 3?"  # the dataset's prompt is left as it was
    assert with_hint("What is 2 + 3?", "Add.") == "What is 2 + 3?" + HINT_HEADER + "Add."


def test_rows_are_found_by_prompt_and_an_ambiguous_prompt_is_an_error():
    chat = [{"role": "user", "content": "What is 2 + 3?"}]
    rows = DatasetRows([{"prompt": "a", "answer": "1"}, {"prompt": chat, "answer": "5"},
                        {"prompt": "a", "answer": "1"}, {"prompt": "b", "answer": "2"}, {"prompt": "b", "answer": "3"}])
    assert rows.find([dict(m) for m in chat]) == (1, {"prompt": chat, "answer": "5"})
    assert rows.find("a") == (0, {"prompt": "a", "answer": "1"})  # duplicates that agree are one row
    with pytest.raises(ValueError, match=r"rows \[3, 4\] share the prompt"):
        rows.find("b")
    with pytest.raises(KeyError, match="not in train_dataset"):
        rows.find("c")
