"""One tree of dataclasses for a run (`schema`); YAML files set overrides and `a.b=c` arguments
come last (`loader`). Unknown keys and wrong types fail before anything runs."""

from mentor_fast.config.loader import load_config, save_config, to_dict, validate
from mentor_fast.config.schema import (
    AdvantageConfig,
    ConfigError,
    DataConfig,
    LossConfig,
    MentorConfig,
    ModelConfig,
    OptimConfig,
    RewardConfig,
    RolloutConfig,
    RunConfig,
    TrainerConfig,
)

__all__ = [
    "AdvantageConfig", "ConfigError", "DataConfig", "LossConfig", "MentorConfig", "ModelConfig", "OptimConfig",
    "RewardConfig", "RolloutConfig", "RunConfig", "TrainerConfig", "load_config", "save_config", "to_dict",
    "validate",
]
