"""MENTOR inside TRL's own GRPOTrainer (mentor_fast.integrations.trl), against the TRL installed beside
the project (`pip install --no-deps trl`, tested on trl 1.16), on the CPU with the ladder toy model."""

from __future__ import annotations

import json
import logging
import random
import sys

import pytest

pytest.importorskip("trl", reason="TRL is installed beside the project by `make venv`")
datasets = pytest.importorskip("datasets")

from mentor_fast.config import MentorConfig, RecoveryConfig
from mentor_fast.config.recovery import RerollConfig, RerollSchedule
from mentor_fast.data import DataError
from mentor_fast.data.chat import HINT_HEADER
from mentor_fast.data.ladder import make_problem
from mentor_fast.integrations.trl import (
    STATE_KEY,
    DatasetRows,
    check_trl,
    mentor_configs,
    mentor_rollout_func,
    with_hint,
)

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


def trl_trainer(trl, tmp_path, model, rows, mentor, steps=2, **settings):
    """TRL's GRPOTrainer with mentor_rollout_func (two prompts per step unless `settings` say otherwise)."""
    args = trl.GRPOConfig(**{"output_dir": str(tmp_path), "use_cpu": True, "per_device_train_batch_size": 2 * G,
                             "num_generations": G, "max_completion_length": 4, "max_steps": steps, "logging_steps": 1,
                             "learning_rate": 1e-3, "report_to": "none", "save_strategy": "no", "seed": 3,
                             "bf16": False, **settings})
    with pytest.warns(UserWarning, match="rollout_func"):  # TRL flags the feature as experimental
        return trl.GRPOTrainer(model=model, reward_funcs=[solved_when_hinted], args=args,
                               train_dataset=datasets.Dataset.from_list(rows), rollout_func=mentor)


def run_trl(trl, tmp_path, model, rows, mentor, steps=2, resume=None, **settings):
    """Trains; returns the trainer and every batch TRL built from the rollout function's rows (its
    `_generate_and_score_completions` output)."""
    trainer = trl_trainer(trl, tmp_path, model, rows, mentor, steps, **settings)
    batches = []
    build = trainer._generate_and_score_completions

    def spy(inputs):
        batches.append(build(inputs))
        return batches[-1]

    trainer._generate_and_score_completions = spy
    trainer.train(resume_from_checkpoint=resume)
    return trainer, batches


def mentor_log(folder, name="mentor.jsonl") -> list[dict]:
    return [json.loads(line) for line in (folder / name).read_text().splitlines()]


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

    dumps = mentor_log(tmp_path)
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
    ({"task": "code"}, "inside TRL the mentor writes math hints only"),
    ({"reroll": {"schedule": "during_update"}}, "schedule=during_update: inside TRL the re-rolls run within TRL's"),
    ({"reroll": {"schedule": "next_step_shared_rows"}}, "TRL's loop has no place for"),
    ({"reroll": {"horizon": 1.5}}, "inside TRL each round is a TRL generation call"),
    ({"trigger": {"max_groups_frac": 0.5}, "reroll": {"schedule": "during_update"}}, "which is the in_step schedule"),
])
def test_settings_trl_cannot_carry_are_refused_with_the_plugins_reason(overrides, words):
    """The plug-in's reasons, never the loader's (which speak of our task key and engines)."""
    with pytest.raises(ValueError, match=words) as refused:
        mentor_configs(overrides)
    assert "data.source" not in str(refused.value) and "rollout.engine" not in str(refused.value)


def test_the_reroll_schedule_inside_trl_is_in_step():
    assert mentor_configs()[1].reroll.schedule == RerollSchedule.IN_STEP
    assert mentor_configs({"reroll": {"schedule": "in_step", "count": 2}})[1].reroll.count == 2
    assert mentor_configs(recovery={"reroll": {"count": 2}}) == mentor_configs({"reroll": {"count": 2}})
    assert mentor_configs(MentorConfig(), RecoveryConfig())[1].reroll.schedule == RerollSchedule.IN_STEP  # unset
    budget = RecoveryConfig(reroll=RerollConfig(count=2))  # its default schedule counts as unset
    assert mentor_configs(MentorConfig(), budget) == mentor_configs(recovery={"reroll": {"count": 2}})
    with pytest.raises(ValueError, match="which is the in_step schedule"):
        mentor_configs(recovery=RecoveryConfig(reroll=RerollConfig(schedule=RerollSchedule.DURING_UPDATE)))


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


