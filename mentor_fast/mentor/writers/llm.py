"""LLM agents: the Diagnoser, the Instructor and the fused single-call variant over any text backend.

Replies are parsed tolerantly and asked again once; a reply that is still unusable is
`Failed("garbage")`, a backend failure (timeout, HTTP error) is `Failed("error")`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from mentor_fast.mentor.diagnosis import Diagnosis
from mentor_fast.mentor.writers.base import Failed, MentorBackend, Messages
from mentor_fast.mentor.writers.prompts import diagnose_messages, fused_messages, instruct_messages, prompt
from mentor_fast.mentor.writers.replies import parse_hint, parse_json_object

if TYPE_CHECKING:
    from mentor_fast.mentor.cases import FailureCase


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
            diag = Diagnosis.from_json(obj.get("diagnosis") if self.fused else obj, cases[i].task)
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
