"""Hint levels: 1 a conceptual pointer, 2 a plan, 3 the first step worked out (never the answer)."""

MIN_LEVEL, MAX_LEVEL = 1, 3
