"""LLM agents: the Diagnoser, the Instructor and the fused single-call variant over any text backend.

Both agent kinds (these and the deterministic `ReferenceMentor`) have the same two batched calls:
`diagnose(cases) -> [Diagnosis | Failed]` and `instruct(cases, diagnoses, levels, feedback) ->
[str | Failed]`. Replies are parsed tolerantly and asked again once; a reply that is still
unusable is `Failed("garbage")`, a backend failure (timeout, HTTP error) is `Failed("error")`.
Code problems (`case.is_code`) get the code_*.txt templates: the same placeholders plus the
signature, the sandbox results of the attempts and the first failing test.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import cache
from importlib import resources
from string import Template
from typing import Any, Protocol

from mentor_fast.mentor.code_reference import analyse
from mentor_fast.mentor.counts import Counts
from mentor_fast.mentor.diagnosis import FAILURE_TYPES, Diagnosis, FailureCase
from mentor_fast.mentor.guard import MAX_WORDS

Messages = list[dict[str, str]]


@dataclass(frozen=True)
class Failed:
    reason: str  # "garbage" (unusable after one retry) or "error" (the backend returned None)


class MentorBackend(Protocol):
    """A text generator for the LLM agents. None marks an item that failed (counted in `counts`)."""

    name: str
    counts: Counts

    def complete(self, batch: list[Messages], max_tokens: int, temperature: float) -> list[str | None]: ...


class Agents(Protocol):
    name: str
    regenerates: bool  # asking again can give a different hint (False for deterministic agents)

    def diagnose(self, cases: list[FailureCase]) -> list[Diagnosis | Failed]: ...

    def instruct(
        self,
        cases: list[FailureCase],
        diagnoses: list[Diagnosis],
        levels: list[int],
        feedback: list[str | None],
    ) -> list[str | Failed]: ...


@cache
def prompt(name: str) -> str:
    """A template from mentor_fast/mentor/prompts/<name>.txt."""
    return (
        resources.files("mentor_fast.mentor").joinpath("prompts", f"{name}.txt").read_text(encoding="utf-8")
    )


@cache
def level_definitions(task: str = "math") -> dict[int, str]:
    text = prompt(_TEMPLATE_PREFIX.get(task, "") + "levels")
    lines = [ln.split(":", 1) for ln in text.splitlines() if ln.strip()]
    return {int(k): v.strip() for k, v in lines}


_TEMPLATE_PREFIX = {"math": "", "code": "code_"}  # task -> its templates' name prefix


def _task(case: FailureCase) -> str:
    return "code" if case.is_code else "math"


def _template(case: FailureCase, name: str) -> Template:
    return Template(prompt(_TEMPLATE_PREFIX[_task(case)] + name))


# ---------------------------------------------------------------- tolerant JSON


def _scan(text: str, may_open: Callable[[], bool] = lambda: True) -> Iterator[tuple[int, str, bool]]:
    """(index, char, inside a quoted string) per character; a quote opens a string only when
    may_open() says so at that point (evaluated lazily, so a caller's loop state can decide)."""
    quote, escape = "", False
    for i, ch in enumerate(text):
        if quote:
            closing = not escape and ch == quote
            escape = not escape and ch == "\\"
            yield i, ch, True
            if closing:
                quote = ""
        elif ch in "\"'" and may_open():
            quote = ch
            yield i, ch, True
        else:
            yield i, ch, False


def _balanced_objects(text: str) -> list[str]:
    """Every brace-balanced {...} span, outermost first, skipping braces inside strings (a quote
    outside any object, like the apostrophe in "here's", opens nothing)."""
    spans, start, depth = [], -1, 0
    for i, ch, quoted in _scan(text, lambda: depth > 0):  # noqa: B023 (reads the current depth on purpose)
        if quoted:
            continue
        if ch == "{":
            if depth == 0:
                start = i
            depth += 1
        elif ch == "}" and depth > 0:
            depth -= 1
            if depth == 0:
                spans.append(text[start : i + 1])
    return spans


_JSON_WORDS = {"true": "True", "false": "False", "null": "None"}


def _python_literals(text: str) -> str:
    """true/false/null -> True/False/None outside strings (for ast.literal_eval)."""
    quoted = [q for _, _, q in _scan(text)]
    return re.sub(r"\b(?:true|false|null)\b",
                  lambda m: m.group(0) if quoted[m.start()] else _JSON_WORDS[m.group(0)], text)


def _loads(candidate: str) -> Any:
    no_trailing = re.sub(r",\s*([}\]])", r"\1", candidate)
    for text in (candidate, no_trailing):
        try:
            return json.loads(text, strict=False)
        except json.JSONDecodeError:
            pass
    try:  # single quotes, Python literals
        return ast.literal_eval(_python_literals(no_trailing))
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return None


def parse_json_object(text: str | None) -> dict[str, Any] | None:
    """The first JSON object in a model reply: code fences, text around it, trailing commas,
    single quotes and Python literals are tolerated. None when there is no usable object."""
    if not text:
        return None
    text = re.sub(r"```[A-Za-z0-9]*", "", text)
    for candidate in _balanced_objects(text):
        obj = _loads(candidate)
        if isinstance(obj, dict):
            return obj
    return None


def parse_hint(text: str | None) -> str | None:
    """The hint inside <hint>...</hint>; a reply without tags counts when it is plain text."""
    if not text:
        return None
    m = re.search(r"<hint>(.*?)(?:</hint>|$)", text, re.DOTALL | re.IGNORECASE)
    hint = m.group(1) if m else re.sub(r"^\s*hint\s*:", "", text, flags=re.IGNORECASE)
    hint = hint.strip().strip('"').strip()
    return hint or None


# ---------------------------------------------------------------- prompts


def _code_values(case: FailureCase) -> dict[str, Any]:
    """What a code prompt holds beyond a math one. The reference program goes to the mentor (it is
    privileged, like a worked solution; the templates forbid writing code). Of the hidden tests the
    mentor sees only the failing assert lines the sandbox reported (in the attempts, and the first
    one here): a model shown every expected output tends to quote them, and a diagnosis needs the
    first failure only."""
    p, a = case.problem, analyse(case)
    return {
        "gold": (p.code.reference if p.code and p.code.reference else p.gold) or "(not available)",
        "reference": "\n".join(f"{i}. {s}" for i, s in enumerate(p.solution_steps, 1)) or "(not available)",
        "signature": a.signature or "(a whole program: it reads standard input and prints)",
        "first_test": a.first_test.render() if a.first_test else "(none: no attempt reached the tests)",
    }


def _common(case: FailureCase, head: int, tail: int) -> dict[str, Any]:
    values = _math_values(case, head, tail)
    return values | _code_values(case) if case.is_code else values


def _math_values(case: FailureCase, head: int, tail: int) -> dict[str, Any]:
    p = case.problem
    return {
        "question": p.question,
        "gold": p.gold,
        "reference": "\n".join(p.solution_steps) or "(not available)",
        "num_failed": sum(case.answers.values()),
        "group_size": case.group_size,
        "answers": case.render_answers(),
        "attempts": case.render_attempts(head, tail),
        "previous": "\n".join(f"- {h}" for h in case.previous_hints) or "(none)",
        "labels": ", ".join(FAILURE_TYPES[_task(case)]),
    }


def _chat(user: str) -> Messages:
    # The shared system text and the problem first: all calls about a problem share a prefix.
    return [{"role": "system", "content": prompt("system").strip()}, {"role": "user", "content": user}]


def diagnose_messages(case: FailureCase, head: int = 600, tail: int = 600) -> Messages:
    return _chat(_template(case, "diagnose").substitute(_common(case, head, tail)))


def fused_messages(case: FailureCase, head: int = 600, tail: int = 600) -> Messages:
    defs = "\n".join(level_definitions(_task(case))[lvl] for lvl in (1, 2, 3))
    words = ", ".join(str(MAX_WORDS[lvl] // 2) for lvl in (1, 2, 3))
    values = _common(case, head, tail) | {
        "level_definitions": defs,
        "max_words": f"{words} words for levels 1, 2, 3",
    }
    return _chat(_template(case, "fused").substitute(values))


def instruct_messages(
    case: FailureCase, diagnosis: Diagnosis, level: int, feedback: str | None = None
) -> Messages:
    values = _common(case, 0, 0) | {
        "diagnosis": json.dumps(diagnosis.to_dict(), ensure_ascii=False),
        "level_definition": level_definitions(_task(case))[level],
        "max_words": f"{MAX_WORDS[level] // 2} words",  # half the guard's cap: models overshoot
        "feedback": Template(prompt("rejected")).substitute(reason=feedback).strip() if feedback else "",
    }
    return _chat(_template(case, "instruct").substitute(values))


# ---------------------------------------------------------------- agents over a text backend


class LLMAgents:
    """Diagnoser + Instructor (or one fused call) over a `MentorBackend`."""

    regenerates = True

    def __init__(
        self,
        backend: MentorBackend,
        *,
        fused: bool = True,
        max_tokens: int = 512,
        hint_max_tokens: int = 256,
        temperature: float = 0.7,
        attempt_chars: int = 1200,
    ) -> None:
        self.backend, self.fused = backend, fused
        self.max_tokens, self.hint_max_tokens, self.temperature = max_tokens, hint_max_tokens, temperature
        self.head = self.tail = attempt_chars // 2
        self.name = backend.name

    def _ask(self, batch: list[Messages], max_tokens: int, parse, retry_text: str) -> list[Any]:
        """Complete, parse (`parse(index, reply) -> value | None`), and ask once more (with the bad
        reply shown) for the items that did not parse."""
        replies = self.backend.complete(batch, max_tokens, self.temperature)
        out: list[Any] = [Failed("error") if r is None else parse(i, r) for i, r in enumerate(replies)]
        again = [i for i, o in enumerate(out) if o is None]
        if again:
            self.backend.counts.add("retries/parse", len(again))
            follow = [
                batch[i]
                + [
                    {"role": "assistant", "content": replies[i] or ""},
                    {"role": "user", "content": retry_text},
                ]
                for i in again
            ]
            for i, r in zip(again, self.backend.complete(follow, max_tokens, self.temperature)):
                parsed = None if r is None else parse(i, r)
                out[i] = parsed if parsed is not None else Failed("garbage" if r is not None else "error")
        return out

    def diagnose(self, cases: list[FailureCase]) -> list[Diagnosis | Failed]:
        if not cases:
            return []
        build = fused_messages if self.fused else diagnose_messages
        batch = [build(c, self.head, self.tail) for c in cases]
        tokens = self.max_tokens + (3 * self.hint_max_tokens if self.fused else 0)
        objs = self._ask(batch, tokens, self._parse_diagnosis_reply(cases), prompt("retry_json").strip())
        out: list[Diagnosis | Failed] = []
        for case, obj in zip(cases, objs):
            if isinstance(obj, Failed):
                out.append(obj)
                continue
            diag, hints = obj
            case.hint_cache.update(hints)
            out.append(diag)
        return out

    def _parse_diagnosis_reply(self, cases: list[FailureCase]):
        def parse(i: int, reply: str):
            obj = parse_json_object(reply)
            if obj is None:
                return None
            diag = Diagnosis.from_json(obj.get("diagnosis") if self.fused else obj, _task(cases[i]))
            if diag is None:
                return None
            hints = {
                lvl: str(obj[f"hint_l{lvl}"]).strip()
                for lvl in (1, 2, 3)
                if self.fused and isinstance(obj.get(f"hint_l{lvl}"), str) and obj[f"hint_l{lvl}"].strip()
            }
            return diag, hints

        return parse

    def instruct(
        self,
        cases: list[FailureCase],
        diagnoses: list[Diagnosis],
        levels: list[int],
        feedback: list[str | None],
    ) -> list[str | Failed]:
        out: list[str | Failed | None] = [None] * len(cases)
        ask = []
        for i, (case, level, fb) in enumerate(zip(cases, levels, feedback)):
            if fb is None and level in case.hint_cache:
                out[i] = case.hint_cache.pop(level)  # a fused hint is used once; a re-ask writes anew
            else:
                ask.append(i)
        batch = [instruct_messages(cases[i], diagnoses[i], levels[i], feedback[i]) for i in ask]
        if batch:
            hints = self._ask(
                batch, self.hint_max_tokens, lambda _, r: parse_hint(r), prompt("retry_hint").strip()
            )
            for i, h in zip(ask, hints):
                out[i] = h
        return out  # type: ignore[return-value]
