"""mentor_fast: a single-node GRPO trainer with fused kernels and MENTOR interventions."""

__version__ = "0.1.0"
