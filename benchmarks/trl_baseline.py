#!/usr/bin/env python
"""TRL's GRPOTrainer on our bench's settings: the `trl_*` variants of `mentor-fast bench`.

Run it with the python of a virtualenv that has trl (it is not a dependency of mentor_fast):

    TRL_PYTHON benchmarks/trl_baseline.py --model MODEL_DIR --out OUT_DIR --name NAME --max-steps N \\
        [--no-gc] [--bf16] [--max-new-tokens 128] [--threads 2]

It writes OUT_DIR/NAME.json: {"steps": [...], "ru_maxrss_mb", "versions", "config"}, one row per
optimizer step, which `mentor_fast.bench.run_trl` maps onto our trainer's metric names.

Settings come from `mentor_fast.bench.BASE` through our own config loader, so they follow the bench:
the model folder in fp32, prompts_per_step x num_generations rows per step (4 x 8), at most
--max-new-tokens new tokens, the sampling temperature, lr, beta, AdamW betas, weight decay, grad clip
and the clip range; a constant learning rate and one optimizer step per generation batch (no reuse of
a generation). Gradient checkpointing is on unless --no-gc (TRL's default); --bf16 is the Trainer's
bf16 autocast over fp32 weights. Transformers generation, no vLLM, nothing downloaded.

Prompts: TRL step k trains on exactly our step k's problems, `build_source(cfg.data, cfg.seed).batch(k,
prompts_per_step)`, as the messages our PromptBuilder builds (its system prompt, the tokenizer's chat
template). The dataset is in step order and TRL's sampler does not shuffle it; every step checks that
the prompt ids handed to generation are our PromptBuilder's ids (`prompts_match` per step; a mismatch
fails the run after the JSON is written). Reward: mentor_fast.rewards.math.verify (math-verify on the
last \\boxed{} answer against the gold), 1.0 or 0.0, in this process.

Timing, per optimizer step (time.perf_counter; a subclass of GRPOTrainer plus a TrainerCallback):
  wall_s      from the step's dataloader fetch (Trainer.get_batch_samples) to on_step_end: fetch,
              rollout, loss, backward, grad clip, AdamW step, scheduler step, zero_grad
  generate_s  GRPOTrainer._generate_single_turn: left padding + model.generate + cutting at EOS
  reward_s    GRPOTrainer._calculate_rewards: the reward function over the step's completions
  rollout_s   GRPOTrainer._prepare_inputs: tokenize + generate + decode + reward + advantages
  train_s     Trainer.training_step start -> on_step_end, less rollout_s: policy forward + loss
              (compute_loss_s), backward (with recomputation under checkpointing), grad clip,
              optimizer step (optimizer_s), scheduler step and zero_grad
  other_s     wall_s - rollout_s - train_s (dataloader fetch, tokenizing, decoding, advantages)
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import resource
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]

# Our loss aggregation -> TRL's loss_type with the same per-token weights (kernels/enums.py).
TRL_LOSS_TYPE = {"token_mean": "dapo", "token_mean_micro": "bnpo", "seq_mean_token_mean": "grpo",
                 "constant": "dr_grpo"}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="local HF folder of SmolLM2-135M-Instruct")
    p.add_argument("--out", required=True, help="folder for NAME.json")
    p.add_argument("--name", default="trl", help="result file stem")
    p.add_argument("--max-steps", type=int, default=6, help="optimizer steps (= generation batches)")
    p.add_argument("--no-gc", action="store_true", help="gradient checkpointing off (on by default, as in TRL)")
    p.add_argument("--bf16", action="store_true", help="bf16 autocast over fp32 weights (default: fp32)")
    p.add_argument("--max-new-tokens", type=int, default=128, help="completion length limit (bench: 128)")
    p.add_argument("--threads", type=int, default=2, help="torch intra-op threads (bench: 2)")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="where TRL trains (bench: cpu)")
    p.add_argument("--reward", choices=["math", "length"], default="math",
                   help="math: mentor_fast's verifier (bench); length: shorter is better, -len(text) / 100 (a random "
                        "model's only signal; benchmarks/gpu_step.py gives ours the same function)")
    args = p.parse_args(argv)
    if args.max_steps < 1 or args.max_new_tokens < 1 or args.threads < 1:
        p.error("--max-steps, --max-new-tokens and --threads must be >= 1")
    return args


# ------------------------------------------------------------------------------------------ project code
def import_project() -> None:
    """Makes mentor_fast importable from a virtualenv that does not have it installed: the repository
    root goes on sys.path, and `mentor_fast.kernels` (the folder kernels/, mapped by pyproject's
    package-dir; the config schema imports its enums) is loaded from there when nothing provides it."""
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    import mentor_fast  # noqa: F401

    if "mentor_fast.kernels" in sys.modules or importlib.util.find_spec("mentor_fast.kernels") is not None:
        return
    spec = importlib.util.spec_from_file_location(
        "mentor_fast.kernels", REPO / "kernels" / "__init__.py", submodule_search_locations=[str(REPO / "kernels")]
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules["mentor_fast.kernels"] = module
    spec.loader.exec_module(module)


def run_config(max_new_tokens: int = 128):
    """Our bench's RunConfig (mentor_fast.bench.BASE) with the given completion length limit."""
    import_project()
    from mentor_fast.bench import BASE
    from mentor_fast.config import load_config

    return load_config([], [*BASE, f"rollout.max_new_tokens={max_new_tokens}"])


