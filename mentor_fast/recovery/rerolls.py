"""Re-roll rounds: the policy re-tries each hinted group under prompt + hint, one batched generate
call per round, and a group with no success goes on to the next round with a higher level's hint.

Nothing here knows where a hint comes from: MENTOR's are written from the failures
(mentor/pipeline.py), a static-hint method's would come with the data. A round needs the hinted
groups (`Intervention`s with `hint` set), a prompt builder, and the caller's way to escalate.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from mentor_fast.algo.assemble import LossMode
from mentor_fast.config import RerollConfig
from mentor_fast.recovery.intervention import Intervention
from mentor_fast.types import Rollout, Sample

GenerateFn = Callable[[list[list[int]], Any], list[list[Sample]]]  # (prompts, SamplingParams) -> [B][n]


class Scorer(Protocol):
    def __call__(self, rollouts: list[Rollout]) -> object:
        """Fill reward, correct and verifier_note (and verifier_detail) of each rollout in place."""
        ...


# the groups without a success after a round -> those with a new (higher-level) hint for the next
Escalate = Callable[[list[Intervention]], list[Intervention]]


@dataclass
class RerollRequest:
    """One round of re-rolls: the interventions whose q + hint prompts are `prompts`, and the
    sampling parameters (n = re-rolls per group, the round's seed)."""

    active: list[Intervention]
    prompts: list[list[int]]
    params: Any


class Rerolls:
    """cfg: recovery.reroll (count, max_rounds); loss_mode: group re-rolls G per group, the others
    `count`. builder: `encode(problem, hint) -> ids` (the PromptBuilder contract; a ValueError or a
    prompt over `builder.max_prompt_tokens` means no re-roll for that hint, counted as too_long).
    decode: completion ids -> text."""

    def __init__(self, cfg: RerollConfig, loss_mode: LossMode | str, builder: Any,
                 decode: Callable[[list[int]], str]) -> None:
        self.cfg, self.loss_mode, self.builder, self.decode = cfg, LossMode(loss_mode), builder, decode

    def per_round(self, ivs: list[Intervention]) -> int:
        if self.loss_mode != LossMode.GROUP:
            return self.cfg.count
        sizes = {len(iv.group.rollouts) for iv in ivs}
        if len(sizes) > 1:
            raise ValueError(
                f"loss_mode=group re-rolls G per group, but the groups have sizes {sorted(sizes)}"
            )
        return sizes.pop() if sizes else self.cfg.count

    def _encode(self, iv: Intervention) -> list[int] | None:
        try:
            ids = self.builder.encode(iv.group.problem, iv.hint.text)
        except ValueError:  # the builder refuses prompts over its limit
            ids = None
        limit = getattr(self.builder, "max_prompt_tokens", None)
        if ids is None or (limit is not None and len(ids) > limit):
            iv.fail("too_long")
            return None
        return ids

    def first_round(self, ivs: list[Intervention], params: Any) -> RerollRequest:
        """Round 0's prompts and sampling parameters, for a caller that generates them together with
        other work (the async mentor rides them in the next step's generate call). Pass the request
        and its samples to `run(..., first=(request, samples))`."""
        return self.request([iv for iv in ivs if iv.hint is not None], params, 0)

    def request(self, active: list[Intervention], params: Any, rnd: int) -> RerollRequest:
        prompts = {id(iv): self._encode(iv) for iv in active}
        active = [iv for iv in active if prompts[id(iv)] is not None]
        # streams keyed by group id: a group re-rolls the same on whichever rank holds it
        round_params = dataclasses.replace(
            params, n=self.per_round(active), seed=params.seed + 10_007 * (rnd + 1),
            keys=tuple(iv.group.group_id for iv in active),
        )
        return RerollRequest(active, [prompts[id(iv)] for iv in active], round_params)

    def run(self, ivs: list[Intervention], generate_fn: GenerateFn, score_fn: Scorer, params: Any,
            escalate: Escalate, policy_version: int | None = None,
            first: tuple[RerollRequest, list[list[Sample]]] | None = None) -> float:
        """Re-roll every hinted group, score, and escalate the groups with no success, for up to
        `max_rounds` rounds. `first`: round 0 generated elsewhere (see `first_round`). Returns the
        seconds spent escalating (writing hints, for MENTOR)."""
        esc_s = 0.0
        active = [iv for iv in ivs if iv.hint is not None]
        for rnd in range(self.cfg.max_rounds):
            if rnd > 0:
                t_esc = time.monotonic()
                active = escalate([iv for iv in active if not iv.rescued])
                esc_s += time.monotonic() - t_esc
            if rnd == 0 and first is not None:
                request, samples = first
            else:
                request = self.request(active, params, rnd)
                samples = generate_fn(request.prompts, request.params) if request.active else []
            active = request.active
            if not active:
                break
            self._score(request, samples, score_fn, policy_version)
            active = [iv for iv in active if not iv.rescued]
        return esc_s

    def _score(self, request: RerollRequest, samples: list[list[Sample]], score_fn: Scorer,
               policy_version: int | None) -> None:
        """One round's samples -> each group's next round of re-rolls, scored; rescues marked."""
        m = request.params.n
        if len(samples) != len(request.active) or any(len(ss) != m for ss in samples):
            raise ValueError(
                f"generate_fn returned {[len(ss) for ss in samples]} samples for "
                f"{len(request.active)} prompts x n={m}"
            )
        new: list[Rollout] = []
        for iv, ids, ss in zip(request.active, request.prompts, samples):
            # A re-roll cut by the horizon has no answer yet: it is neither a failure nor trained on.
            iv.cut += sum(s.finish_reason == "cut" for s in ss)
            iv.cut_tokens += sum(len(s.token_ids) for s in ss if s.finish_reason == "cut")
            iv.rounds.append([self._rollout(iv, ids, s) for s in ss if s.finish_reason != "cut"])
            iv.hints.append(iv.hint)
            iv.policy_version = policy_version
            new.extend(iv.rounds[-1])
        score_fn(new)
        for iv in request.active:
            if any(r.correct for r in iv.rounds[-1]):
                iv.rescued, iv.rescue_level = True, iv.hint.level

    def _rollout(self, iv: Intervention, prompt_ids: list[int], s: Sample) -> Rollout:
        return Rollout.from_sample(iv.group.problem, iv.group.group_id, prompt_ids, s, self.decode(s.token_ids),
                                   origin="mentor", hint=iv.hint)
