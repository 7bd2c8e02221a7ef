"""What the diagnoser returns: a `Diagnosis`, its failure type a label of the task's closed taxonomy
(each task's mentor.py, mentor_fast/tasks/: lists its own labels and the aliases a model tends to write)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mentor_fast.mentor.task import MentorTask

# aliases of the labels both taxonomies have (format, truncation); each task adds its own
SHARED_ALIASES = {
    "format_extraction": "format",
    "extraction": "format",
    "formatting": "format",
    "no_code": "format",
    "truncation_overlong": "truncation",
    "overlong": "truncation",
    "truncated": "truncation",
}


def closed_label(label: Any, failures: tuple[str, ...], aliases: Mapping[str, str]) -> str:
    """`label` as one of `failures` (through `aliases`), or "other"."""
    key = re.sub(r"[^a-z0-9]+", "_", str(label).lower()).strip("_")
    key = aliases.get(key, key)
    return key if key in failures else "other"


@dataclass
class Diagnosis:
    failure_type: str  # a label of the task's taxonomy, or "other"
    root_cause: str = ""
    first_error: str = ""
    missing_knowledge: str | None = None
    confidence: float = 0.5

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, obj: Any, task: MentorTask) -> Diagnosis | None:
        """A diagnosis from a parsed JSON object, or None when it has no failure_type."""
        if not isinstance(obj, dict) or not obj.get("failure_type"):
            return None
        try:
            confidence = min(1.0, max(0.0, float(obj.get("confidence", 0.5))))
        except (TypeError, ValueError):
            confidence = 0.5
        missing = obj.get("missing_knowledge")
        return cls(
            failure_type=task.label(obj["failure_type"]),
            root_cause=str(obj.get("root_cause") or ""),
            first_error=str(obj.get("first_error") or ""),
            missing_knowledge=None if missing in (None, "", "null", "none") else str(missing),
            confidence=confidence,
        )
