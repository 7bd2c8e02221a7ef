"""How mentor re-rolls enter the batch (`mentor.loss.mode`; docs/mentor.md).

A registry keyed by `LossMode`; each entry turns one all-fail group plus its re-rolls into the
group that goes into the loss:
- replace (default): up to `max_replace` successful re-rolls, lowest hint level first, replace
  failed originals chosen by a seeded RNG. Each re-roll keeps its own context (prompt_ids = q + h)
  and the trainer recomputes its log-probs in that context; the group keeps its id and size G.
- group: the group's G rollouts are replaced by the G re-rolls of one hinted round (context q + h).
  The re-roll count must be G. The group id is kept (the old rollouts are gone, so no two contexts
  share a baseline).
- transfer: as replace, but the inserted re-roll is trained in the original context q, without
  the hint (`prompt_ids` = q; `behaviour_prompt_ids` keeps q + h, under which it was sampled). The
  update weighs each of its tokens by min(pi_old(y_t | q) / mu(y_t | q + h), mentor.loss.transfer_is_cap),
  so tokens the hint made likely (a copied intermediate result) count for little, and tokens the
  policy would write anyway count fully (Guide-GRPO's re-weighting toward the no-hint context).
- shaping: placed as in transfer (trained under q), but without the importance weight, which is near
  0 on exactly the tokens the hint supplied. Each token is weighed so that its gradient is that of
  LUFFY's shaped objective -A f(pi(y_t | q)), f(p) = p / (p + gamma) (LUFFY, arXiv 2504.14945):
  the update multiplies its clipped term by gamma p / (p + gamma)^2, p = pi_old(y_t | q)
  (`mentor.loss.shaping_gamma`). At the first gradient step on a batch the ratio is 1 and this gradient
  is LUFFY's exactly; with more PPO epochs or mini-batches the usual clip applies on top.

Loss mask: prompt tokens, the hint included, are never in the loss. Every Rollout carries its
whole context in `prompt_ids`, and the trainer masks everything in `prompt_ids`, so no extra
masking is needed here.

Invariants, checked on every call (AssertionError with a message when broken): group ids and sizes
are kept, groups without re-rolls are the same objects, a replaced group was all-fail and its
correct count equals the number of inserted successes, inserted rollouts carry the group's id.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable, Mapping, Sequence

from mentor_fast.compat import StrEnum
from mentor_fast.types import Group, Rollout


class LossMode(StrEnum):
    REPLACE = "replace"
    GROUP = "group"
    TRANSFER = "transfer"
    SHAPING = "shaping"


# (group, its re-rolls, max_replace, rng) -> (new group, the rollouts inserted into it)
Assembler = Callable[[Group, list[Rollout], int, random.Random], tuple[Group, list[Rollout]]]


def _level(r: Rollout) -> int:
    return r.hint.level if r.hint is not None else 0


def assemble_replace(
    group: Group, rerolls: list[Rollout], max_replace: int, rng: random.Random
) -> tuple[Group, list[Rollout]]:
    successes = sorted((r for r in rerolls if r.correct), key=_level)  # stable: round order within a level
    failed = [i for i, r in enumerate(group.rollouts) if not r.correct]
    k = min(max_replace, len(successes), len(failed))
    rollouts = list(group.rollouts)
    for pos, r in zip(sorted(rng.sample(failed, k)), successes[:k]):
        rollouts[pos] = r
    return Group(group.group_id, group.problem, group.prompt_ids, rollouts), successes[:k]


def assemble_transfer(
    group: Group, rerolls: list[Rollout], max_replace: int, rng: random.Random
) -> tuple[Group, list[Rollout]]:
    new, inserted = assemble_replace(group, rerolls, max_replace, rng)
    moved = {
        id(r): dataclasses.replace(
            r, prompt_ids=list(group.prompt_ids), behaviour_prompt_ids=list(r.prompt_ids)
        )
        for r in inserted
    }
    rollouts = [moved.get(id(r), r) for r in new.rollouts]
    return Group(group.group_id, group.problem, group.prompt_ids, rollouts), list(moved.values())


def assemble_group(
    group: Group, rerolls: list[Rollout], max_replace: int, rng: random.Random
) -> tuple[Group, list[Rollout]]:
    g = len(group.rollouts)
    if len(rerolls) != g:
        raise ValueError(
            f"loss_mode=group needs exactly G={g} re-rolls for group {group.group_id} "
            f"(one hinted round), got {len(rerolls)}"
        )
    contexts = {tuple(r.prompt_ids) for r in rerolls}
    if len(contexts) != 1:
        raise ValueError(
            f"loss_mode=group: the re-rolls of group {group.group_id} come from {len(contexts)} "
            "different hinted prompts; a hinted group must share one context"
        )
    return Group(group.group_id, group.problem, group.prompt_ids, list(rerolls)), list(rerolls)


ASSEMBLERS: dict[LossMode, Assembler] = {
    LossMode.REPLACE: assemble_replace,
    LossMode.GROUP: assemble_group,
    LossMode.TRANSFER: assemble_transfer,
    LossMode.SHAPING: assemble_transfer,  # same placement; the update weighs the tokens differently
}


def check_assembly(
    before: Sequence[Group], after: Sequence[Group], inserted: Mapping[int, Sequence[Rollout]]
) -> None:
    """Raise AssertionError when the assembled batch breaks an invariant (see the module doc)."""
    assert len(before) == len(after), f"group count changed: {len(before)} -> {len(after)}"
    for old, new in zip(before, after):
        gid = old.group_id
        assert new.group_id == gid, f"group id changed: {gid} -> {new.group_id}"
        assert len(new.rollouts) == len(old.rollouts), (
            f"group {gid}: size changed {len(old.rollouts)} -> {len(new.rollouts)}"
        )
        assert all(r.group_id == gid for r in new.rollouts), f"group {gid}: holds a rollout of another group"
        if gid not in inserted:
            assert new is old or all(a is b for a, b in zip(old.rollouts, new.rollouts)), (
                f"group {gid} had no re-rolls but its rollouts changed"
            )
            continue
        assert old.all_fail, f"group {gid}: re-rolls inserted into a group that already had a correct rollout"
        n_ok = sum(r.correct for r in inserted[gid])
        assert new.num_correct == n_ok, (
            f"group {gid}: {new.num_correct} correct after assembly, {n_ok} successes inserted"
        )
        assert all(r.origin != "initial" for r in inserted[gid]), (
            f"group {gid}: inserted one of the step's own rollouts"
        )


def assemble_groups(
    groups: Sequence[Group],
    rerolls: Mapping[int, Sequence[Rollout]],
    mode: LossMode | str = "replace",
    max_replace: int = 1,
    seed: int = 0,
) -> list[Group]:
    """The batch after MENTOR: `rerolls` maps a group id to that group's re-rolls (replace: all of
    them, any round; group: the G re-rolls of the round to use). Other groups pass unchanged."""
    mode = LossMode(mode)  # every mode has an assembler (tests/test_mentor_backends.py)
    ids = [g.group_id for g in groups]
    if len(set(ids)) != len(ids):
        raise ValueError("group ids in a batch must be unique")
    unknown = set(rerolls) - set(ids)
    if unknown:
        raise ValueError(f"re-rolls for groups not in the batch: {sorted(unknown)}")
    for gid, rs in rerolls.items():
        if any(r.group_id != gid for r in rs):
            raise ValueError(f"re-rolls filed under group {gid} carry another group id")
    out, inserted = [], {}
    for g in groups:
        rs = list(rerolls.get(g.group_id, ()))
        if not rs:
            out.append(g)
            continue
        new, added = ASSEMBLERS[mode](g, rs, max_replace, random.Random(f"{seed}:{g.group_id}"))
        out.append(new)
        inserted[g.group_id] = added
    check_assembly(groups, out, inserted)
    return out
