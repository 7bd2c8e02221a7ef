"""Loading a RunConfig: defaults <- YAML files in order <- `a.b=c` overrides, then cross-field checks.

Unknown keys and wrong types fail before anything runs, naming the key and the closest valid one.
"""

from __future__ import annotations

import dataclasses
import difflib
import enum
import re
import types
import typing
from pathlib import Path
from typing import Any, Literal

import yaml

from mentor_fast.config.baselines import MethodKind
from mentor_fast.config.recovery import RerollSchedule
from mentor_fast.config.schema import GROUPS_PER_STEP, ConfigError, RunConfig
from mentor_fast.kernels.settings import field_range, range_error
from mentor_fast.tasks import TASKS, TaskKind, task_reading

# recovery.reroll.schedule values whose first round rides in the next step's generate call
_RIDING = (RerollSchedule.NEXT_STEP_EXTRA_ROWS, RerollSchedule.NEXT_STEP_SHARED_ROWS)
# Keys of earlier versions (CHANGELOG.md): a config that still uses one gets told the new name.
RENAMED = {
    "loss.ratio_level": "loss.type (ratio_level=sequence is loss.type=gspo)",
    **{f"mentor.{old}": f"recovery.trigger.{old}" for old in (
        "max_groups_frac", "surge_groups_frac", "surge_steps", "collapse_delta", "collapse_abs",
        "collapse_patience", "ema", "exempt_steps", "start_level")},
    **{f"mentor.{old}": f"mentor.agents.{old}" for old in (
        "backend", "timeout_s", "fused_call", "temperature", "max_tokens", "hint_max_tokens", "attempts",
        "attempt_chars", "model_path", "base_url", "model", "api_key_env", "retries", "concurrency")},
    "mentor.rerolls": "recovery.reroll.count",
    "mentor.max_rounds": "recovery.reroll.max_rounds",
    "mentor.max_staleness": "recovery.reroll.max_staleness",
    "mentor.reroll_horizon": "recovery.reroll.horizon",
    **dict.fromkeys(("mentor.async", "mentor.reroll.when", "mentor.reroll.budget", "mentor.reroll_budget"), (
        "recovery.reroll.schedule (async=false is in_step; async=true is next_step_extra_rows, with "
        "budget=shared next_step_shared_rows, with when=during_update during_update)")),
    "mentor.loss_mode": "mentor.loss.mode",
    **{f"mentor.{old}": f"mentor.loss.{old}" for old in (
        "max_replace", "transfer_is_cap", "shaping_gamma", "distill_coef")},
}
_VALUE_HINTS = {
    "mentor.agents.backend": "; reference was renamed worked_solutions (CHANGELOG.md)",
    "loss.type": ("; TRL's loss types grpo, dapo, bnpo and dr_grpo are loss.type=clip with loss.aggregation="
                  "seq_mean_token_mean, token_mean, token_mean_micro and constant"),
}
# Keys and sections that moved, read at their new place: a config may spell either, not both for one key.
ALIASES = {
    "mentor.trigger": "recovery.trigger",
    "mentor.reroll": "recovery.reroll",
    "reward.kind": "task",
    "mentor.task": "task",
}
REMOVED = {
    "mentor.merge_rerolls": "the first async re-roll round always rides in the next step's generate call",
    "rollout.hf_gqa_attention": "the HF engine always hands grouped K/V to SDPA on the CPU",
}


def _coerce(value: Any, tp: Any, key: str) -> Any:
    """Check (and for CLI strings, convert) `value` against the annotation `tp`, and against the
    field's declared Range (`Annotated[float, Range(...)]`; list items one by one)."""
    tp, rng = field_range(tp)
    value = _coerce_type(value, tp, key)
    if rng is not None:
        for i, v in enumerate(value if isinstance(value, list) else [value]):
            if v is not None and not rng.accepts(v):
                raise ConfigError(range_error(f"{key}[{i}]" if isinstance(value, list) else key, v, rng))
    return value


