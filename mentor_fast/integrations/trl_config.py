"""The mentor's settings inside TRL's GRPOTrainer (`mentor_rollout_func(mentor=..., recovery=...)`):
our `mentor:` and `recovery:` sections, less what TRL's loss and loop cannot carry, each refused
with its reason."""

from __future__ import annotations

from typing import Any

from mentor_fast.config import MentorConfig, RecoveryConfig, load_config, to_dict
from mentor_fast.config.recovery import RerollSchedule


def _refuse_out_of_place(task: Any, schedule: Any, horizon: Any) -> None:
    """The settings whose meaning TRL's loop fixes, refused with this plug-in's reasons (before the
    loader's, which speak of our trainer's engines)."""
    checks = [
        (task in ("auto", "math"),
         f"mentor.task={task}: inside TRL the mentor writes math hints only (code hints read our sandbox)"),
        (schedule in (None, RerollSchedule.IN_STEP),
         (f"recovery.reroll.schedule={schedule}: inside TRL the re-rolls run within TRL's generation call, by the "
          "policy that failed, and TRL's update waits for them, which is the in_step schedule. The others overlap "
          "re-rolls with our trainer's update or next generate call, which TRL's loop has no place for: leave "
          "it unset (or in_step), or use mentor_fast.GRPOTrainer")),
        (not horizon,
         ("recovery.reroll.horizon cuts re-rolls riding in our trainer's next generate call; inside TRL each round "
          "is a TRL generation call of its own, which is not cut: leave it at 0")),
    ]
    for ok, message in checks:
        if not ok:
            raise ValueError(message)


def _changed(values: dict[str, Any], default: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for k, v in values.items():
        if isinstance(v, dict):
            v = _changed(v, default[k])
        if v != default[k] and v != {}:
            out[k] = v
    return out


def _as_values(section: Any, cls: type) -> dict[str, Any]:
    """A section's overrides as a YAML file holds them; a dataclass's defaults count as unset."""
    if isinstance(section, cls):
        return _changed(to_dict(section), to_dict(cls()))
    return dict(section or {})


def mentor_configs(mentor: MentorConfig | dict[str, Any] | None = None,
                   recovery: RecoveryConfig | dict[str, Any] | None = None) -> tuple[MentorConfig, RecoveryConfig]:
    """The `mentor:` and `recovery:` sections of our run config (dataclasses, or mappings of overrides
    as a YAML file holds them; `enable` implied; the mentor's mapping may hold `trigger` and `reroll`,
    read as recovery's), refused where TRL's loss or trainer cannot carry them. The re-roll schedule
    is in_step, what happens inside TRL (unset, or in_step)."""
    values, budget = _as_values(mentor, MentorConfig), _as_values(recovery, RecoveryConfig)
    _refuse_out_of_place(values.get("task", "auto"), None, 0)
    for section in (values, budget):
        if isinstance(section.get("reroll"), dict):  # another type: the loader names it below
            reroll = {k: v for k, v in section["reroll"].items() if k != "schedule"}
            _refuse_out_of_place("auto", section["reroll"].get("schedule"), reroll.get("horizon", 0))
            section["reroll"] = reroll
    run = load_config(values={"mentor": {**values, "enable": True}, "recovery": budget})
    run.recovery.reroll.schedule = RerollSchedule.IN_STEP
    cfg = run.mentor
    checks = [
        (cfg.loss.mode == "replace",
         (f"mentor.loss.mode={cfg.loss.mode} weighs tokens in the loss, which TRL's loss does not read: "
          "use replace (the default) inside TRL, or mentor_fast.GRPOTrainer")),
        (cfg.loss.distill_coef == 0,
         ("mentor.loss.distill_coef adds a loss term, which TRL's loss does not compute: leave it at 0 "
          "inside TRL, or use mentor_fast.GRPOTrainer")),
        (cfg.agents.backend != "self",
         ("mentor.agents.backend=self writes hints through our rollout engine: inside TRL use "
          "worked_solutions, local or openai")),
    ]
    for ok, message in checks:
        if not ok:
            raise ValueError(message)
    return cfg, run.recovery
