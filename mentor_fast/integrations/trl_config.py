"""The mentor's settings inside TRL's GRPOTrainer (`mentor_rollout_func(mentor=...)`): our
`mentor:` section, less what TRL's loss and loop cannot carry, each refused with its reason."""

from __future__ import annotations

import dataclasses
from typing import Any

from mentor_fast.config import MentorConfig, load_config
from mentor_fast.config.mentor import RerollSchedule


def _refuse_out_of_place(task: Any, schedule: Any, horizon: Any) -> None:
    """The settings whose meaning TRL's loop fixes, refused with this plug-in's reasons (before the
    loader's, which speak of our trainer's engines)."""
    checks = [
        (task in ("auto", "math"),
         f"mentor.task={task}: inside TRL the mentor writes math hints only (code hints read our sandbox)"),
        (schedule in (None, RerollSchedule.IN_STEP),
         (f"mentor.reroll.schedule={schedule}: inside TRL the re-rolls run within TRL's generation call, by the "
          "policy that failed, and TRL's update waits for them, which is the in_step schedule. The others overlap "
          "re-rolls with our trainer's update or next generate call, which TRL's loop has no place for: leave "
          "it unset (or in_step), or use mentor_fast.GRPOTrainer")),
        (not horizon,
         ("mentor.reroll.horizon cuts re-rolls riding in our trainer's next generate call; inside TRL each round "
          "is a TRL generation call of its own, which is not cut: leave it at 0")),
    ]
    for ok, message in checks:
        if not ok:
            raise ValueError(message)


def mentor_config(mentor: MentorConfig | dict[str, Any] | None = None) -> MentorConfig:
    """The `mentor:` section of our run config (a MentorConfig, or a mapping of overrides as a YAML
    file holds them; `enable` implied), refused where TRL's loss or trainer cannot carry it. The
    re-roll schedule is in_step, what happens inside TRL (a MentorConfig's default schedule is taken
    for unset)."""
    if isinstance(mentor, MentorConfig):
        schedule = None if mentor.reroll.schedule == RerollSchedule.NEXT_STEP_EXTRA_ROWS else mentor.reroll.schedule
        _refuse_out_of_place(mentor.task, schedule, mentor.reroll.horizon)
        reroll = dataclasses.replace(mentor.reroll, schedule=RerollSchedule.IN_STEP)
        cfg = dataclasses.replace(mentor, enable=True, task="math", reroll=reroll)
    else:
        values = dict(mentor or {})
        reroll = values.get("reroll")
        reroll = dict(reroll) if isinstance(reroll, dict) else {}  # another type: the loader names it below
        _refuse_out_of_place(values.get("task", "auto"), reroll.get("schedule"), reroll.get("horizon", 0))
        if isinstance(values.get("reroll", {}), dict):
            values["reroll"] = {**reroll, "schedule": RerollSchedule.IN_STEP.value}
        cfg = load_config(values={"mentor": {**values, "enable": True}}).mentor
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
    return cfg
