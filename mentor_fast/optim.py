"""AdamW with its two moments stored in bf16 (optim.state_dtype=bfloat16): 12 bytes per trained
parameter instead of 16 (fp32 weight 4 + gradient 4 + moments 2 x 2), the math of each step in fp32.

Storing a moment by plain rounding loses it: beta2 = 0.999 moves the second moment by 0.1% a step,
under bf16's relative resolution of 2^-8 (0.4%), so round-to-nearest writes most updates back as
the old value and v stops decaying. Each store here rounds stochastically instead (random low bits
added before truncation), which is unbiased: the stored moment equals the fp32 one in expectation.
benchmarks/adamw_bf16.py measures how far both roundings drift from fp32 AdamW.
"""

from __future__ import annotations

import math

import torch


def store_bf16_(dst: torch.Tensor, src: torch.Tensor, generator: torch.Generator | None) -> None:
    """dst (bf16) := src (fp32) rounded stochastically: a value between two bf16 neighbours goes up
    with probability equal to its distance from the lower one (in units of their gap)."""
    bits = src.contiguous().view(torch.int32)
    noise = torch.randint(0, 1 << 16, src.shape, dtype=torch.int32, device=src.device, generator=generator)
    dst.copy_(((bits + noise) & -65536).view(torch.float32))  # low 16 bits zero: exact in bf16


class AdamWBF16States(torch.optim.Optimizer):
    """torch.optim.AdamW's update (decoupled weight decay, bias-corrected moments), with
    exp_avg and exp_avg_sq kept in bf16 and rounded stochastically (`stochastic=False`: to nearest,
    for the measurement). Parameters and gradients keep their own dtype (fp32 master weights)."""

    def __init__(self, params, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.0, *, stochastic: bool = True, seed: int = 0):
        super().__init__(params, {"lr": lr, "betas": tuple(betas), "eps": eps, "weight_decay": weight_decay})
        self.stochastic = stochastic
        self._seed = seed
        self._generators: dict[torch.device, torch.Generator] = {}

    def _generator(self, device: torch.device) -> torch.Generator | None:
        if not self.stochastic:
            return None
        if device not in self._generators:
            self._generators[device] = torch.Generator(device).manual_seed(self._seed)
        return self._generators[device]

    def load_state_dict(self, state_dict) -> None:
        """torch's loader casts every state tensor to its parameter's dtype; the moments go back to bf16
        (exactly: they were bf16 values)."""
        super().load_state_dict(state_dict)
        for state in self.state.values():
            for key in ("exp_avg", "exp_avg_sq"):
                if key in state:
                    state[key] = state[key].to(torch.bfloat16)

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            lr, eps, wd = group["lr"], group["eps"], group["weight_decay"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["step"] = torch.zeros((), dtype=torch.float32)  # on the CPU: no device sync
                    state["exp_avg"] = torch.zeros_like(p, dtype=torch.bfloat16)
                    state["exp_avg_sq"] = torch.zeros_like(p, dtype=torch.bfloat16)
                state["step"] += 1
                t = float(state["step"])
                g = p.grad.float()
                m = state["exp_avg"].float().lerp_(g, 1 - beta1)
                v = state["exp_avg_sq"].float().mul_(beta2).addcmul_(g, g, value=1 - beta2)
                if wd:
                    p.mul_(1 - lr * wd)
                denom = v.sqrt().div_(math.sqrt(1 - beta2**t)).add_(eps)
                p.addcdiv_(m.to(p.dtype), denom.to(p.dtype), value=-lr / (1 - beta1**t))
                if self.stochastic:
                    gen = self._generator(p.device)
                    store_bf16_(state["exp_avg"], m, gen)
                    store_bf16_(state["exp_avg_sq"], v, gen)
                else:
                    state["exp_avg"].copy_(m)
                    state["exp_avg_sq"].copy_(v)
        return loss