def _coerce_type(value: Any, tp: Any, key: str) -> Any:
    origin = typing.get_origin(tp)
    if isinstance(tp, type) and issubclass(tp, enum.Enum):  # the objective's names (kernels/enums.py)
        choices = [e.value for e in tp]
        if value not in choices:
            raise ConfigError(f"{key}: {value!r} is not one of {choices}{_VALUE_HINTS.get(key, '')}")
        return tp(value)
    if origin is Literal:
        choices = typing.get_args(tp)
        if value not in choices:
            raise ConfigError(f"{key}: {value!r} is not one of {list(choices)}")
        return value
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(value, arg, key)
            except ConfigError as e:
                errors.append(str(e))
        raise ConfigError("; ".join(errors))
    if origin is list:
        (item_tp,) = typing.get_args(tp)
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{key}: expected a list, got {value!r}")
        return [_coerce(v, item_tp, f"{key}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{key}: expected a mapping, got {value!r}")
        return dict(value)
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{key}: expected true/false, got {value!r}")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise ConfigError(f"{key}: expected an integer, got {value!r}")
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):  # YAML 1.1 reads "1e-6" (no dot) as a string
            try:
                return float(value)
            except ValueError:
                pass
        raise ConfigError(f"{key}: expected a number, got {value!r}")
    if tp is str:
        if isinstance(value, str):
            return value
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return str(value)
        raise ConfigError(f"{key}: expected a string, got {value!r}")
    raise ConfigError(f"{key}: unsupported field type {tp!r}")


def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls, include_extras=True)


def _unknown(key: str, valid: list[str], where: str) -> ConfigError:
    if key in RENAMED:
        return ConfigError(f"config key '{key}' was renamed: use {RENAMED[key]} (CHANGELOG.md)")
    if key in REMOVED:
        return ConfigError(f"config key '{key}' was removed: {REMOVED[key]} (CHANGELOG.md)")
    close = difflib.get_close_matches(key.split(".")[-1], valid, n=1)
    prefix = where + "." if where else ""
    hint = f"; did you mean '{prefix}{close[0]}'?" if close else f"; valid keys: {', '.join(sorted(valid))}"
    return ConfigError(f"unknown config key '{key}'{hint}")


def _section(root: Any, dotted: str) -> Any:
    for name in dotted.split("."):
        root = getattr(root, name)
    return root


def _leaves(data: Any, where: str) -> list[str]:
    if not isinstance(data, dict):
        return [where]
    return [leaf for k, v in data.items() for leaf in _leaves(v, f"{where}.{k}" if where else str(k))]


def _check_aliases(keys: list[str]) -> None:
    """One source (a file, the Python API's values, the overrides) may set a key by its old name
    or its new one, not both."""
    by_new: dict[str, str] = {}
    for key in keys:
        new = key
        for old, target in ALIASES.items():
            if key == old or key.startswith(old + "."):
                new = target + key[len(old):]
        for other_new, other in by_new.items():
            same = new == other_new or new.startswith(other_new + ".") or other_new.startswith(new + ".")
            if same and (other == other_new) != (key == new):  # one spelled the old way, one the new
                old_key, new_key = (key, other) if key != new else (other, key)
                raise ConfigError(f"'{old_key}' is read as '{new_key}', which is set too: set one")
        by_new.setdefault(new, key)


def _apply(obj: Any, overrides: dict[str, Any], where: str = "", root: Any = None) -> None:
    root = obj if root is None else root
    hints = _hints(type(obj))
    names = [f.name for f in dataclasses.fields(obj)]
    for key, value in overrides.items():
        full = f"{where}.{key}" if where else str(key)
        if full in ALIASES:
            _apply_alias(root, full, value)
            continue
        if key not in names:
            raise _unknown(full, names, where)
        name = key
        current = getattr(obj, name)
        if dataclasses.is_dataclass(current):
            if not isinstance(value, dict):
                raise ConfigError(f"{full}: expected a mapping of sub-keys, got {value!r}")
            _apply(current, value, full, root)
        else:
            setattr(obj, name, _coerce(value, hints[name], full))


