"""A built-in verifier (`Verifier`, each task builds its own) and what it says about one completion:
the math verifier (math.py, pool.py) and the code verifier (code.py) both answer in a `Verdict`,
which the scorer (registry.py) turns into rewards and metrics and the mentor's diagnoser reads."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from mentor_fast.compat import StrEnum
from mentor_fast.types import Problem


class Status(StrEnum):
    OK = "ok"  # an answer was parsed and compared (correct or not); a program ran its tests
    NO_ANSWER = "no_answer"  # nothing that looks like an answer (no code in the completion)
    UNPARSEABLE = "unparseable"  # an answer string was found but is not valid math (a program's SyntaxError)
    TIMEOUT = "timeout"  # math-verify's own timeout, the pool's wall-clock kill, a program's deadline
    ERROR = "error"  # the verifier failed on this input (type in Verdict.error): sympy raised, a sandbox error


@dataclass(frozen=True)
class Verdict:
    """One checked completion; `note` is what the mentor's diagnoser reads."""

    correct: bool
    extracted: str | None  # the answer text (code: the program) that was compared, None if nothing was extracted
    note: str  # "extracted 12, expected 15", "no \\boxed answer; ...", "unparseable answer ...", "all tests passed"
    status: Status = Status.OK
    error: str = ""  # exception type name for ERROR / TIMEOUT
    detail: Any = None  # structured result (code: a CodeResult), copied to Rollout.verifier_detail

    @property
    def parse_error(self) -> bool:
        return self.status in (Status.UNPARSEABLE, Status.ERROR)


class Verifier(Protocol):
    """A built-in checker: one Verdict per (completion, problem), in order."""

    def check(self, completions: list[str], problems: list[Problem]) -> list[Verdict]: ...

    def describe(self) -> str:
        """One line for the start of a run: what checks the answers, and how it is isolated."""
        ...

    def pop_metrics(self) -> dict[str, float]:
        """Counts since the last call (e.g. code run statuses), summed into the step's metrics."""
        ...

    def close(self) -> None: ...
