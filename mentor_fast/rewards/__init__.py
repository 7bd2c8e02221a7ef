"""Rewards: math answers checked by math-verify in a process pool; programs run in a sandbox with
their tests in a checker process beside it (code.py; the threat model is in docs/code.md);
TRL-style custom functions.

Importing this package does not import math-verify or sympy (workers do, on first use).
"""

from mentor_fast.answers import last_boxed
from mentor_fast.rewards.math import is_correct, verify
from mentor_fast.rewards.pool import MathVerifierPool, VerifierPoolError
from mentor_fast.rewards.registry import RewardScorer, load_reward_function
from mentor_fast.rewards.verdict import Status, Verdict, Verifier

__all__ = [
    "MathVerifierPool",
    "RewardScorer",
    "Status",
    "Verdict",
    "Verifier",
    "VerifierPoolError",
    "is_correct",
    "last_boxed",
    "load_reward_function",
    "verify",
]
