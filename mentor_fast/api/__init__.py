"""The Python API in TRL's shape: `from mentor_fast import GRPOConfig, GRPOTrainer` (docs/python_api.md)."""

from mentor_fast.api.config import GRPOConfig
from mentor_fast.api.trainer import GRPOTrainer, TrainResult

__all__ = ["GRPOConfig", "GRPOTrainer", "TrainResult"]
