"""The MENTOR pipeline end to end with a scripted engine (a generate_fn whose output is a rule of
the prompt text) and scripted LLM backends (fault injection: leaks, garbage, failed calls)."""

import json
import threading
import time

import pytest

from mentor_fast.mentor import Mentor
from mentor_fast.mentor.report import dump_row
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
from mentor_fast.recovery import Intervention, Rerolls, assemble_rescues
from mentor_fast.rollout.base import SamplingParams
from mentor_fast.types import Hint, Problem

G = 4
PARAMS = SamplingParams(n=G, max_new_tokens=32, seed=5)
REQUIRED = {
    "mentor/triggered",
    "mentor/rescued",
    "mentor/latency_s",
    "mentor/leak_rejects",
    "mentor/level_1",
    "mentor/level_2",
    "mentor/level_3",
    "mentor/graduations",
    "groups/all_fail_frac_after_mentor",
    "mentor/garbage",
    "mentor/no_hint",
    "mentor/collapse_event",
    "mentor/surge_active",
}


def problem(i, a=47, b=385, c=129):
    s1, s2 = a + b, a + b - c
    return Problem(
        f"p{i}", f"What is {a} + {b} - {c}?", str(s2), (f"{a} + {b} = {s1}", f"{s1} - {c} = {s2}"), 3
    )


def gold_of(prompt):
    a, b, c = (
        int(x) for x in prompt.split("What is ")[1].split("?")[0].replace("+", "").replace("-", "").split()
    )
    return a + b - c


def batch(pattern):
    """'F': all-fail group, 'P': one of G correct, 'A': all correct."""
    out = []
    for i, ch in enumerate(pattern):
        p = problem(i, a=40 + i)
        texts = [
            f"\\boxed{{{p.gold}}}" if (ch == "A" or (ch == "P" and k == 0)) else "\\boxed{1}"
            for k in range(G)
        ]
        out.append(make_group(p, texts, group_id=100 + i))
    return out


def with_hint(pred=lambda hint: True, successes=1):
    """Solve (the first `successes` samples) only when a hint is present and pred(hint) holds."""

    def rule(prompt, k):
        hint = prompt.split(HEADER + "\n", 1)[1] if HEADER in prompt else None
        ok = hint is not None and pred(hint) and k < successes
        return f"so \\boxed{{{gold_of(prompt)}}}" if ok else "so \\boxed{1}"

    return rule


def mentor_for(backend="worked_solutions", *overrides):
    cfg = mentor_configs("trigger.max_groups_frac=1.0", "trigger.collapse_abs=1.0", "trigger.collapse_delta=1.0",
                         *overrides)
    if backend == "worked_solutions":
        return Mentor.from_config(*cfg, CharPromptBuilder())
    return Mentor(*cfg, backend, CharPromptBuilder())


def test_pipeline_with_scripted_engine_fault_free():
    mentor = mentor_for("worked_solutions", "reroll.count=3", "loss.max_replace=1")
    groups = batch("FPFA")
    calls = []
    out = mentor.intervene(
        groups, 0, scripted_generate(with_hint(), log=calls), exact_score, PARAMS, policy_version=1
    )
    m = out.metrics
    assert REQUIRED <= set(m)
    assert (m["mentor/triggered"], m["mentor/rescued"], m["mentor/level_1"], m["mentor/no_hint"]) == (
        2,
        2,
        2,
        0,
    )
    assert m["groups/all_fail_frac_after_mentor"] == 0.0 and m["mentor/all_fail_frac"] == 0.5
    assert m["mentor/leak_rejects"] == 0 and m["mentor/garbage"] == 0 and m["mentor/rerolls"] == 6
    assert len(calls) == 1 and calls[0][0] == 2 and calls[0][1].n == 3  # one batched call, M = rerolls
    assert calls[0][1].seed != PARAMS.seed and calls[0][1].max_new_tokens == PARAMS.max_new_tokens
    for before, after in zip(groups, out.groups):
        assert after.group_id == before.group_id and len(after.rollouts) == G
    assert out.groups[1] is groups[1] and out.groups[3] is groups[3]
    for g, orig in ((out.groups[0], groups[0]), (out.groups[2], groups[2])):
        [r] = [r for r in g.rollouts if r.origin == "mentor"]
        assert g.num_correct == 1 and r.correct and r.hint.level == 1 and r.group_id == orig.group_id
        assert r.prompt_ids[: len(orig.prompt_ids)] == orig.prompt_ids and len(r.prompt_ids) > len(
            orig.prompt_ids
        )
        assert r.hint.text in "".join(map(chr, r.prompt_ids)) and r.policy_version == 1
        assert g.problem.gold not in r.hint.text
    [row] = [r for r in out.dump_rows if r["problem_id"] == groups[0].problem.id]
    assert row["question"] == groups[0].problem.question and row["rescued"] and row["level"] == 1
    assert row["diagnosis"]["failure_type"] in ("wrong_strategy", "arithmetic_slip")
    assert row["hint"].startswith("Work out") and row["guard"][0]["ok"]
    assert [x["correct"] for x in row["rerolls"]] == [True, False, False] and row["attempts"][0][
        "answer"
    ] == "1"
    json.dumps(out.dump_rows)  # rows are JSON-ready


