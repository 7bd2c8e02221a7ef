"""MENTOR: when every rollout of a prompt fails, diagnose why, write a guarded instructional prompt,
and let the current policy re-try with it (research/algorithm.md 2.6-2.12).

Build from the config: `Mentor.from_config(cfg.mentor, builder, engine=..., tokenizer=...)`, then
`mentor.intervene(groups, step, generate_fn, score_fn, params)` each step (or the async split
`write_hints` in a background thread, then `reroll` + `finish` on the trainer's thread). The
trainer uses it through `MentorMethod` (method.py), which holds the hints in flight.
"""

from mentor_fast.mentor.agents import Failed, LLMAgents, MentorBackend, parse_json_object
from mentor_fast.mentor.backends import (
    BACKENDS,
    BackendKind,
    LocalBackend,
    SelfBackend,
    as_agents,
    build_backend,
)
from mentor_fast.mentor.counts import Counts
from mentor_fast.mentor.diagnosis import CODE_FAILURES, MATH_FAILURES, Diagnosis, FailureCase
from mentor_fast.mentor.guard import GuardVerdict, LeakGuard, check_hint, leaks_answer
from mentor_fast.mentor.method import MentorMethod
from mentor_fast.mentor.openai_backend import OpenAIBackend
from mentor_fast.mentor.pipeline import Intervention, Mentor, MentorOutcome
from mentor_fast.mentor.reference import ReferenceMentor
from mentor_fast.mentor.scheduler import CollapseDetector, Scheduler, StepPlan

__all__ = [
    "BACKENDS",
    "CODE_FAILURES",
    "MATH_FAILURES",
    "BackendKind",
    "CollapseDetector",
    "Counts",
    "Diagnosis",
    "Failed",
    "FailureCase",
    "GuardVerdict",
    "Intervention",
    "LLMAgents",
    "LeakGuard",
    "LocalBackend",
    "Mentor",
    "MentorBackend",
    "MentorMethod",
    "MentorOutcome",
    "OpenAIBackend",
    "ReferenceMentor",
    "Scheduler",
    "SelfBackend",
    "StepPlan",
    "as_agents",
    "build_backend",
    "check_hint",
    "leaks_answer",
    "parse_json_object",
]
