"""The recovery baselines as methods (mentor_fast/baselines/): Scaf-GRPO's static tiered hints, LUFFY's
off-policy worked solutions, and MENTOR's writer blind to the attempts (the no-diagnosis ablation).
The pipeline-level tests use the scripted engine of mentor/testing.py (a completion is a rule of the
prompt); the tiny runs go through the real trainer."""

from __future__ import annotations

import json

import pytest

from mentor_fast.config import ConfigError, load_config
from mentor_fast.mentor import Mentor
from mentor_fast.mentor.cases import FailureCase
from mentor_fast.mentor.testing import (
    HEADER,
    CharPromptBuilder,
    ScriptedBackend,
    exact_score,
    ladder_problem,
    make_group,
    mentor_configs,
    scripted_generate,
)
from mentor_fast.mentor.writers.blind import BlindAgents
from mentor_fast.mentor.writers.solutions import WorkedSolutions, cold_hint
from mentor_fast.metrics import read_metrics
from mentor_fast.rollout.base import SamplingParams
from mentor_fast.trainer import Trainer
from mentor_fast.types import TokenWeighting

TINY = "configs/tiny_test.yaml"
G = 4
PARAMS = SamplingParams(n=G, max_new_tokens=32, seed=5)
# Every group is eligible at once: no collapse detector in the way, the whole step is the budget.
OPEN = ["mentor.trigger.max_groups_frac=1.0", "mentor.trigger.collapse_abs=1.0", "mentor.trigger.collapse_delta=1.0"]


def scaf(*overrides: str, trigger=OPEN) -> Mentor:
    from mentor_fast.baselines.scaf import scaf_mentor

    return scaf_mentor(load_config([], ["method=scaf", "trainer.max_steps=20", *trigger, *overrides]),
                       CharPromptBuilder())


def only_with(pred):
    """The first re-roll of a prompt solves it when its hint satisfies pred; nothing else does."""

    def rule(prompt: str, k: int) -> str:
        hint = prompt.split(HEADER + "\n", 1)[1] if HEADER in prompt else None
        ok = hint is not None and pred(hint) and k == 0
        return "so \\boxed{303}" if ok else "so \\boxed{1}"

    return rule


def failed_group(texts=("\\boxed{1}",) * G, problem=None, group_id=7):
    return make_group(problem or ladder_problem(), list(texts), group_id=group_id)


# ------------------------------------------------------------------ Scaf-GRPO
def test_scaf_tiers_escalate_and_the_success_is_trained_in_the_hinted_context():
    mentor = scaf("mentor.reroll.count=2")
    group = failed_group()
    calls = []
    # only the solution tier (it states a step's result: "47 + 385 = 432") makes the policy succeed
    out = mentor.intervene([group], 10, scripted_generate(only_with(lambda h: "= 432" in h), log=calls),
                           exact_score, PARAMS)
    [iv] = out.interventions
    assert [h.level for h in iv.hints] == [1, 2, 3] and iv.rescued and iv.rescue_level == 3
    assert len(calls) == 3 and all(p.n == 2 for _, p in calls)  # a round per tier, mentor.reroll.count each
    # the tiers are the problem's own hints, the same as before any attempt: knowledge, plan, first step
    assert [h.text for h in iv.hints] == [cold_hint(group.problem, level) for level in (1, 2, 3)]
    [r] = [r for r in out.groups[0].rollouts if r.origin == "mentor"]
    assert out.groups[0].num_correct == 1 and r.correct  # one failed rollout replaced (replace_num=1)
    # trained in the hinted context, with plain GRPO: no reweighting, no distillation term
    hinted = CharPromptBuilder().encode(group.problem, iv.hints[-1].text)
    assert r.prompt_ids == hinted and r.behaviour_prompt_ids is None
    assert r.weighting is None and r.extra_terms == ()
    # static: the next visit starts at the knowledge tier again (MENTOR would start at level 2)
    assert mentor.scheduler.plan([failed_group(group_id=8)], 11).selected[0][1] == 1