def test_a_row_without_a_gold_answer_stops_the_run_before_the_first_generation(trl, tmp_path, ladder_model):
    rows = ladder_rows(6, solvable=[False] * 6)
    del rows[4]["solution"]
    trainer = trl_trainer(trl, tmp_path, ladder_model, rows, mentor_rollout_func())
    calls = []
    generate = trainer._generate_single_turn
    trainer._generate_single_turn = lambda *a, **k: calls.append(a) or generate(*a, **k)
    with pytest.raises(DataError, match=r"train_dataset: 1 of 6 rows are unusable .*: row 4: missing answer column"):
        trainer.train()
    assert calls == [] and trainer.state.global_step == 0  # checked up front, whichever rows TRL draws first


def test_two_generation_calls_in_one_optimizer_step_are_two_mentor_steps(trl, tmp_path, ladder_model):
    """steps_per_generation=1 with 2 accumulation steps: TRL calls the function twice per optimizer
    step, one prompt each. Each call is a mentor step of its own: its group ids are new, and the
    collapse detector observes each once (every group fails: an event each call, the last at step 3)."""
    func = mentor_rollout_func({"reroll": {"count": 2, "max_rounds": 1}})
    run_trl(trl, tmp_path, ladder_model, ladder_rows(2, solvable=[False, False]), func, steps=2,
            per_device_train_batch_size=G, gradient_accumulation_steps=2, steps_per_generation=1)
    dumps = mentor_log(tmp_path)
    assert [(d["step"], d["global_step"]) for d in dumps] == [(0, 0), (1, 0), (2, 1), (3, 1)]
    assert sorted(d["group_id"] for d in dumps) == [0, 1, 2, 3]
    detector = func.mentor.scheduler.state_dict()["detector"]
    assert detector["events"] == 4 and detector["surge_until"] == 3 + func.budget.trigger.surge_steps


def test_the_mentor_state_rides_in_trls_checkpoints_and_mentor_jsonl_follows_the_run(trl, tmp_path, ladder_model,
                                                                                     caplog):
    rows = ladder_rows(2, solvable=[True, False])
    mentor, saving = {"reroll": {"count": 2, "max_rounds": 2}}, {"save_strategy": "steps", "save_steps": 1}
    first = mentor_rollout_func(mentor)
    run_trl(trl, tmp_path, ladder_model, rows, first, **saving)
    saved = [json.loads((tmp_path / f"checkpoint-{k}" / "trainer_state.json").read_text())["stateful_callbacks"]
             [STATE_KEY] for k in (1, 2)]
    assert [s["calls"] for s in saved] == [1, 2] and saved[0]["mentor"] != saved[1]["mentor"]
    assert saved[1] == first.state_dict()  # plain data, through trainer_state.json's JSON unchanged
    assert [d["global_step"] for d in mentor_log(tmp_path)] == [0, 0, 1, 1]

    # Resumed at step 1 by a new function (a new process): the scheduler goes on from checkpoint-1, so
    # after step 1 again it holds what the first run's did (a fresh one would have seen one step, not
    # two); mentor.jsonl keeps step 0's rows and has step 1's once, from the resumed run.
    resumed = mentor_rollout_func(mentor)
    run_trl(trl, tmp_path, ladder_model, rows, resumed, resume=str(tmp_path / "checkpoint-1"), **saving)
    assert resumed.state_dict() == first.state_dict()
    continued = mentor_log(tmp_path)
    assert [(d["step"], d["global_step"]) for d in continued] == [(0, 0), (0, 0), (1, 1), (1, 1)]

    # A fresh run in the same output_dir: the earlier file is moved aside, and this run's is new.
    with caplog.at_level(logging.WARNING, logger="mentor_fast.integrations.trl"):
        run_trl(trl, tmp_path, ladder_model, rows, mentor_rollout_func(mentor), steps=1)
    assert "they are now in mentor.1.jsonl" in caplog.text
    assert mentor_log(tmp_path, "mentor.1.jsonl") == continued
    assert [d["global_step"] for d in mentor_log(tmp_path)] == [0, 0]
