"""Who writes the hints, as the mentor calls them: `Agents` (a diagnoser and an instructor, LLM or
deterministic) and `MentorBackend` (a text generator the LLM agents run on).

Both agent kinds have the same two batched calls: `diagnose(cases) -> [Diagnosis | Failed]` and
`instruct(cases, diagnoses, levels, feedback) -> [str | Failed]`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from mentor_fast.mentor.counts import Counts
from mentor_fast.mentor.diagnosis import Diagnosis

if TYPE_CHECKING:
    from mentor_fast.mentor.cases import FailureCase

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