def prompt_rows(cfg, steps: int) -> list[dict[str, Any]]:
    """The training dataset: our steps 1..steps in order, prompts_per_step rows each, each row the chat
    messages our PromptBuilder builds for the problem, its gold answer, id and step."""
    import_project()
    from mentor_fast.data import PromptBuilder, build_source

    source = build_source(cfg.data, cfg.seed)
    builder = PromptBuilder(None, cfg.data.system_prompt, cfg.data.max_prompt_tokens)  # messages need no tokenizer
    rows = []
    for step in range(1, steps + 1):
        for problem in source.batch(step, cfg.rollout.prompts_per_step):
            rows.append({"prompt": builder.messages(builder.user_content(problem)), "gold": problem.gold,
                         "problem_id": problem.id, "step": step})
    return rows


def expected_prompt_ids(tokenizer, cfg, steps: int) -> dict[int, list[list[int]]]:
    """Per step, the prompt ids our trainer generates from, each repeated num_generations times (the
    order of TRL's generation batch)."""
    import_project()
    from mentor_fast.data import PromptBuilder, build_source

    source = build_source(cfg.data, cfg.seed)
    builder = PromptBuilder(tokenizer, cfg.data.system_prompt, cfg.data.max_prompt_tokens)
    g = cfg.rollout.num_generations
    return {step: [builder.encode(p) for p in source.batch(step, cfg.rollout.prompts_per_step) for _ in range(g)]
            for step in range(1, steps + 1)}


def shorter_is_better(completions, **columns) -> list[float]:
    """A shaped reward for models that never answer correctly (TRL's signature): -len(text) / 100."""
    return [-len(c[-1]["content"] if isinstance(c, list) else c) / 100.0 for c in completions]


def make_reward(timeout_s: float):
    """A TRL reward function: 1.0 when mentor_fast's math verifier accepts the completion, else 0.0."""
    import_project()
    from mentor_fast.rewards.math import verify

    def math_correct(completions, gold, **kwargs) -> list[float]:
        out = []
        for completion, answer in zip(completions, gold, strict=True):
            text = completion[-1]["content"] if isinstance(completion, list) else completion
            out.append(1.0 if verify(text, answer, timeout_s=timeout_s).correct else 0.0)
        return out

    return math_correct


# ------------------------------------------------------------------------------------------ timing
def step_record(step: int, wall_s: float, phases: dict[str, float], completion_lens: list[int],
                rewards: list[float], max_new_tokens: int, prompts_match: bool) -> dict[str, Any]:
    """One row of the result's "steps"; run_trl reads wall_s, generate_s, reward_s, train_s,
    step_tok_per_s and completion_tokens."""
    rollout = phases.get("rollout", 0.0)
    train = phases.get("train", 0.0)
    gen = phases.get("generate", 0.0)
    tokens = sum(completion_lens)
    return {
        "step": step,
        "wall_s": wall_s,
        "generate_s": gen,
        "reward_s": phases.get("reward", 0.0),
        "rollout_s": rollout,
        "train_s": train,
        "compute_loss_s": phases.get("compute_loss", 0.0),
        "optimizer_s": phases.get("optimizer", 0.0),
        "other_s": wall_s - rollout - train,
        "completion_tokens": tokens,
        "n_completions": len(completion_lens),
        "completion_len_mean": tokens / len(completion_lens) if completion_lens else 0.0,
        "n_truncated": sum(n >= max_new_tokens for n in completion_lens),
        "gen_tok_per_s": tokens / gen if gen > 0 else 0.0,
        "step_tok_per_s": tokens / wall_s if wall_s > 0 else 0.0,
        "acc": sum(rewards) / len(rewards) if rewards else 0.0,
        "prompts_match": prompts_match,
        "rss_mb": _rss_mb(),
        "peak_cuda_gb": _peak_cuda_gb(),
        "loadavg": os.getloadavg()[0],
    }


