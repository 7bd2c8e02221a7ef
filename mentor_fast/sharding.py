"""The policy across ranks: FSDP2 (`torch.distributed.fsdp.fully_shard`) and the sharded checkpoint.

`PolicyModule` is the one FSDP unit: its forward runs any function of the HF model, so every
forward the trainer makes (the completion hidden states, a term's logits) goes through its hooks:
one all-gather of the parameters before it, one reduce-scatter of the gradients after the
backward. Per-layer units would make the collectives depend on how often a layer runs in a
pass, and the shared-prompt forward runs every layer twice (the prompts, then the completions on
their keys/values), a row forward once, an empty pass once: ranks would issue different
collectives and hang. One unit costs memory instead: while a rank computes, it holds the whole
parameters (in the compute dtype) and their gradients; the fp32 master weights and AdamW's two
states, 12 of the 16 bytes per parameter, stay sharded (docs/scaling.md).

The fused loss head needs the whole LM head ([V, H]). Inside the unit's forward the parameters
are the gathered ones, so the head weight the forward function hands back is whole, and its
gradient is reduce-scattered with the rest: the head is gathered for the loss, not sharded by
vocabulary.

Within an optimizer step the update keeps the gathered parameters and accumulates gradients
locally (`accumulate`), and only the step's last backward reduce-scatters and reshards: one
all-gather and one reduce-scatter per optimizer step.

Gradients are summed across ranks (`set_gradient_divide_factor(1)`): each rank's loss already
carries the global normaliser (the update divides by the whole step's tokens or sequences, over
all ranks), so the sum is the one-device gradient.

With one rank nothing is sharded: `PolicyModule` is a plain wrapper and the calls are the same.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn

from mentor_fast.dist import Dist


class PolicyModule(nn.Module):
    """Root wrapper: `policy(fn, *args)` runs `fn(hf_model, *args)` as this module's forward."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return fn(self.model, *args, **kwargs)


def head_weight(model: nn.Module) -> torch.Tensor:
    """The LM head weight as seen inside a forward (gathered under FSDP2)."""
    return model.get_output_embeddings().weight


def shard_policy(model: nn.Module, dist: Dist, *, param_dtype: torch.dtype | None = None) -> PolicyModule:
    """Wrap `model` for training: FSDP2 over the ranks, or a plain wrapper on one rank.
    param_dtype: the compute dtype of the gathered parameters (bf16 on a GPU), with fp32 gradient
    reduction and fp32 master weights."""
    root = PolicyModule(model)
    if not dist.enabled:
        return root
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mesh = init_device_mesh(dist.device.type, (dist.world_size,))
    mp = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32) if param_dtype else MixedPrecisionPolicy()
    fully_shard(root, mesh=mesh, mp_policy=mp)
    root.set_gradient_divide_factor(1.0)
    root.set_force_sum_reduction_for_comms(True)  # a plain SUM (gloo has no pre-multiplied sum)
    return root


def accumulate(policy: PolicyModule, last: bool) -> None:
    """Before a backward: the optimizer step's last one reduce-scatters the gradients and frees the
    gathered parameters; the others accumulate on the gathered ones, with no collective."""
    policy.set_requires_gradient_sync(last)
    policy.set_reshard_after_backward(last)


def is_sharded(t: torch.Tensor) -> bool:
    from torch.distributed.tensor import DTensor

    return isinstance(t, DTensor)


def full_tensor(t: torch.Tensor) -> torch.Tensor:
    """The whole tensor on every rank (an all-gather for a shard; the tensor itself otherwise)."""
    return t.full_tensor() if is_sharded(t) else t


class FullWeights:
    """A view of the sharded policy that engines read like a module: `state_dict()` gathers each
    tensor on this rank's device (every rank calls it together; no copy through one rank's CPU).
    Tied tensors are gathered once."""

    def __init__(self, policy: PolicyModule):
        self.policy = policy

    def state_dict(self) -> dict[str, torch.Tensor]:
        return dict(self.items())

    def items(self) -> Iterator[tuple[str, torch.Tensor]]:
        seen: dict[int, torch.Tensor] = {}
        for name, t in self.policy.model.state_dict().items():
            local = t._local_tensor if is_sharded(t) else t
            key = id(local.untyped_storage()) if local.numel() else id(t)
            if key not in seen:
                seen[key] = full_tensor(t).detach()
            yield name, seen[key]


def global_grad_norm(params: list[torch.Tensor], max_norm: float) -> torch.Tensor:
    """Clip by the norm over every rank's gradient shards (max_norm <= 0: measure only). torch's
    foreach kernels on CUDA; the norm stays on the device, so the optimizer step is queued behind
    the clipping without waiting for it."""
    norm = torch.nn.utils.clip_grad_norm_(params, max_norm if max_norm > 0 else float("inf"))
    return full_tensor(norm).detach().float()
