"""The built-in verifier's protocol, TRL-style custom reward functions, and the scorer that fills in
Rollouts (each task builds its verifier: mentor_fast/tasks/<task>/).

reward = w_0 * c + sum_k w_k * f_k, with c in {0, 1} the built-in verifier's flag and f_k the custom
functions' values (None: "not applicable", contributes 0). `Rollout.correct` is c alone, never
the shaped reward: zero-reward groups are detected on it. A custom function that raises or returns
the wrong number of values contributes nothing for that batch and is counted by error type under
`reward/errors/<name>/<Type>`; the run goes on.

Custom functions are called as TRL's GRPOTrainer calls them for chat prompts (this trainer always
renders a chat template): `fn(prompts=..., completions=..., completion_ids=..., **columns)` with
completions as `[{"role": "assistant", "content": text}]` and prompts as the chat's messages, the
dataset's own columns under their own names, and the gold also under `solution` (TRL's
accuracy_reward), `answer` and `gold`. reward.functions_format=string passes plain texts instead.
A spec may call a factory with literal arguments:
"trl.rewards:get_soft_overlong_punishment(max_completion_len=128, soft_punish_cache=32)".
"""

from __future__ import annotations

import ast
import collections
import importlib
import logging
import math
from collections.abc import Callable
from typing import Any

from mentor_fast.compat import Self
from mentor_fast.config import RewardConfig
from mentor_fast.rewards.code import CodeVerifier
from mentor_fast.rewards.verdict import Status, Verifier
from mentor_fast.tasks import TASKS, TaskKind
from mentor_fast.types import Problem, Rollout

log = logging.getLogger(__name__)


RewardFn = Callable[..., list]
Messages = list[dict[str, str]]


def _literal_call(spec: str, text: str) -> tuple[str, list[Any], dict[str, Any]]:
    """"name(1, a=2)" -> ("name", [1], {"a": 2}); only literal arguments."""
    try:
        node = ast.parse(text, mode="eval").body
        is_call = isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
        if not is_call:
            raise SyntaxError("not a call of a name")
        args = [ast.literal_eval(a) for a in node.args]
        kwargs = {k.arg: ast.literal_eval(k.value) for k in node.keywords if k.arg}
    except (SyntaxError, ValueError) as e:
        raise ValueError(f"reward function {spec!r}: arguments must be Python literals, as in "
                         f"'module:factory(size=3, scale=0.5)' ({e})") from None
    return node.func.id, args, kwargs


