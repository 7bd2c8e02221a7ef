"""AdamW with its two moments stored in bf16 (optim.state_dtype=bfloat16): 12 bytes per trained
parameter instead of 16 (fp32 weight 4 + gradient 4 + moments 2 x 2), the math of each step in fp32.

Storing a moment by plain rounding loses it: beta2 = 0.999 moves the second moment by 0.1% a step,
under bf16's relative resolution of 2^-8 (0.4%), so round-to-nearest writes most updates back as
the old value and v stops decaying. Each store here rounds stochastically instead (random low bits
added before truncation), which is unbiased: the stored moment equals the fp32 one in expectation.
benchmarks/adamw_bf16.py measures how far both roundings drift from fp32 AdamW.

The step is foreach by default: a few `torch._foreach_*` calls over buckets of parameters, each
moment upcast into one flat fp32 buffer per bucket (so the stochastic rounding is three flat ops),
instead of a dozen launches per parameter. `foreach=False` keeps the per-parameter loop, the
specification: on the CPU the two give the same bits (the noise is drawn in the loop's order).

`build_optimizer` picks the implementation of torch's AdamW too (optim.implementation): fused (one
kernel for every parameter) on CUDA, torch's own choice elsewhere.
"""

from __future__ import annotations

import math

import torch

from mentor_fast.config import OptimConfig

# Elements per foreach bucket: its fp32 scratch (two moments, the denominator, the noise) stays
# under ~1 GB whatever the model.
BUCKET_ELEMENTS = 1 << 26


def store_bf16_(dst: torch.Tensor, src: torch.Tensor, generator: torch.Generator | None) -> None:
    """dst (bf16) := src (fp32) rounded stochastically: a value between two bf16 neighbours goes up
    with probability equal to its distance from the lower one (in units of their gap)."""
    bits = src.contiguous().view(torch.int32)
    noise = torch.randint(0, 1 << 16, src.shape, dtype=torch.int32, device=src.device, generator=generator)
    dst.copy_(((bits + noise) & -65536).view(torch.float32))  # low 16 bits zero: exact in bf16


class AdamWBF16States(torch.optim.Optimizer):
    """torch.optim.AdamW's update (decoupled weight decay, bias-corrected moments), with
    exp_avg and exp_avg_sq kept in bf16 and rounded stochastically (`stochastic=False`: to nearest,
    for the measurement). Parameters and gradients keep their own dtype (fp32 master weights).
    foreach: the bucketed step (False: the per-parameter loop); bucket_elements: its bucket size."""

    def __init__(self, params, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.0, *, stochastic: bool = True, seed: int = 0, foreach: bool = True,
                 bucket_elements: int = BUCKET_ELEMENTS):
        super().__init__(params, {"lr": lr, "betas": tuple(betas), "eps": eps, "weight_decay": weight_decay})
        self.stochastic, self.foreach, self.bucket_elements = stochastic, foreach, bucket_elements
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
            params = [p for p in group["params"] if p.grad is not None]
            for p in params:
                state = self.state[p]
                if not state:
                    state["step"] = torch.zeros((), dtype=torch.float32)  # on the CPU: no device sync
                    state["exp_avg"] = torch.zeros_like(p, dtype=torch.bfloat16)
                    state["exp_avg_sq"] = torch.zeros_like(p, dtype=torch.bfloat16)
                state["step"] += 1
            if self.foreach:
                for bucket in _buckets(params, self.state, self.bucket_elements):
                    self._step_foreach(group, bucket)
            else:
                for p in params:
                    self._step_one(group, p)
        return loss

    def _step_one(self, group, p: torch.Tensor) -> None:
        """The specification: one parameter, its moments upcast, updated in fp32 and stored back."""
        beta1, beta2 = group["betas"]
        lr, eps, wd = group["lr"], group["eps"], group["weight_decay"]
        state = self.state[p]
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

    def _step_foreach(self, group, params: list[torch.Tensor]) -> None:
        """`_step_one` over a bucket of fp32 parameters on one device, at one step count: the moments
        in flat fp32 buffers (one upcast, three flat ops of rounding, one store), the rest foreach."""
        beta1, beta2 = group["betas"]
        lr, eps, wd = group["lr"], group["eps"], group["weight_decay"]
        t = float(self.state[params[0]]["step"])
        ps, grads = [_local(p) for p in params], [_local(p.grad).float() for p in params]
        ms = [_local(self.state[p]["exp_avg"]) for p in params]
        vs = [_local(self.state[p]["exp_avg_sq"]) for p in params]
        sizes = [p.numel() for p in ps]
        m32 = torch.cat([m.reshape(-1) for m in ms]).float()  # [bucket] fp32
        v32 = torch.cat([v.reshape(-1) for v in vs]).float()
        m_views, v_views = _views(m32, ps), _views(v32, ps)
        torch._foreach_lerp_(m_views, grads, 1 - beta1)
        torch._foreach_mul_(v_views, beta2)
        torch._foreach_addcmul_(v_views, grads, grads, value=1 - beta2)
        if wd:
            torch._foreach_mul_(ps, 1 - lr * wd)
        denom = v32.sqrt().div_(math.sqrt(1 - beta2**t)).add_(eps)
        cast = (lambda xs: xs) if ps[0].dtype == torch.float32 else (lambda xs: [x.to(ps[0].dtype) for x in xs])
        torch._foreach_addcdiv_(ps, cast(m_views), cast(_views(denom, ps)), value=-lr / (1 - beta1**t))
        if self.stochastic:
            # the loop draws [m_1, v_1, m_2, v_2, ...]; the same draw, split the same way
            noise = torch.randint(0, 1 << 16, (2 * sum(sizes),), dtype=torch.int32, device=m32.device,
                                  generator=self._generator(m32.device))
            pairs = noise.split([n for n in sizes for _ in (0, 1)])
            for flat, part in ((m32, pairs[0::2]), (v32, pairs[1::2])):
                bits = flat.view(torch.int32)
                bits.add_(torch.cat(part)).bitwise_and_(-65536)  # low 16 bits zero: exact in bf16
        torch._foreach_copy_(ms, _views(m32.to(torch.bfloat16), ps))
        torch._foreach_copy_(vs, _views(v32.to(torch.bfloat16), ps))


