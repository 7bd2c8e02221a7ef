"""torch's deterministic algorithms for a run (trainer.deterministic; docs/experiments/reproducibility.md).

Gradients that several rows add into the same place go through `index_put_(accumulate=True)`: the
backward of a gather whose indices repeat (the shared-prompt forward hands one prompt's last hidden
row and its keys/values to each of its completions) and the fused LM head's dW rows of the target
tokens. torch's default CPU kernel for it adds with atomics, so the order of the additions, and the
last bits of the sum, change from call to call; GRPO turns that into another run within a few steps.
Under `torch.use_deterministic_algorithms` it sorts the indices and adds in order instead: the same
bits every time, at about the same cost on the CPU (benchmarks/determinism_cost.py; the docs page has the figures).

`warn_only`: an op without a deterministic version warns instead of stopping the run. torch's filling
of uninitialised memory, which the deterministic mode turns on, stays off: the fused head allocates
its dW with torch.empty and never reads it before writing, and filling it would cost a memset of the
head's size per call.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import torch


def wanted(setting: bool | str, device: torch.device) -> bool:
    """trainer.deterministic: auto is on for the CPU, where it costs about 1% of the update, off elsewhere."""
    return device.type == "cpu" if setting == "auto" else bool(setting)


@contextlib.contextmanager
def deterministic_algorithms(on: bool = True) -> Iterator[None]:
    """torch's deterministic algorithms while inside (nothing when `on` is False); the previous
    settings come back on exit, so a caller's own choice outlives the run."""
    if not on:
        yield
        return
    import torch.utils.deterministic as settings

    before = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled(),
              settings.fill_uninitialized_memory)
    if torch.cuda.is_available():  # cuBLAS's deterministic workspaces; read when its first handle is made
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True, warn_only=True)
    settings.fill_uninitialized_memory = False
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(before[0], warn_only=before[1])
        settings.fill_uninitialized_memory = before[2]
