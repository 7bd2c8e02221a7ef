"""What the mentor reports: a step's metrics and the mentor.jsonl row of each intervention."""

from __future__ import annotations

from collections import Counter
from typing import Any

from mentor_fast.mentor.cases import truncate_middle
from mentor_fast.metrics import Reduce, Reduction
from mentor_fast.recovery.intervention import Intervention
from mentor_fast.recovery.scheduler import StepPlan
from mentor_fast.types import Group

# How the metrics below reduce over ranks where their names alone would not say (the rest are
# counts, summed): the scheduler's plan is global, every rank reports it the same.
METRICS: dict[str, Reduction] = {
    **dict.fromkeys(("mentor/latency_s", "mentor/reroll_s"), Reduction(Reduce.MAX, timing=True)),
    "mentor/overlap_frac": Reduction(Reduce.MIN, timing=True),
    **dict.fromkeys(("mentor/all_fail_frac", "mentor/collapse_event", "mentor/surge_active", "mentor/over_budget",
                     "mentor/graduations", "mentor/hinted_step"), Reduction(Reduce.SHARED)),
    "groups/all_fail_frac_after_mentor": Reduction(Reduce.MEAN, weight="mentor/assembled_groups"),
}


def step_metrics(plan: StepPlan | None, ivs: list[Intervention], out: list[Group], graduations: int,
                 counts) -> dict[str, float]:
    """A step's mentor/* metrics from its plan and interventions; `out` is the assembled batch."""
    rejects = Counter(v["gate"] for iv in ivs for v in iv.verdicts if not v["ok"])
    levels = Counter(iv.rescue_level or iv.hints[-1].level for iv in ivs if iv.hints)
    no_hint = [iv for iv in ivs if iv.hint is None and not iv.hints]
    m: dict[str, float] = {
        "mentor/triggered": len(ivs),
        "mentor/rescued": sum(iv.rescued for iv in ivs),
        "mentor/latency_s": plan.latency_s if plan else 0.0,
        "mentor/reroll_s": plan.reroll_s if plan else 0.0,
        "mentor/rerolls": sum(len(iv.rerolls) for iv in ivs),
        "mentor/rerolls_cut": sum(iv.cut for iv in ivs),
        # what the re-rolls cost: every token decoded, the cut re-rolls' included
        "mentor/reroll_tokens": sum(len(r.completion_ids) for iv in ivs for r in iv.rerolls)
        + sum(iv.cut_tokens for iv in ivs),
        "mentor/leak_rejects": sum(rejects.values()),
        "mentor/graduations": graduations,
        "groups/all_fail_frac_after_mentor": sum(g.all_fail for g in out) / len(out) if out else 0.0,
        "mentor/assembled_groups": len(out),
        "mentor/garbage": sum(iv.garbage for iv in ivs),
        "mentor/no_hint": len(no_hint),
        "mentor/collapse_event": float(plan.collapse_event) if plan else 0.0,
        "mentor/surge_active": float(plan.surge_active) if plan else 0.0,
        "mentor/all_fail_frac": plan.all_fail_frac if plan else 0.0,
        "mentor/over_budget": plan.over_budget if plan else 0,
    }
    m |= {f"mentor/level_{lvl}": levels.get(lvl, 0) for lvl in (1, 2, 3)}
    m |= {f"mentor/leak_rejects/{gate}": n for gate, n in rejects.items()}
    m |= {f"mentor/no_hint/{r}": n for r, n in Counter(iv.no_hint_reason for iv in no_hint).items()}
    if counts is not None:  # the text backend's
        m |= {f"mentor/{k}": v for k, v in counts.drain().items()}
    return {k: float(v) for k, v in m.items()}


def dump_row(iv: Intervention) -> dict[str, Any]:
    """One mentor.jsonl row: an intervention's attempts, diagnosis, hints, verdicts and re-rolls."""
    p = iv.group.problem
    case = iv.case
    return {
        "step": iv.step,
        "group_id": iv.group.group_id,
        "problem_id": p.id,
        "question": p.question,
        "gold": p.gold,
        "attempts": [
            {
                "text": truncate_middle(r.text, 300, 300),
                "answer": case.task.attempt_key(r),
                "note": r.verifier_note,
                "finish_reason": r.finish_reason,
            }
            for r in (case.attempts if case else [])
        ],
        "diagnosis": iv.diagnosis.to_dict() if iv.diagnosis else None,
        "hint": iv.hints[-1].text if iv.hints else (iv.hint.text if iv.hint else None),
        "level": iv.rescue_level or (iv.hints[-1].level if iv.hints else None),
        "hints": [{"level": h.level, "text": h.text} for h in iv.hints],
        "guard": iv.verdicts,
        "rerolls": [
            {
                "round": k,
                "level": r.hint.level if r.hint else None,
                "reward": r.reward,
                "correct": r.correct,
                "text": truncate_middle(r.text, 200, 200),
            }
            for k, rs in enumerate(iv.rounds)
            for r in rs
        ],
        "rerolls_cut": iv.cut,
        "rescued": iv.rescued,
        "no_hint_reason": iv.no_hint_reason,
        "latency_s": round(iv.latency_s, 4),
        "policy_version": iv.policy_version,
    }