def test_scaf_hints_do_not_depend_on_the_attempts():
    p = ladder_problem()
    blank = failed_group(problem=p)
    wrote_step_1 = failed_group(["47 + 385 = 432, minus 129 is \\boxed{300}"] * G, problem=p)
    hints = {}
    for name, group in (("blank", blank), ("step_1", wrote_step_1)):
        out = scaf().intervene([group], 10, scripted_generate(only_with(lambda h: False)), exact_score, PARAMS)
        hints[name] = [h.text for h in out.interventions[0].hints]
    assert hints["blank"] == hints["step_1"] and len(hints["blank"]) == 3
    # MENTOR's diagnosis reads the attempts: the one that wrote step 1 is pointed at step 2
    sighted = [Mentor(*mentor_configs("trigger.max_groups_frac=1.0"), WorkedSolutions(), CharPromptBuilder())
               .write_hints([g], 5).interventions[0].hint.text for g in (blank, wrote_step_1)]
    assert sighted[0] != sighted[1] and "432 - 129" in sighted[1]


def test_scaf_exemption_period_holds_through_a_collapse_surge():
    mentor = scaf("scaf.exempt_frac=0.15", trigger=[])  # 20 steps: steps 1-3 get no hint
    for step in (1, 2, 3):
        plan = mentor.scheduler.plan([failed_group(group_id=step)], step)
        assert plan.surge_active and plan.selected == []
    assert len(mentor.scheduler.plan([failed_group(group_id=9)], 4).selected) == 1
    # MENTOR's own exemption gives way to a surge
    sighted = Mentor(*mentor_configs("trigger.exempt_steps=3"), WorkedSolutions(), CharPromptBuilder())
    assert len(sighted.scheduler.plan([failed_group()], 0).selected) == 1


# ------------------------------------------------------------------ the blind writer
class Unreadable:
    """An attempt that fails the test if anything reads it."""

    def __getattr__(self, name):
        raise AssertionError(f"the blind writer read an attempt's {name}")


def test_the_no_diagnosis_writer_never_reads_the_attempts():
    p = ladder_problem()
    case = FailureCase(p, [Unreadable(), Unreadable()], G, {"300": 3, "<no answer>": 1}, "math",
                       kinds={"wrong_answer": 4})
    agents = BlindAgents(WorkedSolutions())
    [d] = agents.diagnose([case])
    hints = [agents.instruct([case], [d], [level], [None])[0] for level in (1, 2, 3)]
    assert hints == [cold_hint(p, level) for level in (1, 2, 3)]
    assert case.answers == {"300": 3, "<no answer>": 1}  # the case itself is left as it was

    # an LLM writer is sent no attempt text and no answer count
    seen = []
    backend = ScriptedBackend(lambda messages: seen.append(messages) or None)
    mentor = Mentor(*mentor_configs("trigger.max_groups_frac=1.0", "agents.backend=openai", "agents.model=m",
                                    "agents.blind=true"), backend, CharPromptBuilder())
    secret = "SECRET-ATTEMPT-77 so \\boxed{300}"
    mentor.write_hints([failed_group([secret] * G, problem=p)], 0)
    sent = json.dumps(seen)
    assert seen and "SECRET-ATTEMPT-77" not in sent and "300 x" not in sent and p.question in sent


# ------------------------------------------------------------------ LUFFY
def _luffy(tmp_path, *overrides):
    cfg = load_config([TINY], [f"output_dir={tmp_path}", "method=luffy", "rollout.max_new_tokens=48",
                               "trainer.tensorboard=false", "trainer.max_steps=2", *OPEN, *overrides])
    return Trainer(cfg)


