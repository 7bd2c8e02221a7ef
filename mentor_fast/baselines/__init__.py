"""The methods MENTOR is compared with, behind the trainer's method interface (mentor_fast/method.py):
Scaf-GRPO's static tiered hints (`method=scaf`, scaf.py) and LUFFY's off-policy guidance
(`method=luffy`, luffy.py). Dynamic sampling is `rollout.dynamic_sampling`, for any method.
Each spends the budget MENTOR spends (recovery.trigger, recovery.reroll), so the comparison can be made at
equal generation (experiments/collapse.py, docs/experiments/baselines.md)."""
