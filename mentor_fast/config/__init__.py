"""One tree of dataclasses for a run (`schema`); YAML files set overrides and `a.b=c` arguments
come last (`loader`). Unknown keys and wrong types fail before anything runs."""

from mentor_fast.config.loader import load_config, resolve, save_config, to_dict, validate
from mentor_fast.config.schema import (
    AdvantageConfig,
    AgentsConfig,
    CodeRewardConfig,
    ConfigError,
    DataConfig,
    DistConfig,
    LossConfig,
    MentorConfig,
    MentorLossConfig,
    ModelConfig,
    OptimConfig,
    RecoveryConfig,
    RerollConfig,
    RewardConfig,
    RolloutConfig,
    RunConfig,
    TrainerConfig,
    TriggerConfig,
)

__all__ = [
    "AdvantageConfig", "AgentsConfig", "CodeRewardConfig", "ConfigError", "DataConfig", "DistConfig", "LossConfig", "MentorConfig",
    "MentorLossConfig", "ModelConfig", "OptimConfig", "RecoveryConfig", "RerollConfig", "RewardConfig", "RolloutConfig", "RunConfig",
    "TrainerConfig", "TriggerConfig", "load_config", "resolve", "save_config", "to_dict",
    "validate",
]