def test_escalation_rounds_until_a_level_works():
    mentor = mentor_for("worked_solutions", "reroll.count=2", "reroll.max_rounds=3")
    calls = []
    needs_step = with_hint(lambda h: "=" in h)  # only a level-3 hint ("47 + 385 = 432") helps
    out = mentor.intervene(batch("F"), 0, scripted_generate(needs_step, log=calls), exact_score, PARAMS)
    [iv] = out.interventions
    assert [h.level for h in iv.hints] == [1, 2, 3] and iv.rescued and iv.rescue_level == 3
    assert len(calls) == 3 and out.metrics["mentor/level_3"] == 1 and out.metrics["mentor/rerolls"] == 6
    assert [r.hint.level for r in out.groups[0].rollouts if r.origin == "mentor"] == [3]
    # memory: level 3 worked, so the next visit starts at level 2
    plan = mentor.scheduler.plan(batch("F"), 1)
    assert plan.selected[0][1] == 2


def test_no_rescue_within_max_rounds_keeps_the_group():
    mentor = mentor_for("worked_solutions", "reroll.count=2", "reroll.max_rounds=2")
    groups = batch("F")
    out = mentor.intervene(groups, 0, scripted_generate(with_hint(lambda h: False)), exact_score, PARAMS)
    assert out.groups[0] is groups[0] and out.metrics["mentor/rescued"] == 0
    assert out.metrics["groups/all_fail_frac_after_mentor"] == 1.0 and out.metrics["mentor/level_2"] == 1


def test_group_mode_rerolls_g_and_swaps_the_group():
    mentor = mentor_for("worked_solutions", "loss.mode=group", "reroll.count=2")  # rerolls is ignored: group mode re-rolls G
    calls = []
    out = mentor.intervene(
        batch("FA"), 0, scripted_generate(with_hint(successes=2), log=calls), exact_score, PARAMS
    )
    assert calls[0][1].n == G
    g = out.groups[0]
    assert all(r.origin == "mentor" for r in g.rollouts) and g.num_correct == 2 and len(g.rollouts) == G


def test_guard_reject_falls_back_to_a_lower_level():
    # gold 5 equals the first step's result, so the level-3 hint "2 + 3 = 5" leaks
    p = Problem("five", "What is 2 + 3 + 0?", "5", ("2 + 3 = 5", "5 + 0 = 5"))
    g = make_group(p, ["\\boxed{1}"] * G, group_id=7)
    mentor = mentor_for("worked_solutions", "trigger.start_level=3")
    hinted = mentor.write_hints([g], step=0)
    [iv] = hinted.interventions
    assert [(v["level"], v["ok"], v["gate"]) for v in iv.verdicts] == [
        (3, False, "gold_context"),
        (2, True, None),
    ]
    assert iv.hint.level == 2 and "5" not in iv.hint.text.replace("(the result of 1)", "")
    mentor.reroll(hinted, scripted_generate(lambda prompt, k: "\\boxed{5}"), exact_score, PARAMS)
    m = mentor.finish(hinted).metrics
    assert (
        m["mentor/leak_rejects"] == 1
        and m["mentor/leak_rejects/gold_context"] == 1
        and m["mentor/level_2"] == 1
    )


def llm_script(leak_once=True):
    """Fused replies per problem: p0 leaks at level 1 then gets a clean rewrite, p1 is garbage,
    p2's call fails (None)."""
    state = {"p0_fused": 0}

    def script(messages):
        user = messages[-1]["content"] if messages[-1]["role"] == "user" else ""
        question = messages[1]["content"]
        if "What is 40 +" in question:
            if "rejected" in user:
                return "<hint>Recheck how you subtract the last number.</hint>"
            state["p0_fused"] += 1
            return json.dumps(
                {
                    "diagnosis": {"failure_type": "arithmetic slip", "root_cause": "subtraction"},
                    "hint_l1": "So the answer is 296." if leak_once else "Recheck the subtraction.",
                    "hint_l2": "Add, then subtract.",
                    "hint_l3": "40 + 385 = 425 first.",
                }
            )
        if "What is 41 +" in question:
            return "I am not sure what you want."
        return None

    return script, state


