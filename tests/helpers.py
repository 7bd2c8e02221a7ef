"""Helpers several test modules share: batches of groups on the tiny model, an updater built as the
trainer builds it, gradient comparisons, a shaped reward for models that never answer correctly,
and metric rows with the timings left out. Fixtures live in conftest.py."""

from __future__ import annotations

import random
from pathlib import Path

import torch
from mentor_fast.kernels import GRPOOptions

from mentor_fast.config import OptimConfig, TrainerConfig
from mentor_fast.models import load_policy
from mentor_fast.trainer import TIMING_PREFIXES
from mentor_fast.types import Group, Problem, Rollout
from mentor_fast.update import PolicyUpdater, build_optimizer

PAD = 2
EOS = 2  # SmolLM2's <|im_end|>: tokenizer EOS and generation_config EOS of the tiny model

# A TRL-style reward function for the tiny random model, which never answers correctly: a signal
# that does not depend on correctness (the module is written where a test's run can import it).
SHAPED_REWARD = """
def shorter_is_better(completions, **columns):
    return [-len(c[0]["content"]) / 100.0 for c in completions]
"""


def write_shaped_reward(folder: Path, monkeypatch, module: str = "tiny_rewards") -> str:
    """Writes SHAPED_REWARD as `module`.py in `folder`, importable for the test; returns the
    `reward.functions` override that uses it."""
    (folder / f"{module}.py").write_text(SHAPED_REWARD)
    monkeypatch.syspath_prepend(str(folder))
    return f'reward.functions=["{module}:shorter_is_better"]'


def comparable(row: dict) -> dict:
    """A metrics row without its timings (which differ from run to run)."""
    return {k: v for k, v in row.items() if not k.startswith(TIMING_PREFIXES)}


def make_groups(rewards: list[list[float]], seed: int = 0, hinted: bool = True) -> list[Group]:
    """Groups of random token sequences; prompts differ in length, and the first group's last rollout
    has a hinted prompt (the group's prompt plus extra tokens), as a MENTOR re-roll does."""
    rng = random.Random(seed)
    groups = []
    for g, group_rewards in enumerate(rewards):
        prompt = [rng.randrange(3, 500) for _ in range(5 + 4 * g)]
        problem = Problem(id=f"p{g}", question=f"q{g}", gold="1")
        rollouts = []
        for k, r in enumerate(group_rewards):
            ids = prompt
            if hinted and g == 0 and k == len(group_rewards) - 1:  # a re-roll: q + hint tokens
                ids = prompt + [rng.randrange(3, 500) for _ in range(3)]
            comp = [rng.randrange(3, 500) for _ in range(rng.randint(1, 9))]
            rollouts.append(Rollout(problem=problem, group_id=g, prompt_ids=ids, completion_ids=comp,
                                    sampler_logprobs=[-rng.uniform(0.5, 3.0) for _ in comp], text="",
                                    finish_reason="stop", policy_version=0, reward=r, correct=r > 0))
        groups.append(Group(group_id=g, problem=problem, prompt_ids=prompt, rollouts=rollouts))
    return groups


def make_updater(path, impl: str = "reference", *, bf16: bool = False, dtype: torch.dtype = torch.float32,
                 loss: dict | None = None, device: str = "cpu", **trainer) -> PolicyUpdater:
    """A PolicyUpdater on a fresh copy of the model at `path` (seeded) on `device`, AdamW at lr 1e-3,
    16 new tokens at most; bf16: the decoder under bf16 autocast and the head on bf16 operands."""
    torch.manual_seed(0)
    model = load_policy(path).to(device=device, dtype=dtype)
    model.train()
    optim_cfg = OptimConfig(lr=1e-3)
    optimizer, scheduler = build_optimizer(model, optim_cfg, max_steps=10)
    options = GRPOOptions(impl=impl, max_completion_len=16, compute_dtype=torch.bfloat16 if bf16 else None,
                          **(loss or {}))
    return PolicyUpdater(model, optimizer, scheduler, options, TrainerConfig(**trainer), optim_cfg, pad_id=PAD)


def grads_of_update(updater: PolicyUpdater, batch) -> tuple[dict[str, torch.Tensor], dict]:
    """Runs one update and returns the gradients the optimizer saw, and the update's metrics."""
    seen = {}
    step = updater._optimizer_step

    def capture():
        for name, p in updater.model.named_parameters():
            seen[name] = p.grad.detach().clone()
        return step()

    updater._optimizer_step = capture
    metrics = updater.update(batch, policy_version=0)
    return seen, metrics


def assert_grads_close(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor], rel: float) -> None:
    """Per parameter, ||got - want|| <= rel * ||want|| (elementwise tolerances fail on the tiny entries
    of large-norm gradients, where summation order alone moves them). For paths that run the same
    fp32 ops grouped differently; paths of another precision use the 2x rule
    (mentor_fast.kernels.testing.assert_close_rule)."""
    for name, w in want.items():
        err = float((got[name] - w).norm())
        assert err <= rel * float(w.norm()) + 1e-12, f"{name}: |diff| {err:.3g} vs |grad| {float(w.norm()):.3g}"


def eos_bias_hook(module, args, output, bias: float = 6.35):
    """The random tiny model spreads its mass over ~49k tokens; +6.35 on the EOS logit gives P(EOS) ~ 0.15
    a step at T = 0.7 (e^(6.35/0.7) ~ 49k * 0.15 / 0.85), so rows finish at different steps and some
    run to the length limit."""
    out = output.clone()
    out[..., EOS] += bias
    return out


class TwoRanks:
    """A stand-in for two ranks' gather, for reduce_metrics (test_distributed.py's 2-rank runs use real ones)."""

    enabled = True

    def __init__(self, other: dict) -> None:
        self.other = other

    def gather(self, mine):
        return [mine, self.other]
