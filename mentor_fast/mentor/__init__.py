"""MENTOR: when every rollout of a prompt fails, diagnose why, write a guarded instructional prompt,
and let the current policy re-try with it (docs/mentor.md).

Build from the config: `Mentor.from_config(cfg.mentor, builder, engine=..., tokenizer=...)`, then
`mentor.intervene(groups, step, generate_fn, score_fn, params)` each step (or the split:
`write_hints`, then `reroll` + `finish` on the step's `HintedStep`). The trainer uses it through
`MentorMethod` (method.py), which decides when each part runs and holds the hints in flight.

The package by concern: orchestration here (method.py, pipeline.py), what the mentor reads and
returns (cases.py, diagnosis.py), the leak guard (guard.py), the writers (writers/, built by
backends.py), and what it asks of a task (task.py; each task's folder of mentor_fast/tasks/ holds
its part). Scheduling, re-roll rounds and the assembly of rescued groups are any method's
(mentor_fast/recovery/).
"""

from mentor_fast.mentor.backends import BACKENDS, BackendKind, as_agents, build_backend
from mentor_fast.mentor.cases import FailureCase
from mentor_fast.mentor.counts import Counts
from mentor_fast.mentor.diagnosis import Diagnosis
from mentor_fast.mentor.guard import GuardVerdict, LeakGuard, check_hint, leak_gates, leaks_answer
from mentor_fast.mentor.method import SCHEDULES, MentorMethod
from mentor_fast.mentor.pipeline import HintedStep, Mentor, MentorOutcome
from mentor_fast.mentor.task import MentorTask, mentor_task
from mentor_fast.mentor.writers.base import Agents, Failed, MentorBackend
from mentor_fast.mentor.writers.llm import LLMAgents
from mentor_fast.mentor.writers.local import LocalBackend, SelfBackend
from mentor_fast.mentor.writers.openai import OpenAIBackend
from mentor_fast.mentor.writers.replies import parse_json_object
from mentor_fast.mentor.writers.solutions import WorkedSolutions, cold_hint

__all__ = [
    "BACKENDS",
    "SCHEDULES",
    "Agents",
    "BackendKind",
    "Counts",
    "Diagnosis",
    "Failed",
    "FailureCase",
    "GuardVerdict",
    "HintedStep",
    "LLMAgents",
    "LeakGuard",
    "LocalBackend",
    "Mentor",
    "MentorBackend",
    "MentorMethod",
    "MentorOutcome",
    "MentorTask",
    "OpenAIBackend",
    "SelfBackend",
    "WorkedSolutions",
    "as_agents",
    "build_backend",
    "check_hint",
    "cold_hint",
    "leak_gates",
    "leaks_answer",
    "mentor_task",
    "parse_json_object",
]