def _apply_alias(root: Any, old: str, value: Any) -> None:
    """Set the key or section `old` names at its new place."""
    parent, _, name = ALIASES[old].rpartition(".")
    section = _section(root, parent) if parent else root
    if dataclasses.is_dataclass(getattr(section, name)):
        if not isinstance(value, dict):
            raise ConfigError(f"{old}: expected a mapping of sub-keys, got {value!r}")
        _apply(getattr(section, name), value, old, root)
    else:
        setattr(section, name, _coerce(value, _hints(type(section))[name], old))


def _parse_cli_value(text: str) -> Any:
    """`a.b=c` values are YAML scalars/flow collections: 1e-6, true, [1, 2], null, text."""
    try:
        return yaml.safe_load(text) if text != "" else ""
    except yaml.YAMLError:
        return text


def nest(dotted: str, value: Any, out: dict[str, Any] | None = None) -> dict[str, Any]:
    """{'a.b': v} as {'a': {'b': v}}, merged into `out` when given."""
    out = {} if out is None else out
    cur = out
    parts = dotted.split(".")
    for p in parts[:-1]:
        cur = cur.setdefault(p, {})
    cur[parts[-1]] = value
    return out


def load_config(files: list[str | Path] = (), overrides: list[str] = (),
                values: dict[str, Any] | None = None) -> RunConfig:
    """Defaults <- each YAML file in order <- `values` (a nested mapping, as a YAML file holds;
    what the Python API's GRPOConfig builds) <- `key.sub=value` overrides."""
    cfg = RunConfig()
    for f in files:
        path = Path(f)
        if not path.is_file():
            raise ConfigError(f"config file not found: {path}")
        try:
            data = yaml.safe_load(path.read_text()) or {}
        except yaml.YAMLError as e:
            raise ConfigError(f"{path}: not valid YAML: {e}") from None
        if not isinstance(data, dict):
            raise ConfigError(f"{path}: top level must be a mapping of keys")
        try:
            _check_aliases(_leaves(data, ""))
            _apply(cfg, data)
        except ConfigError as e:
            raise ConfigError(f"{path}: {e}") from None
    if values:
        _check_aliases(_leaves(values, ""))
        _apply(cfg, values)
    pairs = []
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override '{item}' is not of the form key.sub=value")
        key, text = item.split("=", 1)
        pairs.append((key.strip(), _parse_cli_value(text)))
    _check_aliases([key for key, _ in pairs])
    for key, value in pairs:
        _apply(cfg, nest(key, value))
    resolve(cfg)
    validate(cfg)
    return cfg


def resolve(cfg: RunConfig) -> None:
    """Fill the keys whose default follows another key: the task follows the data, the system
    prompt the task."""
    if cfg.task == "auto":
        cfg.task = task_reading(cfg.data).kind
    if cfg.data.system_prompt is None:
        cfg.data.system_prompt = TASKS[TaskKind(cfg.task)].system_prompt
    if cfg.method == MethodKind.AUTO:
        cfg.method = MethodKind.MENTOR if cfg.mentor.enable else MethodKind.GRPO
    elif cfg.mentor.enable and cfg.method != MethodKind.MENTOR:
        raise ConfigError(f"mentor.enable=true and method={cfg.method}: mentor.enable is method=mentor; set one")
    cfg.mentor.enable = cfg.method == MethodKind.MENTOR


