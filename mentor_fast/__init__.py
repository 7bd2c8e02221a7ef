"""mentor_fast: a single-node GRPO trainer with fused kernels and MENTOR interventions.

`from mentor_fast import GRPOConfig, GRPOTrainer` is the Python API in TRL's shape (imported on
first use: `import mentor_fast` stays light)."""

__version__ = "0.1.0"
__all__ = ["GRPOConfig", "GRPOTrainer", "TrainResult"]


def __getattr__(name: str):
    if name in __all__:
        import mentor_fast.api

        return getattr(mentor_fast.api, name)
    raise AttributeError(f"module 'mentor_fast' has no attribute {name!r}")
