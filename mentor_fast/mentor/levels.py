"""Hint levels: 1 a conceptual pointer, 2 a plan, 3 the first step worked out (never the answer)."""

MIN_LEVEL, MAX_LEVEL = 1, 3
MAX_WORDS = {1: 80, 2: 140, 3: 200}  # the guard's cap per level; the instructor is asked for half
