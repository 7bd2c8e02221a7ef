"""Ranks and collectives: one process per device, launched by torchrun (or `mentor-fast train --nproc N`).

`Dist` is what the trainer, the update and the mentor see of the other ranks. With one process
(no torchrun, or `--nproc-per-node 1`) there is no process group and every collective is the
identity, so the one-device path runs exactly the code it always ran.

- Backend: NCCL on CUDA, gloo on the CPU (one intra-op thread per rank there).
- Timeouts: every collective fails after `dist.timeout_s` (the process group's timeout), so a rank
  that hangs or dies turns into an error on the others, never a hang. torchrun then stops the
  remaining workers and names the failed rank; each rank reports the step it was at (`RankFailure`).
- Collectives are called from the trainer's thread only, in the same order on every rank (the
  mentor's background thread never calls one).
"""

from __future__ import annotations

import datetime
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch


class RankFailure(RuntimeError):
    """A rank stopped the run; the message names the rank and the step."""


@dataclass
class Dist:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    timeout_s: float = 600.0
    _gloo: Any = field(default=None, repr=False)

    @property
    def enabled(self) -> bool:
        """True when there are other ranks (a process group exists)."""
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    # ------------------------------------------------------------------ set-up
    @classmethod
    def from_env(cls, device: torch.device, timeout_s: float = 600.0, threads: int = 0) -> Dist:
        """Read torchrun's RANK / WORLD_SIZE / LOCAL_RANK and join the process group; one process
        without them. device: model.device resolved; across ranks CUDA means cuda:LOCAL_RANK.
        threads: trainer.threads (0: one intra-op thread per rank on the CPU, where they share cores)."""
        world = int(os.environ.get("WORLD_SIZE", "1"))
        if world == 1:
            return cls(0, 1, 0, device, timeout_s)
        import torch.distributed as td

        rank, local = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
        if device.type == "cuda":
            device = torch.device(f"cuda:{local}")
            torch.cuda.set_device(device)
        elif threads == 0:
            torch.set_num_threads(1)
        if not td.is_initialized():
            td.init_process_group("nccl" if device.type == "cuda" else "gloo",
                                  timeout=datetime.timedelta(seconds=timeout_s),
                                  device_id=device if device.type == "cuda" else None)
        out = cls(rank, world, local, device, timeout_s)
        if td.get_backend() != "gloo":  # host-side collectives (metrics, summaries) go through gloo
            out._gloo = td.new_group(backend="gloo", timeout=datetime.timedelta(seconds=timeout_s))
        return out

    def close(self) -> None:
        if self.enabled:
            import torch.distributed as td

            if td.is_initialized():
                td.destroy_process_group()

    # ------------------------------------------------------------------ work split
    def shard(self, n: int, what: str = "prompts_per_step") -> tuple[int, int]:
        """[start, stop) of this rank's share of n items; n must divide evenly (whole groups per rank,
        so group advantages stay local)."""
        if n % self.world_size:
            from mentor_fast.config import ConfigError

            raise ConfigError(f"{what}={n} does not divide across {self.world_size} ranks; "
                             f"use a multiple of {self.world_size}")
        per = n // self.world_size
        return self.rank * per, (self.rank + 1) * per

    # ------------------------------------------------------------------ collectives
    def sum(self, values: Sequence[float] | torch.Tensor) -> torch.Tensor:
        """Element-wise sum over ranks, fp64 on the CPU."""
        t = torch.as_tensor(values, dtype=torch.float64).clone()
        if self.enabled:
            self._all_reduce(t, "sum")
        return t

    def max(self, values: Sequence[float] | torch.Tensor) -> torch.Tensor:
        t = torch.as_tensor(values, dtype=torch.float64).clone()
        if self.enabled:
            self._all_reduce(t, "max")
        return t

    def any(self, flag: bool) -> bool:
        return bool(self.max([float(flag)])[0] > 0)

    def gather(self, obj: Any) -> list[Any]:
        """Every rank's `obj`, in rank order (picklable objects; small ones: metrics, summaries)."""
        if not self.enabled:
            return [obj]
        import torch.distributed as td

        out: list[Any] = [None] * self.world_size
        td.all_gather_object(out, obj, group=self._cpu_group())
        return out

    def barrier(self) -> None:
        if self.enabled:
            self._all_reduce(torch.zeros(1, dtype=torch.float64), "sum")

    def _all_reduce(self, t: torch.Tensor, op: str) -> None:
        import torch.distributed as td

        td.all_reduce(t, op=td.ReduceOp.SUM if op == "sum" else td.ReduceOp.MAX, group=self._cpu_group())

    def _cpu_group(self):
        """Small host-side collectives go through gloo even when the policy uses NCCL."""
        return self._gloo