def test_llm_backend_faults_leave_groups_without_hints_and_count_them():
    script, _ = llm_script()
    backend = ScriptedBackend(script)
    mentor = mentor_for(backend, "reroll.count=2")
    groups = batch("FFF")
    out = mentor.intervene(groups, 0, scripted_generate(with_hint()), exact_score, PARAMS)
    m = out.metrics
    ivs = sorted(out.interventions, key=lambda iv: iv.group.problem.id)  # priority ties break by hash
    assert ivs[0].hints[0].text == "Recheck how you subtract the last number." and ivs[0].rescued
    assert [v["gate"] for v in ivs[0].verdicts] == ["gold", None]
    regen = [b for b in backend.calls if any("rejected" in msg[-1]["content"] for msg in b)]
    assert len(regen) == 1 and "296" in regen[0][0][-1]["content"]  # the reason goes back to the instructor
    assert ivs[1].hint is None and ivs[1].no_hint_reason == "garbage" and ivs[1].garbage == 1
    assert ivs[2].hint is None and ivs[2].no_hint_reason == "error"
    assert (m["mentor/triggered"], m["mentor/rescued"], m["mentor/no_hint"], m["mentor/garbage"]) == (
        3,
        1,
        2,
        1,
    )
    assert m["mentor/no_hint/garbage"] == 1 and m["mentor/no_hint/error"] == 1
    assert m["mentor/errors/scripted"] == 1 and m["mentor/retries/parse"] == 1
    assert m["mentor/leak_rejects/gold"] == 1
    assert out.groups[1] is groups[1] and out.groups[2] is groups[2]  # training goes on without hints
    assert m["groups/all_fail_frac_after_mentor"] == pytest.approx(2 / 3)
    later = mentor.write_hints(batch("P"), 1)  # nothing to hint: no calls
    assert mentor.finish(later).metrics.get("mentor/errors/scripted", 0) == 0  # counts are per step


def test_fused_hints_serve_later_rounds_without_new_calls():
    script, _ = llm_script(leak_once=False)
    backend = ScriptedBackend(script)
    mentor = mentor_for(backend, "reroll.count=2", "reroll.max_rounds=2")
    g = batch("F")
    out = mentor.intervene(
        g, 0, scripted_generate(with_hint(lambda h: h.startswith("Add"))), exact_score, PARAMS
    )
    [iv] = out.interventions
    assert [h.text for h in iv.hints] == [
        "Recheck the subtraction.",
        "Add, then subtract.",
    ] and iv.rescue_level == 2
    assert len(backend.calls) == 1  # one fused call gave the diagnosis and both levels


def test_async_split_matches_sync_and_state_round_trips():
    groups = batch("FFP")
    sync = mentor_for("worked_solutions", "reroll.count=2").intervene(groups, 0, scripted_generate(with_hint()), exact_score, PARAMS)
    mentor = mentor_for("worked_solutions", "reroll.count=2")
    box = {}
    worker = threading.Thread(target=lambda: box.setdefault("hinted", mentor.write_hints(groups, 0)))
    worker.start()
    worker.join(timeout=30)
    mentor.reroll(box["hinted"], scripted_generate(with_hint(), policy_version=2), exact_score, PARAMS, 2)
    out = mentor.finish(box["hinted"])
    assert [[r.text for r in g.rollouts] for g in out.groups] == [
        [r.text for r in g.rollouts] for g in sync.groups
    ]
    assert all(r.policy_version == 2 for g in out.groups for r in g.rollouts if r.origin == "mentor")
    fresh = mentor_for("worked_solutions", "reroll.count=2")
    fresh.load_state_dict(json.loads(json.dumps(mentor.state_dict())))
    assert fresh.state_dict() == mentor.state_dict()


def test_collapse_surge_and_graduation_metrics():
    mentor = mentor_for("worked_solutions", "reroll.count=2", "trigger.max_groups_frac=0.5", "trigger.collapse_abs=0.6")
    groups = batch("FFFF")  # z = 1.0 > 0.6: collapse event, surge raises the cap to all groups
    out = mentor.intervene(groups, 0, scripted_generate(with_hint()), exact_score, PARAMS)
    assert out.metrics["mentor/collapse_event"] == 1 and out.metrics["mentor/surge_active"] == 1
    assert out.metrics["mentor/triggered"] == 4 and out.metrics["mentor/graduations"] == 0
    solved = batch("PPPA")  # the same problems, now solved unaided
    out = mentor.intervene(solved, 1, scripted_generate(with_hint()), exact_score, PARAMS)
    assert out.metrics["mentor/graduations"] == 4 and out.metrics["mentor/triggered"] == 0
    assert out.metrics["mentor/collapse_event"] == 0 and out.metrics["mentor/surge_active"] == 1


