"""Config values outside their range stop the run before anything loads, with one line that names
the key, the value and the range; every numeric field declares its range (or says it has none)."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import typing

import pytest
from conftest import REPO
from mentor_fast.kernels.settings import check_ranges, field_range

from mentor_fast.config import ConfigError, RunConfig, load_config

TINY = "configs/tiny_test.yaml"
# Numeric fields that take any value: a negative entropy bonus is an entropy penalty, and a negative
# reward weight turns a reward function into a penalty.
ANY_VALUE = {"loss.entropy_coef", "reward.weights"}


def _numeric_fields(cls=RunConfig, prefix=""):
    hints = typing.get_type_hints(cls, include_extras=True)
    for f in dataclasses.fields(cls):
        tp, rng = field_range(hints[f.name])
        key = prefix + f.name.rstrip("_")
        if dataclasses.is_dataclass(tp):
            yield from _numeric_fields(tp, key + ".")
        elif tp in (int, float) or typing.get_args(tp) in ((int,), (float,)):
            yield key, rng


def test_every_numeric_field_declares_its_range_and_the_defaults_are_inside():
    unchecked = sorted(key for key, rng in _numeric_fields() if rng is None and key not in ANY_VALUE)
    assert not unchecked, f"numeric fields without a Range: {unchecked}"
    check_ranges(RunConfig())


@pytest.mark.parametrize("override,says", [
    ("optim.lr=-1", "optim.lr: -1.0 is out of range: it must be >= 0"),
    ("loss.eps_low=2", "loss.eps_low: 2.0 is out of range: it must be in [0, 1)"),
    ("optim.betas=[0.9,1.0]", "optim.betas[1]: 1.0 is out of range: it must be in [0, 1)"),
    ("loss.dual_clip=0.5", "loss.dual_clip: 0.5 is out of range: it must be 0 or > 1"),
    ("rollout.num_generations=1", "rollout.num_generations: 1 is out of range: it must be >= 2"),
    ("mentor.trigger.start_level=4", "mentor.trigger.start_level: 4 is out of range: it must be in [1, 3]"),
])
def test_a_value_out_of_range_names_key_value_and_range(override, says):
    with pytest.raises(ConfigError) as e:
        load_config([TINY], [override])
    assert str(e.value) == says


def test_a_yaml_file_with_a_value_out_of_range_names_the_file_too(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("loss:\n  eps_high: -0.1\n")
    with pytest.raises(ConfigError, match=r"bad.yaml: loss.eps_high: -0.1 is out of range: it must be >= 0"):
        load_config([bad])


def test_an_llm_mentor_without_its_model_is_refused_at_load():
    with pytest.raises(ConfigError, match="mentor.agents.backend=openai needs mentor.agents.model"):
        load_config([TINY], ["mentor.enable=true", "mentor.agents.backend=openai"])
    with pytest.raises(ConfigError, match="mentor.agents.backend=local needs mentor.agents.model_path"):
        load_config([TINY], ["mentor.enable=true", "mentor.agents.backend=local"])
    cfg = load_config([TINY], ["mentor.enable=true", "mentor.agents.backend=openai", "mentor.agents.model=m"])
    assert cfg.mentor.agents.model == "m"


def test_the_cli_prints_one_line_and_no_traceback():
    # the CLI reports every ConfigError the same way (load_config's errors are tested above)
    proc = subprocess.run([sys.executable, "-m", "mentor_fast", "train", "--config", TINY, "optim.lr=-1"],
                          cwd=REPO, capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert lines == ["error: optim.lr: -1.0 is out of range: it must be >= 0"], proc.stderr


# ------------------------------------------------------------------ sections read at a new place
BUDGET = {"trigger": {"max_groups_frac": 1.0, "start_level": 2}, "reroll": {"count": 2, "schedule": "in_step"}}


def test_the_budget_under_its_old_name_gives_the_same_config(tmp_path):
    """mentor.trigger / mentor.reroll (earlier configs) are read as recovery.trigger / recovery.reroll,
    in a YAML file, the Python API's values and `a.b=c` overrides alike."""
    new = load_config([], values={"recovery": BUDGET})
    assert (new.recovery.trigger.max_groups_frac, new.recovery.trigger.start_level) == (1.0, 2)
    assert (new.recovery.reroll.count, new.recovery.reroll.schedule) == (2, "in_step")
    assert new != RunConfig() and load_config([], values={"mentor": BUDGET}) == new
    old_file, new_file = tmp_path / "old.yaml", tmp_path / "new.yaml"
    old_file.write_text("mentor:\n  trigger: {max_groups_frac: 1.0, start_level: 2}\n"
                        "  reroll: {count: 2, schedule: in_step}\n")
    new_file.write_text(old_file.read_text().replace("mentor:", "recovery:"))
    assert load_config([old_file]) == load_config([new_file]) == new
    flat = ["trigger.max_groups_frac=1.0", "trigger.start_level=2", "reroll.count=2", "reroll.schedule=in_step"]
    assert load_config([], [f"mentor.{o}" for o in flat]) == load_config([], [f"recovery.{o}" for o in flat]) == new
    # a later source may set by the new name what an earlier one set by the old: the later wins
    assert load_config([old_file], ["recovery.reroll.count=3"]).recovery.reroll.count == 3
    # errors name the key as written
    with pytest.raises(ConfigError, match="unknown config key 'mentor.reroll.cuont'; did you mean 'mentor.reroll.count'"):
        load_config([], ["mentor.reroll.cuont=2"])
    with pytest.raises(ConfigError, match="mentor.trigger.start_level: 4 is out of range"):
        load_config([], ["mentor.trigger.start_level=4"])


def test_one_key_by_both_names_in_one_source_is_an_error_naming_both(tmp_path):
    both = "'mentor.reroll.count' is read as 'recovery.reroll.count', which is set too: set one"
    with pytest.raises(ConfigError, match=both):
        load_config([], ["mentor.reroll.count=2", "recovery.reroll.count=2"])
    with pytest.raises(ConfigError, match=both):
        load_config([], values={"mentor": {"reroll": {"count": 2}}, "recovery": {"reroll": {"count": 3}}})
    f = tmp_path / "both.yaml"
    f.write_text("mentor:\n  trigger: {ema: 0.5}\nrecovery:\n  trigger: {ema: 0.5}\n")
    with pytest.raises(ConfigError, match=f"{f}: 'mentor.trigger.ema' is read as 'recovery.trigger.ema'"):
        load_config([f])
    with pytest.raises(ConfigError, match="'mentor.trigger' is read as 'recovery.trigger.ema'"):
        load_config([], ["recovery.trigger.ema=0.5", "mentor.trigger={ema: 0.5}"])
    # different keys of one section by the two names are fine
    assert load_config([], values={"recovery": {}, "mentor": {"reroll": {"count": 2}}}).recovery.reroll.count == 2
    cfg = load_config([], ["mentor.reroll.count=2", "recovery.reroll.max_rounds=3"])
    assert (cfg.recovery.reroll.count, cfg.recovery.reroll.max_rounds) == (2, 3)