def _local(t: torch.Tensor) -> torch.Tensor:
    """A sharded tensor's local shard (FSDP2's DTensor), else the tensor: the update is elementwise."""
    return t._local_tensor if hasattr(t, "_local_tensor") else t


def _views(flat: torch.Tensor, like: list[torch.Tensor]) -> list[torch.Tensor]:
    return [part.view(t.shape) for part, t in zip(flat.split([t.numel() for t in like]), like)]


def _buckets(params: list[torch.Tensor], state, limit: int) -> list[list[torch.Tensor]]:
    """Runs of consecutive parameters on one device, of one dtype and step count, each cut at `limit`
    elements: in the parameters' order, so the noise is drawn in the loop's order."""
    runs: list[list[torch.Tensor]] = []
    key, size = None, 0
    for p in params:
        k = (p.device, p.dtype, float(state[p]["step"]))
        if k != key or size + p.numel() > limit:
            runs.append([])
            key, size = k, 0
        runs[-1].append(p)
        size += p.numel()
    return runs


def build_optimizer(model: torch.nn.Module, cfg: OptimConfig, max_steps: int):
    """AdamW over the trainable parameters (optim.state_dtype, optim.implementation) and its schedule."""
    params = [p for p in model.parameters() if p.requires_grad]
    kwargs = {"lr": cfg.lr, "betas": tuple(cfg.betas), "weight_decay": cfg.weight_decay}
    if cfg.state_dtype == "bfloat16":
        optimizer = AdamWBF16States(params, foreach=cfg.implementation != "for_loop", **kwargs)
    else:
        optimizer = torch.optim.AdamW(params, **kwargs, **_torch_adamw_kind(params, cfg.implementation))

    def factor(step: int) -> float:
        if cfg.warmup_steps and step < cfg.warmup_steps:
            return (step + 1) / cfg.warmup_steps
        if cfg.schedule == "constant":
            return 1.0
        span = max(1, max_steps - cfg.warmup_steps)
        progress = min(1.0, (step - cfg.warmup_steps) / span)
        if cfg.schedule == "linear":
            return 1.0 - progress
        return 0.5 * (1.0 + math.cos(math.pi * progress))

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
    return optimizer, scheduler


def _torch_adamw_kind(params: list[torch.Tensor], implementation: str) -> dict[str, bool]:
    """torch.optim.AdamW's flags. auto: fused where every parameter is a plain CUDA tensor (one
    kernel for the whole step; FSDP2's sharded parameters keep torch's foreach), else torch's
    default (foreach on CUDA, the loop on the CPU)."""
    if implementation == "auto":
        plain_cuda = bool(params) and all(p.is_cuda and not hasattr(p, "_local_tensor") for p in params)
        return {"fused": True} if plain_cuda else {}
    return {"fused": implementation == "fused", "foreach": implementation == "foreach"}


def pending_state_bytes(optimizer: torch.optim.Optimizer) -> int:
    """Bytes of training state not yet allocated: the gradients of parameters that have none, and
    AdamW's two moments (fp32 or bf16) of parameters it has not stepped."""
    moment = 2 * (2 if isinstance(optimizer, AdamWBF16States) else 4)
    total = 0
    for group in optimizer.param_groups:
        for p in group["params"]:
            total += p.numel() * p.element_size() if p.grad is None else 0
            total += p.numel() * moment if not optimizer.state.get(p) else 0
    return total