def validate(cfg: RunConfig) -> None:
    """Cross-field checks that a type alone cannot express."""
    m, r, task = cfg.mentor, cfg.recovery, TASKS[TaskKind(cfg.task)]
    try:
        cfg.loss.check()
    except ValueError as e:
        raise ConfigError(f"loss.{e}") from None
    checks = [
        (cfg.loss.beta == 0 or cfg.model.ref_model, "loss.beta > 0 needs model.ref_model=true"),
        (r.reroll.horizon == 0 or (r.reroll.schedule in _RIDING and cfg.rollout.engine == "hf"
                                   and m.loss.mode != "group"),
         ("recovery.reroll.horizon cuts the re-rolls riding in the next step's generate call: it needs "
          "recovery.reroll.schedule=next_step_extra_rows or next_step_shared_rows, rollout.engine=hf (vLLM "
          "cannot cut rows mid-call) and a mentor.loss.mode other than group (a cut re-roll leaves the "
          "group short)")),
        (r.reroll.schedule != RerollSchedule.DURING_UPDATE
         or (cfg.rollout.engine == "vllm" and cfg.rollout.vllm_sleep_level == 0),
         ("recovery.reroll.schedule=during_update needs rollout.engine=vllm (the HF engine decodes with the "
          "module the update trains) and rollout.vllm_sleep_level=0 (a sleeping engine cannot generate)")),
        (not m.enable or m.agents.backend != "openai" or bool(m.agents.model and m.agents.base_url),
         "mentor.agents.backend=openai needs mentor.agents.model (the served model's name) and mentor.agents.base_url"),
        (not m.enable or m.agents.backend != "local" or bool(m.agents.model_path),
         "mentor.agents.backend=local needs mentor.agents.model_path (a local HF folder or a built-in model name)"),
        (not cfg.reward.weights or len(cfg.reward.weights) == 1 + len(cfg.reward.functions),
         "reward.weights needs one weight for the built-in reward plus one per reward.functions entry"),
        (cfg.data.source not in ("jsonl", "file") or cfg.data.path,
         f"data.path is required for data.source={cfg.data.source}"),
        (cfg.data.source not in ("file", "dataset") or cfg.data.format != "code",
         "data.format=code reads JSONL files: data.source=jsonl"),
        (cfg.reward.overlong_cache <= cfg.rollout.max_new_tokens,
         (f"reward.overlong_cache ({cfg.reward.overlong_cache}) must be at most rollout.max_new_tokens "
          f"({cfg.rollout.max_new_tokens}): the penalty ramps over the last overlong_cache tokens")),
        (not cfg.rollout.dynamic_sampling
         or (cfg.rollout.dynamic_sampling_rounds + 1) * cfg.rollout.prompts_per_step <= GROUPS_PER_STEP,
         (f"rollout.dynamic_sampling draws up to (dynamic_sampling_rounds + 1) * prompts_per_step prompts "
          f"a step, at most {GROUPS_PER_STEP}")),
        (task.reads(cfg.data),
         (f"task={cfg.task} needs {task.data_help} (got data.source={cfg.data.source}, "
          f"format {cfg.data.format}); leave task at auto to follow the data")),
        (cfg.model.lora.rank == 0 or cfg.rollout.vllm_sleep_level != 2,
         ("rollout.vllm_sleep_level=2 drops vLLM's base weights, which a LoRA sync does not resend; "
          "use rollout.vllm_sleep_level=1 with model.lora")),
        (re.fullmatch(r"auto|cpu|cuda(:\d+)?", cfg.model.device) is not None,
         f"model.device: {cfg.model.device!r} is not one of auto, cpu, cuda, cuda:N"),
    ]
    for ok, msg in checks:
        if not ok:
            raise ConfigError(msg)


def to_dict(cfg: Any) -> dict[str, Any]:
    out = {}
    for f in dataclasses.fields(cfg):
        v = getattr(cfg, f.name)
        if isinstance(v, enum.Enum):
            v = v.value
        out[f.name] = to_dict(v) if dataclasses.is_dataclass(v) else v
    return out


def save_config(cfg: RunConfig, path: str | Path) -> None:
    Path(path).write_text(yaml.safe_dump(to_dict(cfg), sort_keys=False))
