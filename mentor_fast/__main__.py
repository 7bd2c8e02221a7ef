"""`python -m mentor_fast train ...`, and what torchrun runs: `torchrun --nproc-per-node N -m mentor_fast train ...`."""

import sys

from mentor_fast.cli import main

sys.exit(main())