def test_luffy_trains_the_worked_solution_under_the_bare_prompt_with_the_shaping_weight(tmp_path):
    from mentor_fast.sft import sft_target

    trainer = _luffy(tmp_path)
    tok, gamma = trainer.tokenizer, trainer.cfg.luffy.gamma
    checked = []
    weights = trainer.updater._policy_weights

    def check(batch, plan, old, sampler):
        w = weights(batch, plan, old, sampler)
        lens = batch.completion_lens[plan].tolist()
        fresh = trainer.updater.logprobs(None, batch, plan)  # pi_old: the weights before this step
        for i, o, wi in zip(plan, old.split(lens), w.split(lens)):
            r = batch.rollouts[i]
            if r.origin != "expert":
                assert (wi == 1).all()
                continue
            # the worked solution as the policy would write it, EOS included, after the bare prompt
            assert r.completion_ids == tok(sft_target(r.problem), add_special_tokens=False)["input_ids"] + [
                tok.eos_token_id]
            assert r.prompt_ids == trainer.builder.encode(r.problem) and r.correct
            assert r.weighting == TokenWeighting("shaping", gamma)
            # pi_old is recomputed under q (the expert's sampler log-probs are a placeholder), and the
            # weight is gamma p / (p + gamma)^2 of it
            assert o.tolist() == pytest.approx(fresh[i].tolist(), abs=1e-5)
            p = o.exp()
            assert wi.tolist() == pytest.approx((gamma * p / (p + gamma) ** 2).tolist(), rel=1e-5)
            checked.append(i)
        return w

    trainer.updater._policy_weights = check
    trainer.fit()
    rows = read_metrics(tmp_path / "metrics.jsonl")
    assert checked, "no expert sequence reached the update"
    for row in rows:  # the random tiny model fails every group; each gets the expert trace
        assert row["luffy/inserted"] == row["luffy/selected"] == row["groups/count"]
        assert row["update/skipped_token_frac"] < 1.0  # the expert gives the group a signal


def test_luffy_leaves_out_a_solution_it_could_not_have_generated(tmp_path):
    _luffy(tmp_path, "rollout.max_new_tokens=8", "trainer.max_steps=1").fit()
    [row] = read_metrics(tmp_path / "metrics.jsonl")
    assert row["luffy/inserted"] == 0 and row["luffy/too_long"] == row["luffy/selected"] > 0


# ------------------------------------------------------------------ the method key
def test_method_key_resolves_and_refuses_two_methods():
    assert load_config([TINY], []).method == "grpo"
    cfg = load_config([TINY], ["mentor.enable=true"])
    assert cfg.method == "mentor" and cfg.mentor.enable
    cfg = load_config([TINY], ["method=mentor"])
    assert cfg.mentor.enable
    assert not load_config([TINY], ["method=scaf"]).mentor.enable
    with pytest.raises(ConfigError, match="mentor.enable=true and method=scaf"):
        load_config([TINY], ["method=scaf", "mentor.enable=true"])
    with pytest.raises(ConfigError, match="method"):
        load_config([TINY], ["method=hints"])


def test_tiny_run_with_scaf_hints_after_the_exemption_and_climbs_the_tiers(tmp_path):
    cfg = load_config([TINY], [f"output_dir={tmp_path}", "method=scaf", "trainer.max_steps=3",
                               "mentor.reroll.count=2", "mentor.reroll.schedule=in_step",
                               "trainer.tensorboard=false", *OPEN])
    Trainer(cfg).fit()
    rows = read_metrics(tmp_path / "metrics.jsonl")
    assert rows[0].get("mentor/triggered", 0) == 0  # ceil(0.15 x 3) = 1 exempt step
    assert all(r["mentor/triggered"] == r["groups/count"] for r in rows[1:])
    dumps = [json.loads(line) for line in (tmp_path / "scaf.jsonl").read_text().splitlines()]
    assert dumps and all([h["level"] for h in d["hints"]] == [1, 2, 3] for d in dumps)  # nothing solves it


def test_luffy_counts_sum_over_ranks_and_its_collapse_flag_does_not():
    from helpers import TwoRanks

    from mentor_fast.baselines.luffy import LuffyMethod
    from mentor_fast.metrics import reduce_metrics

    a = {"luffy/selected": 2.0, "luffy/inserted": 1.0, "luffy/collapse_event": 1.0}
    b = {"luffy/selected": 1.0, "luffy/inserted": 1.0, "luffy/collapse_event": 1.0}
    out = reduce_metrics(TwoRanks(b), a, LuffyMethod.metrics)
    assert out == {"luffy/selected": 3.0, "luffy/inserted": 2.0, "luffy/collapse_event": 1.0}