def load_reward_function(spec: str) -> RewardFn:
    """Import "package.module:function", or call "package.module:factory(literal args)"; errors name
    the spec."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"reward function {spec!r} must look like 'package.module:function'")
    call = _literal_call(spec, attr) if "(" in attr else None
    name = call[0] if call else attr
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise ValueError(f"reward function {spec!r}: cannot import {module_name!r}: {e}") from e
    fn = getattr(module, name, None)
    if fn is None:
        raise ValueError(f"reward function {spec!r}: {module_name!r} has no callable {name!r}")
    if not callable(fn):
        raise TypeError(f"reward function {spec!r}: {name!r} is a {type(fn).__name__}, not a function")
    if call:
        try:
            fn = fn(*call[1], **call[2])
        except TypeError as e:
            raise ValueError(f"reward function {spec!r}: {e}") from None
        if not callable(fn):
            raise TypeError(f"reward function {spec!r}: {name}(...) returned a {type(fn).__name__}, not a function")
    return fn


def _names(specs: list[str]) -> list[str]:
    """Metric names: the function name, or the full spec where two functions share a name."""
    short = [s.partition(":")[2].partition("(")[0] for s in specs]
    counts = collections.Counter(short)
    return [n if counts[n] == 1 else s.partition("(")[0].replace(":", ".") for n, s in zip(short, specs, strict=True)]


def _behaviour_hint(r: Rollout) -> str | None:
    """The hint in the prompt the completion was sampled under (None for the bare question)."""
    return r.hint.text if r.origin == "mentor" and r.hint is not None else None


def _fn_kwargs(rollouts: list[Rollout], messages: Callable[[Problem, str | None], Messages] | None
               ) -> dict[str, list[Any]]:
    """The keyword arguments of TRL's GRPOTrainer: the dataset's columns under their own names, then
    ours (ours win on a clash). `messages` given: prompts as chat messages (conversational form),
    completions passed separately; otherwise prompts are the user texts."""
    columns: dict[str, list[Any]] = {}
    for key in dict.fromkeys(k for r in rollouts for k in r.problem.columns):
        columns[key] = [r.problem.columns.get(key) for r in rollouts]
    golds = [r.problem.gold for r in rollouts]
    if any(r.problem.code for r in rollouts):
        columns.update(tests=[r.problem.code and r.problem.code.tests for r in rollouts],
                       entry_point=[r.problem.code and r.problem.code.entry_point for r in rollouts])
    if messages is None:
        prompts: list[Any] = [r.problem.question for r in rollouts]
    else:
        prompts = [messages(r.problem, _behaviour_hint(r)) for r in rollouts]
    columns.update(
        prompts=prompts,
        gold=golds,
        answer=golds,
        solution=golds,
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


def overlong_penalty(length: int, max_len: int, cache: int) -> float:
    """DAPO's soft overlong punishment (its eq. 13): 0 up to max_len - cache tokens, then down
    linearly to -1 at max_len (a completion cut there), -1 beyond."""
    over = length - (max_len - cache)
    return 0.0 if over <= 0 else -min(1.0, over / cache)


class RewardScorer:
    """Scores rollouts in place: `reward`, `correct`, `verifier_note`; returns per-batch metrics."""

    def __init__(self, cfg: RewardConfig, verifier: Verifier | None = None,
                 messages: Callable[[Problem, str | None], Messages] | None = None, max_new_tokens: int = 0,
                 task: TaskKind | str = TaskKind.MATH):
        """verifier: share an already built checker (not closed by `close`); default: the task's.
        messages(problem, hint) -> the chat messages of its prompt (data.PromptBuilder.chat), for
        the conversational form; without it the functions get the string form. max_new_tokens: the
        completion limit the soft overlong penalty counts back from (reward.overlong_cache). task:
        the run's (mentor_fast/tasks/): its verifier is the default, its name the metrics'."""
        if cfg.overlong_cache and not 0 < cfg.overlong_cache <= max_new_tokens:
            raise ValueError(f"reward.overlong_cache={cfg.overlong_cache} needs 0 < overlong_cache <= "
                             f"rollout.max_new_tokens (got {max_new_tokens})")
        self.overlong = (max_new_tokens, cfg.overlong_cache) if cfg.overlong_cache else None
        n_parts = 1 + len(cfg.functions)
        if cfg.weights and len(cfg.weights) != n_parts:
            raise ValueError(
                f"reward.weights has {len(cfg.weights)} entries; need {n_parts} (built-in + one per function)"
            )
        self.weights = [float(w) for w in cfg.weights] or [1.0] * n_parts
        self.functions = [load_reward_function(s) for s in cfg.functions]
        self.names = _names(cfg.functions)
        self._own_verifier = verifier is None
        self.kind = TaskKind(task)  # names the built-in reward's metrics
        self.verifier = verifier if verifier is not None else TASKS[self.kind].verifier(cfg)
        self.errors: collections.Counter[str] = collections.Counter()  # cumulative, by metric key
        self.messages = messages if cfg.functions_format == "conversational" else None
        self.unisolated = isinstance(self.verifier, CodeVerifier) and cfg.code.sandbox == "none"
        self.last_error: dict[str, str] = {}  # function name -> last failure, for debugging

    def score(self, rollouts: list[Rollout]) -> dict[str, float]:
        if not rollouts:
            return {}
        if self.unisolated:  # every step, on purpose: it must not scroll out of sight
            log.warning("reward.code.sandbox=none: programs the model wrote run WITHOUT isolation "
                        "(plain subprocesses with rlimits); they can read and write what this user can")
        verdicts = self.verifier.check([r.text for r in rollouts], [r.problem for r in rollouts])
        metrics: dict[str, float] = collections.defaultdict(float)
        metrics.update(self.verifier.pop_metrics())
        totals = [self.weights[0] * float(v.correct) for v in verdicts]
        kwargs = _fn_kwargs(rollouts, self.messages) if self.functions else {}
        for fn, name, weight in zip(self.functions, self.names, self.weights[1:], strict=True):
            values = self._call(fn, name, rollouts, kwargs, metrics)
            if values is None:
                continue
            applicable = [v for v in values if v is not None]
            metrics[f"reward/{name}/mean"] = sum(applicable) / len(applicable) if applicable else 0.0
            metrics[f"reward/{name}/none_frac"] = 1.0 - len(applicable) / len(values)
            totals = [t + weight * (v or 0.0) for t, v in zip(totals, values, strict=True)]
        if self.overlong:
            penalties = [overlong_penalty(len(r.completion_ids), *self.overlong) for r in rollouts]
            metrics["reward/overlong_penalty/mean"] = sum(penalties) / len(penalties)
            totals = [t + p for t, p in zip(totals, penalties, strict=True)]
        for r, v, total in zip(rollouts, verdicts, totals, strict=True):
            r.correct = v.correct
            r.reward = total
            r.verifier_note = ("truncated; " if r.truncated else "") + v.note
            r.verifier_detail = v.detail
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
        texts = [r.text for r in rollouts]
        completions = texts if self.messages is None else [[{"role": "assistant", "content": t}] for t in texts]
        try:
            return _check_values(fn(completions=completions, **kwargs), len(rollouts))
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
