"""Typed records that flow one way through a step: Problem -> Sample -> Rollout -> Group -> TrainBatch.

Shape letters used in comments across the project: B prompts, G group size, N packed tokens,
T sequence length, H hidden size, V vocabulary.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

FinishReason = Literal["stop", "length", "cut"]  # cut: stopped by a re-roll horizon; never trained on
Origin = Literal["initial", "mentor", "expert"]  # expert: a sequence no policy sampled (method=luffy)


@dataclass(frozen=True)
class CodeTask:
    """What a code problem's program is checked against. Privileged like `solution_steps`: the tests
    and the solution reach the sandbox and the mentor, never the learner's prompt."""

    tests: str  # Python source run after the program in the same interpreter (asserts; HumanEval:
    # the problem's `test` plus `check(entry_point)`); for style "stdio", source that runs SOURCE
    entry_point: str = ""  # the function the tests call ("" for stdio programs)
    prompt: str = ""  # code the completion is assembled onto (HumanEval: imports, signature,
    # docstring); "" when the completion is the whole program
    solution: str = ""  # a correct program (the problem's reference solution), "" when unknown
    style: str = "function"  # "function": the tests call entry_point; "stdio": the tests run the
    # program's source (bound to the name SOURCE) on each input and compare what it prints
    step_markers: tuple[str, ...] = ()  # one regex per Problem.solution_steps entry: an attempt whose
    # code matches it has that step (the worked-solutions writer's "missing step"); () when unknown


@dataclass(frozen=True)
class Problem:
    """One task item. `solution_steps` is privileged: only the mentor sees it, never the learner."""

    id: str  # stable across runs (used by mentor memory and checkpoints)
    question: str
    gold: str  # the final answer, as text
    solution_steps: tuple[str, ...] = ()  # worked reference solution, one step per entry
    level: int | None = None  # difficulty level (built-in ladder) when known
    source: str = ""  # "ladder", "path/to/file.jsonl:17", ...
    columns: dict[str, Any] = field(default_factory=dict, hash=False, compare=False)  # extra dataset
    # columns, passed to custom reward functions as keyword arguments
    code: CodeTask | None = None  # code problems: tests, entry point, solution (gold is the
    # solution program, or "")
    context: tuple[tuple[str, str], ...] = ()  # conversational prompts: the (role, content) turns
    # before the question's user turn (a system message, earlier turns); () for a plain question


@dataclass
class Sample:
    """What a rollout engine returns for one generated sequence."""

    token_ids: list[int]  # completion tokens only (EOS included when the model stopped)
    logprobs: list[float]  # the sampler's log-prob of each completion token, same length
    finish_reason: FinishReason
    policy_version: int  # weights version that produced it


@dataclass
class Hint:
    """An instructional prompt written by the mentor for one problem."""

    text: str
    level: int  # 1 conceptual pointer, 2 plan, 3 concrete first step
    diagnosis: dict[str, Any] = field(default_factory=dict)
    backend: str = ""


@dataclass(frozen=True)
class TokenWeighting:
    """How a sequence's policy term is weighed per token (computed by algo/weights.py)."""

    kind: str  # algo.weights.Weighting: "truncated_is" (param: the cap) or "shaping" (param: gamma)
    param: float


@dataclass(frozen=True)
class ExtraTerm:
    """A loss term beside the policy objective on one sequence (computed by algo/terms.py)."""

    kind: str  # algo.terms.TermKind, e.g. "distill"
    coef: float
    context: tuple[int, ...] = ()  # distill: the prompt the student sees (the bare q)


@dataclass
class Rollout:
    """One scored completion in its own context (the exact prompt tokens it was conditioned on)."""

    problem: Problem
    group_id: int
    prompt_ids: list[int]  # context: q, or q + hint for mentor re-rolls
    completion_ids: list[int]
    sampler_logprobs: list[float]
    text: str
    finish_reason: FinishReason
    policy_version: int
    reward: float = 0.0
    correct: bool = False  # the verifier's flag; zero-reward groups are detected on this, never on reward
    verifier_note: str = ""  # e.g. "extracted 12, expected 15", "no \\boxed answer", "truncated"
    verifier_detail: Any = None  # the verifier's structured result when it has one (code: the
    # rewards.code.CodeResult of the sandboxed run), for the mentor's diagnosis
    origin: Origin = "initial"
    hint: Hint | None = None
    behaviour_prompt_ids: list[int] | None = None  # the context the sampler saw, when the loss uses
    # another (mentor.loss.mode=transfer: sampled under q + hint, trained under q); sampler_logprobs
    # are under this context, and pi_old is recomputed under prompt_ids
    weighting: TokenWeighting | None = None  # None: the run's mismatch correction (loss.is_mode)
    extra_terms: tuple[ExtraTerm, ...] = ()

    @classmethod
    def from_sample(cls, problem: Problem, group_id: int, prompt_ids: list[int], sample: Sample, text: str,
                    **fields: Any) -> Rollout:
        """The rollout of what an engine generated for `prompt_ids`: the sample's tokens, log-probs,
        finish reason and policy version; text: the decoded completion; fields: the others (origin,
        hint, ...), unscored."""
        return cls(problem=problem, group_id=group_id, prompt_ids=list(prompt_ids),
                   completion_ids=list(sample.token_ids), sampler_logprobs=list(sample.logprobs), text=text,
                   finish_reason=sample.finish_reason, policy_version=sample.policy_version, **fields)

    @property
    def truncated(self) -> bool:
        return self.finish_reason == "length"


@dataclass
class Group:
    """The G rollouts of one prompt; the advantage baseline uses only this group's rewards."""

    group_id: int
    problem: Problem
    prompt_ids: list[int]  # the original (unhinted) prompt
    rollouts: list[Rollout]

    @property
    def num_correct(self) -> int:
        return sum(r.correct for r in self.rollouts)

    @property
    def all_fail(self) -> bool:
        return self.num_correct == 0

    @property
    def all_pass(self) -> bool:
        return self.num_correct == len(self.rollouts)

    @property
    def has_signal(self) -> bool:
        """Rewards not all equal: a group-relative advantage is non-zero somewhere."""
        return len({r.reward for r in self.rollouts}) > 1

    @property
    def problem_id(self) -> str:
        return self.problem.id

    @property
    def size(self) -> int:
        return len(self.rollouts)


@dataclass(frozen=True)
class GroupSummary:
    """What the mentor's scheduler needs of a group; other ranks' groups travel as these."""

    group_id: int
    problem_id: str
    all_fail: bool
    size: int

    @classmethod
    def of(cls, g: Group) -> GroupSummary:
        return cls(g.group_id, g.problem.id, g.all_fail, len(g.rollouts))