def _peak_cuda_gb() -> float | None:
    """torch.cuda.max_memory_allocated so far (GiB, as our trainer's perf/peak_mem_gb); None on the CPU."""
    import torch

    return torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else None


def _rss_mb() -> float:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


class StepClock:
    """Seconds per phase of the current optimizer step, and what generation saw."""

    def __init__(self):
        self.reset()

    def reset(self) -> None:
        self.t0: float | None = None
        self.t_train: float | None = None
        self.t_opt: float | None = None
        self.phases: dict[str, float] = {}
        self.completion_lens: list[int] = []
        self.prompt_ids: list[list[int]] = []
        self.rewards: list[float] = []

    def add(self, key: str, seconds: float) -> None:
        self.phases[key] = self.phases.get(key, 0.0) + seconds


def make_trainer_class(base, clock: StepClock):
    """GRPOTrainer with timers around the methods named in the module docstring (trl 1.16)."""

    class TimedGRPOTrainer(base):
        def get_batch_samples(self, *args, **kwargs):
            clock.reset()
            clock.t0 = time.perf_counter()
            return super().get_batch_samples(*args, **kwargs)

        def training_step(self, *args, **kwargs):
            if clock.t_train is None:
                clock.t_train = time.perf_counter()
            return super().training_step(*args, **kwargs)

        def _prepare_inputs(self, *args, **kwargs):
            t = time.perf_counter()
            out = super()._prepare_inputs(*args, **kwargs)
            clock.add("rollout", time.perf_counter() - t)
            return out

        def _generate_single_turn(self, prompt_ids, *args, **kwargs):
            t = time.perf_counter()
            completion_ids, logprobs = super()._generate_single_turn(prompt_ids, *args, **kwargs)
            clock.add("generate", time.perf_counter() - t)
            clock.prompt_ids.extend(list(map(int, ids)) for ids in prompt_ids)
            clock.completion_lens.extend(len(c) for c in completion_ids)
            return completion_ids, logprobs

        def _calculate_rewards(self, *args, **kwargs):
            t = time.perf_counter()
            rewards_per_func = super()._calculate_rewards(*args, **kwargs)
            clock.add("reward", time.perf_counter() - t)
            clock.rewards.extend(rewards_per_func.sum(dim=1).tolist())
            return rewards_per_func

        def compute_loss(self, *args, **kwargs):
            t = time.perf_counter()
            out = super().compute_loss(*args, **kwargs)
            clock.add("compute_loss", time.perf_counter() - t)
            return out

    return TimedGRPOTrainer


def make_callback(base, clock: StepClock, expected: dict[int, list[list[int]]], max_new_tokens: int,
                  steps: list[dict]):
    class StepTimer(base):
        def on_step_begin(self, args, state, control, **kwargs):
            if clock.t0 is None:  # get_batch_samples was not called (another transformers loop)
                clock.t0 = time.perf_counter()

        def on_pre_optimizer_step(self, args, state, control, **kwargs):
            clock.t_opt = time.perf_counter()

        def on_optimizer_step(self, args, state, control, **kwargs):
            if clock.t_opt is not None:
                clock.add("optimizer", time.perf_counter() - clock.t_opt)

        def on_step_end(self, args, state, control, **kwargs):
            t_end = time.perf_counter()
            if clock.t_train is not None:
                clock.add("train", t_end - clock.t_train - clock.phases.get("rollout", 0.0))
            step = state.global_step  # already advanced: this is step 1 after the first update
            rec = step_record(step, t_end - clock.t0, clock.phases, clock.completion_lens, clock.rewards,
                              max_new_tokens, clock.prompt_ids == expected.get(step))
            steps.append(rec)
            print("STEP " + json.dumps(rec), flush=True)
            clock.reset()

    return StepTimer()


