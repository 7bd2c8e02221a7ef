"""Scripted stand-ins for tests (the mentor's and the trainer's): a text backend with scripted
replies, a character-level prompt builder, a generate function driven by a rule, an exact scorer.
Nothing here is used by a real run.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from mentor_fast.answers import last_boxed
from mentor_fast.mentor.counts import Counts
from mentor_fast.types import Group, Problem, Rollout, Sample

HEADER = "A tutor looked at your previous attempt and suggests:"
Reply = str | None


class ScriptedBackend:
    """A `MentorBackend` whose replies come from a script: a function of the messages, or a list
    consumed in order (None = a failed item). Every batch it received is kept in `calls`."""

    name = "scripted"

    def __init__(self, script: Callable[[list[dict[str, str]]], Reply] | Sequence[Reply]) -> None:
        self.script = script if callable(script) else list(script)
        self.calls: list[list[list[dict[str, str]]]] = []
        self.counts = Counts()

    def complete(self, batch: list[list[dict[str, str]]], max_tokens: int, temperature: float) -> list[Reply]:
        self.calls.append(batch)
        out = []
        for messages in batch:
            reply = self.script(messages) if callable(self.script) else self.script.pop(0)
            if reply is None:
                self.counts.add("errors/scripted")
            out.append(reply)
        return out


class CharTokenizer:
    """One token per character (ids are code points): prompts and completions stay readable."""

    def encode(self, text: str) -> list[int]:
        return [ord(c) for c in text]

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return "".join(chr(i) for i in ids)


class CharPromptBuilder:
    """The PromptBuilder contract on characters: the hint goes after a fixed header at the end,
    so hinted ids start with the unhinted prompt's ids."""

    def __init__(self, max_prompt_tokens: int = 4096) -> None:
        self.tokenizer = CharTokenizer()
        self.max_prompt_tokens = max_prompt_tokens

    def encode(self, problem: Problem, hint: str | None = None) -> list[int]:
        text = f"Q: {problem.question}" + (f"\n{HEADER}\n{hint}" if hint else "")
        return self.tokenizer.encode(text)


def scripted_generate(rule: Callable[[str, int], str], policy_version: int = 1, log: list | None = None):
    """A generate_fn: rule(prompt_text, sample_index) -> completion text. `log` records each call."""
    tok = CharTokenizer()

    def generate(prompts: list[list[int]], params: Any) -> list[list[Sample]]:
        if log is not None:
            log.append((len(prompts), params))
        out = []
        for ids in prompts:
            prompt = tok.decode(ids)
            texts = [rule(prompt, i) for i in range(params.n)]
            out.append([Sample(tok.encode(t), [-0.5] * len(t), "stop", policy_version) for t in texts])
        return out

    return generate


def exact_score(rollouts: list[Rollout]) -> None:
    """correct = the last boxed answer equals the gold text; reward 1/0."""
    for r in rollouts:
        got = last_boxed(r.text)
        r.correct = got is not None and got.strip() == r.problem.gold.strip()
        r.reward = float(r.correct)
        r.verifier_note = (
            "no \\boxed answer" if got is None else f"extracted {got}, expected {r.problem.gold}"
        )


def ladder_problem(pid: str = "ladder-1") -> Problem:
    return Problem(
        pid,
        "A crate holds 47 apples. 385 more arrive, then 129 are sold. How many apples are left?",
        "303",
        ("47 + 385 = 432", "432 - 129 = 303"),
        level=2,
        source="ladder",
    )


def make_group(
    problem: Problem,
    texts: Sequence[str],
    group_id: int = 0,
    *,
    correct: Sequence[bool] | None = None,
    reward: Sequence[float] | None = None,
    finish: str = "stop",
) -> Group:
    """A scored group of initial rollouts (correct/reward scored exactly unless given)."""
    tok = CharTokenizer()
    prompt = tok.encode(f"Q: {problem.question}")
    rollouts = [
        Rollout(problem, group_id, list(prompt), tok.encode(t), [-0.5] * len(t), t, finish, 0) for t in texts
    ]  # type: ignore[arg-type]
    exact_score(rollouts)
    for i, r in enumerate(rollouts):
        if correct is not None:
            r.correct = correct[i]
        if reward is not None:
            r.reward = reward[i]
    return Group(group_id, problem, list(prompt), rollouts)


def mentor_configs(*overrides: str, enable: bool = True):
    """A MentorConfig and its budget (RecoveryConfig) through the real loader, to pass as
    `Mentor(*mentor_configs(...), backend, builder)`: `mentor_configs("reroll.count=2", "trigger.start_level=3")`
    gives what `recovery.reroll.count=2 recovery.trigger.start_level=3` on the command line gives."""
    from mentor_fast.config import load_config

    keys = [f"mentor.enable={str(enable).lower()}", *(f"mentor.{o}" for o in overrides)]
    cfg = load_config([], keys)
    return cfg.mentor, cfg.recovery
