"""Who writes the diagnoses and hints, LLM and deterministic, side by side: the agents' protocols
(base.py); the LLM diagnoser and instructor (llm.py) with their prompts (prompts.py) and reply
parsing (replies.py) over a text backend (local.py: the policy or a second local model; openai.py:
an OpenAI-compatible endpoint); and the deterministic writer (solutions.py), which each task
folder implements (mentor_fast/tasks/<task>/steps.py). mentor/backends.py builds the one the
config names."""