def test_overlong_hinted_prompt_and_deadline_mean_no_hint():
    p = ladder_problem("long")
    short_limit = len(CharPromptBuilder().encode(p)) + 5  # room for the question, not for a hint
    cfg = mentor_configs("trigger.max_groups_frac=1.0", "trigger.collapse_abs=1.0")
    mentor = Mentor(*cfg, Mentor.from_config(*cfg, CharPromptBuilder()).backend, CharPromptBuilder(short_limit))
    g = make_group(p, ["\\boxed{1}"] * G)
    calls = []
    out = mentor.intervene([g], 0, scripted_generate(with_hint(), log=calls), exact_score, PARAMS)
    assert calls == [] and out.metrics["mentor/no_hint/too_long"] == 1 and out.groups[0] is g

    def slow(messages):
        time.sleep(0.05)
        return json.dumps({"diagnosis": {"failure_type": "format"}})  # fused reply without hints

    slow_mentor = mentor_for(ScriptedBackend(slow), "agents.timeout_s=0.01")
    [iv] = slow_mentor.write_hints([g], 0).interventions
    assert iv.hint is None and iv.no_hint_reason == "deadline"


def test_cut_rerolls_are_dropped_unscored_and_counted():
    """A rider horizon (mentor.reroll.horizon): a re-roll the engine cut (finish_reason "cut") has no answer yet. It is
    not scored, not a failure, not a candidate for assembly; the step counts it."""
    import dataclasses

    mentor = mentor_for("worked_solutions", "reroll.count=3", "reroll.max_rounds=1")
    groups = batch("FFP")
    hinted = mentor.write_hints(groups, 0)
    ivs = hinted.interventions
    request = mentor.first_round(hinted, PARAMS)
    samples = scripted_generate(with_hint(successes=3))(request.prompts, request.params)
    # every re-roll would solve: only the cuts decide what counts
    samples[0] = [dataclasses.replace(s, finish_reason="cut") for s in samples[0]]  # all cut
    samples[1][0] = dataclasses.replace(samples[1][0], finish_reason="cut")  # one cut, two kept
    scored = []
    mentor.reroll(hinted, scripted_generate(with_hint()), lambda rs: (scored.extend(rs), exact_score(rs)), PARAMS,
                  first=(request, samples))
    out = mentor.finish(hinted)
    assert len(scored) == 2 and all(r.finish_reason != "cut" for r in scored)
    assert [len(iv.rerolls) for iv in ivs] == [0, 2] and [iv.cut for iv in ivs] == [3, 1]
    assert [iv.rescued for iv in ivs] == [False, True]
    m = out.metrics
    assert (m["mentor/rerolls"], m["mentor/rerolls_cut"], m["mentor/rescued"]) == (2, 4, 1)
    after = {g.group_id: g for g in out.groups}
    assert after[ivs[0].group.group_id].all_fail and after[ivs[1].group.group_id].num_correct == 1
    assert all(r.finish_reason != "cut" for g in out.groups for r in g.rollouts)
    assert [row["rerolls_cut"] for row in out.dump_rows] == [3, 1]


def test_rerolls_and_assembly_serve_hints_that_no_diagnoser_wrote():
    """What a static-hint method (hints from the data, Scaf-GRPO style) reuses beside MENTOR:
    re-roll rounds under prompt + hint, escalating to its own next hint, and the assembly of the
    rescued groups. No case, no diagnosis, no guard."""
    cfg, budget = mentor_configs("reroll.count=2", "reroll.max_rounds=2")
    groups = batch("FFA")
    static = {1: "Look again.", 2: "Plan: add, then subtract."}
    ivs = [Intervention(g, 0, 1, hint=Hint(static[1], 1)) for g in groups[:2]]

    def escalate(failed):
        for iv in failed:
            iv.level += 1
            iv.hint = Hint(static[iv.level], iv.level)
        return failed

    builder = CharPromptBuilder()
    rerolls = Rerolls(budget.reroll, cfg.loss.mode, builder, builder.tokenizer.decode)
    rerolls.run(ivs, scripted_generate(with_hint(lambda h: h.startswith("Plan"))), exact_score, PARAMS, escalate)
    assert [(iv.rescued, iv.rescue_level, [h.level for h in iv.hints]) for iv in ivs] == [(True, 2, [1, 2])] * 2
    out = assemble_rescues(groups, ivs, cfg.loss, seed=0)
    assert [g.num_correct for g in out] == [1, 1, G] and out[2] is groups[2]
    for g in out[:2]:
        [r] = [r for r in g.rollouts if r.origin == "mentor"]
        assert r.hint.text == static[2] and static[2] in "".join(map(chr, r.prompt_ids))
    assert all(dump_row(iv)["attempts"] == [] and dump_row(iv)["rescued"] for iv in ivs)
