"""Reward kinds, TRL-style custom reward functions, and the scorer that fills in Rollouts.

reward = w_0 * c + sum_k w_k * f_k, with c in {0, 1} the built-in verifier's flag and f_k the custom
functions' values (None: "not applicable", contributes 0). `Rollout.correct` is c alone, never
the shaped reward: zero-reward groups are detected on it. A custom function that raises or returns
the wrong number of values contributes nothing for that batch and is counted by error type under
`reward/errors/<name>/<Type>`; the run goes on.
"""

from __future__ import annotations

import collections
import enum
import importlib
import math
from collections.abc import Callable
from typing import Any, Protocol, Self

from mentor_fast.config import RewardConfig
from mentor_fast.rewards.math import Status, Verdict
from mentor_fast.rewards.pool import MathVerifierPool
from mentor_fast.types import Rollout


class RewardKind(enum.StrEnum):
    MATH = "math"
    # CODE = "code"  (sandboxed tests; later)


class Verifier(Protocol):
    """A built-in checker: one Verdict per (completion, gold), in order."""

    def verify_batch(self, completions: list[str], golds: list[str]) -> list[Verdict]: ...

    def close(self) -> None: ...


def _math_verifier(cfg: RewardConfig) -> Verifier:
    return MathVerifierPool(workers=cfg.workers, timeout_s=cfg.timeout_s)


VERIFIERS: dict[RewardKind, Callable[[RewardConfig], Verifier]] = {RewardKind.MATH: _math_verifier}

RewardFn = Callable[..., list]


def load_reward_function(spec: str) -> RewardFn:
    """Import "package.module:function"; errors name the spec."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"reward function {spec!r} must look like 'package.module:function'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise ValueError(f"reward function {spec!r}: cannot import {module_name!r}: {e}") from e
    fn = getattr(module, attr, None)
    if fn is None:
        raise ValueError(f"reward function {spec!r}: {module_name!r} has no callable {attr!r}")
    if not callable(fn):
        raise TypeError(f"reward function {spec!r}: {attr!r} is a {type(fn).__name__}, not a function")
    return fn


def _names(specs: list[str]) -> list[str]:
    """Metric names: the function name, or the full spec where two functions share a name."""
    short = [s.partition(":")[2] for s in specs]
    counts = collections.Counter(short)
    return [n if counts[n] == 1 else s.replace(":", ".") for n, s in zip(short, specs, strict=True)]


def _fn_kwargs(rollouts: list[Rollout]) -> dict[str, list[Any]]:
    """TRL-style keyword columns: dataset columns first, then ours (ours win on a name clash)."""
    columns: dict[str, list[Any]] = {}
    for key in dict.fromkeys(k for r in rollouts for k in r.problem.columns):
        columns[key] = [r.problem.columns.get(key) for r in rollouts]
    golds = [r.problem.gold for r in rollouts]
    columns.update(
        prompts=[r.problem.question for r in rollouts],
        gold=golds,
        answer=golds,
        problem_id=[r.problem.id for r in rollouts],
        completion_ids=[r.completion_ids for r in rollouts],
    )
    return columns


class _BadReturn(Exception):
    """A reward function returned something unusable; `kind` is the metric's error name."""

    def __init__(self, kind: str, detail: str):
        super().__init__(detail)
        self.kind = kind


def _check_values(values: Any, n: int) -> list[float | None]:
    if not isinstance(values, (list, tuple)) or len(values) != n:
        got = len(values) if isinstance(values, (list, tuple)) else type(values).__name__
        raise _BadReturn("WrongLength", f"expected a list of {n} values, got {got}")
    out: list[float | None] = []
    for v in values:
        if v is None:
            out.append(None)
        elif isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
            out.append(float(v))
        else:
            raise _BadReturn("BadValue", f"expected a finite number or None, got {v!r}")
    return out


class RewardScorer:
    """Scores rollouts in place: `reward`, `correct`, `verifier_note`; returns per-batch metrics."""

    def __init__(self, cfg: RewardConfig, verifier: Verifier | None = None):
        """verifier: share an already built checker (not closed by `close`); default: from the registry."""
        n_parts = 1 + len(cfg.functions)
        if cfg.weights and len(cfg.weights) != n_parts:
            raise ValueError(
                f"reward.weights has {len(cfg.weights)} entries; need {n_parts} (built-in + one per function)"
            )
        self.kind = RewardKind(cfg.kind)
        self.weights = [float(w) for w in cfg.weights] or [1.0] * n_parts
        self.functions = [load_reward_function(s) for s in cfg.functions]
        self.names = _names(cfg.functions)
        self._own_verifier = verifier is None
        self.verifier = verifier if verifier is not None else VERIFIERS[self.kind](cfg)
        self.errors: collections.Counter[str] = collections.Counter()  # cumulative, by metric key
        self.last_error: dict[str, str] = {}  # function name -> last failure, for debugging

    def score(self, rollouts: list[Rollout]) -> dict[str, float]:
        if not rollouts:
            return {}
        verdicts = self.verifier.verify_batch([r.text for r in rollouts], [r.problem.gold for r in rollouts])
        metrics: dict[str, float] = collections.defaultdict(float)
        totals = [self.weights[0] * float(v.correct) for v in verdicts]
        kwargs = _fn_kwargs(rollouts) if self.functions else {}
        for fn, name, weight in zip(self.functions, self.names, self.weights[1:], strict=True):
            values = self._call(fn, name, rollouts, kwargs, metrics)
            if values is None:
                continue
            applicable = [v for v in values if v is not None]
            metrics[f"reward/{name}/mean"] = sum(applicable) / len(applicable) if applicable else 0.0
            metrics[f"reward/{name}/none_frac"] = 1.0 - len(applicable) / len(values)
            totals = [t + weight * (v or 0.0) for t, v in zip(totals, values, strict=True)]
        for r, v, total in zip(rollouts, verdicts, totals, strict=True):
            r.correct = v.correct
            r.reward = total
            r.verifier_note = ("truncated; " if r.truncated else "") + v.note
            if v.status is Status.ERROR:
                metrics[f"reward/errors/{self.kind}/{v.error}"] += 1
        n = len(rollouts)
        metrics[f"reward/{self.kind}/mean"] = sum(v.correct for v in verdicts) / n
        metrics["reward/timeouts"] = float(sum(v.status is Status.TIMEOUT for v in verdicts))
        metrics["reward/parse_error_rate"] = sum(v.parse_error for v in verdicts) / n
        for key, value in metrics.items():
            if key.startswith("reward/errors/"):
                self.errors[key] += int(value)
        return dict(metrics)

    def _call(self, fn: RewardFn, name: str, rollouts: list[Rollout], kwargs: dict[str, list[Any]],
              metrics: dict[str, float]) -> list[float | None] | None:
        """The function's values, or None after counting why they cannot be used."""
        try:
            return _check_values(fn([r.text for r in rollouts], **kwargs), len(rollouts))
        except _BadReturn as e:
            kind, detail = e.kind, str(e)
        except Exception as e:  # noqa: BLE001 -- user code: counted by type, never stops the run
            kind, detail = type(e).__name__, str(e)
        metrics[f"reward/errors/{name}/{kind}"] += 1
        self.last_error[name] = f"{kind}: {detail}"
        return None

    def close(self) -> None:
        if self._own_verifier:
            self.verifier.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
