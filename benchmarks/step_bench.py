#!/usr/bin/env python
"""End-to-end step benchmark on the CPU (same as `mentor-fast bench`).

    .venv/bin/python benchmarks/step_bench.py --variants reference_fp32,fused_fp32 --steps 6 --repeats 2
"""

import sys

from mentor_fast.bench import main

if __name__ == "__main__":
    sys.exit(main())