# ------------------------------------------------------------------------------------------ main
def versions() -> dict[str, Any]:
    import torch

    import_project()
    from mentor_fast.bench import versions as machine_versions

    out: dict[str, Any] = machine_versions(
        ["trl", "transformers", "torch", "accelerate", "datasets", "math-verify", "tokenizers"])
    out["torch_threads"] = torch.get_num_threads()
    return out


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    for key in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE"):
        os.environ[key] = "1"
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ["OMP_NUM_THREADS"] = str(args.threads)

    cfg = run_config(args.max_new_tokens)
    rows = prompt_rows(cfg, args.max_steps)
    reward = make_reward(cfg.reward.timeout_s) if args.reward == "math" else shorter_is_better

    import torch
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    torch.set_num_threads(args.threads)
    aggregation = str(cfg.loss.aggregation)
    if aggregation not in TRL_LOSS_TYPE:
        raise SystemExit(f"loss.aggregation={aggregation} has no TRL loss_type")
    g = cfg.rollout.num_generations
    settings = {
        "num_generations": g,
        "per_device_train_batch_size": cfg.rollout.prompts_per_step * g,  # one generation batch = one step
        "gradient_accumulation_steps": 1,
        "steps_per_generation": 1,
        "num_iterations": 1,  # each generation is trained on once
        "shuffle_dataset": False,  # step k gets rows of our step k (prompt_rows order)
        "max_completion_length": args.max_new_tokens,
        "temperature": cfg.rollout.temperature,
        "top_p": cfg.rollout.top_p,
        "top_k": 0,
        "learning_rate": cfg.optim.lr,
        "lr_scheduler_type": "constant",
        "warmup_steps": 0,
        "weight_decay": cfg.optim.weight_decay,
        "adam_beta1": cfg.optim.betas[0],
        "adam_beta2": cfg.optim.betas[1],
        "max_grad_norm": cfg.optim.grad_clip,
        "beta": cfg.loss.beta,
        "loss_type": TRL_LOSS_TYPE[aggregation],
        "epsilon": cfg.loss.eps_low,
        "epsilon_high": cfg.loss.eps_high,
        "seed": cfg.seed,
        "max_steps": args.max_steps,
        "use_cpu": args.device == "cpu",
        "bf16": args.bf16,
        "fp16": False,
        "gradient_checkpointing": not args.no_gc,
        "model_init_kwargs": {"dtype": "float32", "attn_implementation": cfg.model.attn_implementation},
        "use_vllm": False,
        "logging_steps": 1,
        "report_to": "none",
        "save_strategy": "no",
        "disable_tqdm": True,
        "dataloader_num_workers": 0,
    }
    with tempfile.TemporaryDirectory(prefix="trl-baseline-") as tmp:
        grpo_args = GRPOConfig(output_dir=tmp, **settings)
        clock = StepClock()
        trainer_cls = make_trainer_class(GRPOTrainer, clock)
        t = time.perf_counter()
        trainer = trainer_cls(model=args.model, reward_funcs=reward, args=grpo_args,
                              train_dataset=Dataset.from_list(rows))
        init_s = time.perf_counter() - t
        steps: list[dict] = []
        expected = expected_prompt_ids(trainer.processing_class, cfg, args.max_steps)
        trainer.add_callback(make_callback(TrainerCallback, clock, expected, args.max_new_tokens, steps))
        t = time.perf_counter()
        trainer.train()
        train_total_s = time.perf_counter() - t
        resolved = {k: str(getattr(grpo_args, k, None)) for k in (
            "generation_batch_size", "steps_per_generation", "num_iterations", "loss_type", "scale_rewards",
            "epsilon", "epsilon_high", "top_k", "top_p", "gradient_checkpointing", "bf16", "optim",
            "lr_scheduler_type", "max_grad_norm", "mask_truncated_completions", "device")}

    config = {
        **settings,
        "resolved": resolved,
        "model": args.model,
        "model_dtype": str(trainer.model.dtype),
        "threads": args.threads,
        "data": {"source": cfg.data.source, "levels": list(cfg.data.levels), "seed": cfg.seed,
                 "prompts_per_step": cfg.rollout.prompts_per_step, "system_prompt": cfg.data.system_prompt},
        "reward": ("mentor_fast.rewards.math.verify, in process" if args.reward == "math"
                   else "shorter_is_better: -len(text) / 100"),
        "device": args.device,
        "init_s": init_s,
        "train_total_s": train_total_s,
    }
    result = {"name": args.name, "steps": steps,
              "ru_maxrss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
              "versions": versions(), "config": config}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{args.name}.json").write_text(json.dumps(result, indent=1, default=str))
    print(f"RESULT {out / f'{args.name}.json'}: {len(steps)} steps, peak RSS {result['ru_maxrss_mb']:.0f} MB",
          flush=True)
    if len(steps) != args.max_steps:
        print(f"ERROR: {len(steps)} steps recorded, {args.max_steps} asked for", file=sys.stderr)
        return 1
    bad = [s["step"] for s in steps if not s["prompts_match"]]
    if bad:
        print(f"ERROR: TRL generated from other prompt ids than our trainer's at steps {bad}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
