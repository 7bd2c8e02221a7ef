"""`mentor-fast sft`: a short supervised warm-up on the data's worked solutions, saved as an HF folder.

GRPO needs a policy that sometimes succeeds: SmolLM2-135M-Instruct solves almost none of the ladder
out of the box (sampled pass@1 0.02 over levels 1-4, docs/experiments/history.md), so the demo and
the collapse experiment start from this warm-up. Targets are each problem's worked steps and a
boxed answer, the loss is on the target tokens only. Optionally a share of the rows are problems
of other levels with the reference mentor's hint in the prompt (`hinted_frac`), so the policy learns
to read a hint (as an instruction-tuned model would) without seeing the levels it will train on.

    mentor-fast sft --config configs/demo_cpu.yaml --levels 1,2 --hinted-levels 5 --out runs/demo_cpu/sft
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass
from pathlib import Path

from mentor_fast.config import load_config
from mentor_fast.tasks import TASKS, TaskKind, task_of


@dataclass
class SFTSchedule:
    steps: int = 40
    batch: int = 16
    lr: float = 3e-5
    schedule: str = "constant"  # or "cosine": 5% linear warm-up, then down to 0.1x (training from scratch)
    hinted_frac: float = 0.25
    threads: int = 2

    def lr_scale(self, i: int) -> float:
        """Multiplier of lr after i optimizer steps."""
        if self.schedule == "constant":
            return 1.0
        warm = max(1, self.steps // 20)
        if i < warm:
            return (i + 1) / warm
        t = (i - warm) / max(1, self.steps - warm)
        return 0.1 + 0.45 * (1 + math.cos(math.pi * min(1.0, t)))


def sft_target(problem) -> str:
    """What the warm-up teaches for a problem: its task's worked solution (math: the steps and the
    boxed answer; code: the reference program in one fenced block)."""
    target = task_of(problem).worked_solution(problem)
    if target is None:
        raise ValueError(f"problem {problem.id!r} has no worked solution to train on")
    return target


def sft_warmup(model: str, data_overrides: list[str], out: Path, seed: int, sched: SFTSchedule,
               hinted_overrides: list[str] | None = None, log=print) -> Path:
    """Train `model` (a folder or built-in name) on worked solutions of the source that
    `data_overrides` (config keys data.*) describe, drawn from seed + 1000; with `hinted_overrides`,
    a `hinted_frac` share of each batch comes from that source (seed + 2000) with the reference
    mentor's level-2 or level-3 hint in the prompt. Saves OUT/policy and returns it."""
    import torch

    from mentor_fast.data import PromptBuilder, build_source
    from mentor_fast.mentor.writers.solutions import cold_hint
    from mentor_fast.models import load_policy, load_tokenizer, resolve_model_path

    torch.manual_seed(seed)
    torch.set_num_threads(sched.threads)
    path = resolve_model_path(model)
    tok, policy = load_tokenizer(path), load_policy(path)
    policy.train()
    cfg = load_config([], data_overrides)
    builder = PromptBuilder.from_config(tok, cfg.data)
    source = build_source(cfg.data, seed + 1000)
    hinted = build_source(load_config([], hinted_overrides).data, seed + 2000) if hinted_overrides else None
    optimizer = torch.optim.AdamW(policy.parameters(), lr=sched.lr)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, sched.lr_scale)
    for step in range(1, sched.steps + 1):
        rows = []
        n_hinted = round(sched.batch * sched.hinted_frac) if hinted else 0
        problems = [(p, None) for p in source.batch(step, sched.batch - n_hinted)]
        if n_hinted:
            problems += [(p, cold_hint(p, 2 + k % 2)) for k, p in enumerate(hinted.batch(step, n_hinted))]
        for p, hint in problems:
            target = sft_target(p)
            rows.append((builder.encode(p, hint),
                         tok(target, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]))
        width = max(len(a) + len(b) for a, b in rows)
        ids = torch.full((len(rows), width), tok.pad_token_id)
        labels = torch.full((len(rows), width), -100)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for r, (prompt, comp) in enumerate(rows):
            n = len(prompt) + len(comp)
            ids[r, :n] = torch.tensor(prompt + comp)
            labels[r, len(prompt) : n] = torch.tensor(comp)  # the loss sees only the answer
            mask[r, :n] = 1
        loss = policy(input_ids=ids, attention_mask=mask, labels=labels).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(policy.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        if step % max(1, sched.steps // 40) == 0 or step == sched.steps:
            log(f"sft step {step}/{sched.steps}: loss {loss.item():.3f}")
    policy.save_pretrained(out / "policy")
    tok.save_pretrained(out / "policy")
    return out / "policy"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="mentor-fast sft", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", action="append", default=[], help="YAML file(s): seed and data.* are read")
    p.add_argument("--model", default="smollm2-135m-instruct", help="the model to start from (folder or built-in name)")
    p.add_argument("--out", required=True, help="folder; the policy is written to OUT/policy")
    p.add_argument("--levels", help="ladder levels to train on, e.g. 1,2 (default: the config's data.levels)")
    p.add_argument("--hinted-levels", default="", help="ladder levels of the hinted rows, e.g. 5 (default: none)")
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--lr", type=float, default=3e-5)
    p.add_argument("--schedule", default="constant", choices=("constant", "cosine"))
    p.add_argument("--hinted-frac", type=float, default=0.25)
    p.add_argument("overrides", nargs="*", help="key.sub=value overrides, applied last")
    args = p.parse_args(argv)
    cfg = load_config(args.config, args.overrides)
    task = [f"data.source={cfg.data.source}", f"data.max_digits={cfg.data.max_digits}", f"task={cfg.task}"]
    if cfg.data.source == "jsonl":
        task += [f"data.path={cfg.data.path}", f"data.format={cfg.data.format}",
                 f"data.code_columns={cfg.data.code_columns}"]
    data = [*task, f"data.levels=[{args.levels or ','.join(map(str, cfg.data.levels))}]"]
    hinted = None
    if args.hinted_levels:
        ladder = TASKS[TaskKind(cfg.task)].ladder  # hinted rows: the task's ladder
        hinted = [f"data.source={ladder}", f"task={cfg.task}", f"data.levels=[{args.hinted_levels}]",
                  f"data.max_digits={cfg.data.max_digits}"]
    sched = SFTSchedule(steps=args.steps, batch=args.batch, lr=args.lr, schedule=args.schedule,
                        hinted_frac=args.hinted_frac if hinted else 0.0,
                        threads=cfg.trainer.threads or 2)
    out = sft_warmup(args.model, data, Path(args.out), cfg.seed, sched, hinted,
                     log=lambda line: print(line, flush=True))
    print(f"policy: {out}")
    return 0
