"""The guard's word cap per hint level (recovery/levels.py); the instructor is asked for half."""

MAX_WORDS = {1: 80, 2: 140, 3: 200}
