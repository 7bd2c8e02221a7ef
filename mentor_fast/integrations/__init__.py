"""MENTOR as a plug-in to other trainers. `mentor_fast.integrations.trl`: TRL's own GRPOTrainer
(`rollout_func=mentor_rollout_func()`). Nothing here is imported by `mentor_fast` itself, and each
module imports its trainer only when used."""
