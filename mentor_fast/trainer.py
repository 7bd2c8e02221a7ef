"""The trainer wires the stages; `step` reads like the pseudocode in research/algorithm.md 2.12:

    rollout -> score -> method (MENTOR: diagnose, instruct, guard, re-roll, assemble)
            -> advantages -> GRPO update -> weight sync

The trainer knows no method: MENTOR (or none, vanilla GRPO) is called at fixed points through
mentor_fast/method.py, and whatever it wants done to a sequence arrives as data on the rollouts.
"""

from __future__ import annotations

import contextlib
import copy
import random
import time
from pathlib import Path

import numpy as np
import torch

from mentor_fast.algo.batch import TrainBatch, build_train_batch
from mentor_fast.checkpoint import latest_checkpoint, load_trainer_state, save_checkpoint, set_rng_state
from mentor_fast.config import RunConfig, save_config, to_dict
from mentor_fast.data import PromptBuilder, PromptTooLong, build_source
from mentor_fast.method import Method, NoMethod, RolloutPlan
from mentor_fast.metrics import MetricsLogger, peak_mem_gb, to_scalars, write_report
from mentor_fast.models import load_policy, load_tokenizer, resolve_device, resolve_model_path
from mentor_fast.rewards import RewardScorer
from mentor_fast.rollout import make_engine
from mentor_fast.rollout.base import SamplingParams
from mentor_fast.types import Group, Rollout, Sample
from mentor_fast.update import PolicyUpdater, build_optimizer

# Metrics that depend on wall-clock or machine state, not on the computation.
TIMING_PREFIXES = ("timing_s/", "perf/", "mentor/latency_s", "mentor/reroll_s", "mentor/overlap_frac")


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def sampling_seed(run_seed: int, step: int, stream: int = 0) -> int:
    """Sampling seeds are a pure function of (run seed, step, stream): a resumed run samples the same."""
    return (run_seed * 1_000_003 + step * 7919 + stream * 104_729) % (2**31 - 1)


class StepTimer:
    """Wall seconds of a step's stages, as `timing_s/<stage>` metrics."""

    def __init__(self) -> None:
        self.metrics: dict[str, float] = {}

    @contextlib.contextmanager
    def __call__(self, stage: str):
        t0 = time.perf_counter()
        try:
            yield
        finally:
            key = f"timing_s/{stage}"
            self.metrics[key] = self.metrics.get(key, 0.0) + time.perf_counter() - t0


class Trainer:
    def __init__(self, cfg: RunConfig, resume: str | Path | None = None):
        self.cfg = cfg
        self.out = Path(cfg.output_dir)
        self.out.mkdir(parents=True, exist_ok=True)
        save_config(cfg, self.out / "config.yaml")
        if cfg.trainer.threads > 0:
            torch.set_num_threads(cfg.trainer.threads)
        seed_everything(cfg.seed)

        self.model_path = resolve_model_path(cfg.model.path)
        ckpt = self._find_resume(resume)
        weights_path = ckpt / "policy" if ckpt else self.model_path
        self.tokenizer = load_tokenizer(self.model_path)
        self.device = resolve_device(cfg.model.device)
        self.model = load_policy(weights_path, cfg.model.dtype, cfg.model.attn_implementation).to(self.device)
        if cfg.model.gradient_checkpointing:
            self.model.gradient_checkpointing_enable()
        self.model.train()
        self.ref_model = None
        if cfg.model.ref_model and cfg.loss.beta > 0:
            self.ref_model = copy.deepcopy(self.model).eval().requires_grad_(False)

        self.optimizer, self.scheduler = build_optimizer(self.model, cfg.optim, cfg.trainer.max_steps)
        self.updater = PolicyUpdater(
            self.model, self.optimizer, self.scheduler, cfg.loss, cfg.trainer, cfg.optim,
            temperature=cfg.rollout.temperature, max_new_tokens=cfg.rollout.max_new_tokens,
            pad_id=self.tokenizer.pad_token_id, autocast_bf16=cfg.model.autocast_bf16,
            ref_model=self.ref_model, seed=cfg.seed,
        )
        self.builder = PromptBuilder(self.tokenizer, cfg.data.system_prompt, cfg.data.max_prompt_tokens)
        self.source = build_source(cfg.data, cfg.seed)
        self.scorer = RewardScorer(cfg.reward)
        self.start_step = 0
        self.version = 0
        method_state = None
        if ckpt is not None:
            method_state = self._restore(ckpt)
        self.engine = make_engine(cfg.rollout, self.model, self.tokenizer, weights_path, cfg.model.dtype, cfg.seed)
        if self.version:
            self.engine.update_weights(self.model, self.version)
        self.method: Method = self._build_method()
        self.method.load_state_dict(method_state)

    def _build_method(self) -> Method:
        cfg = self.cfg
        if not cfg.mentor.enable:
            return NoMethod()
        from mentor_fast.mentor import Mentor, MentorMethod

        mentor = Mentor.from_config(cfg.mentor, self.builder, engine=self.engine, tokenizer=self.tokenizer,
                                    seed=cfg.seed, device=str(self.device))
        return MentorMethod(cfg.mentor, mentor, self.engine, self.scorer.score, self.sampling,
                            cfg.rollout.num_generations, self.out / "mentor.jsonl")

    # ---------------------------------------------------------------- resume
    def _find_resume(self, resume) -> Path | None:
        if resume is None:
            return None
        if resume == "auto":
            return latest_checkpoint(self.out / "checkpoints")
        return Path(resume)

    def _restore(self, ckpt: Path):
        """Optimizer, schedule, RNGs and position from `ckpt`; returns the method's saved state."""
        state = load_trainer_state(ckpt)
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.updater.generator.set_state(state["update_generator"])
        set_rng_state(state["rng"])
        self.start_step = state["step"]
        self.version = state["policy_version"]
        return state.get("method", state.get("mentor"))  # "mentor": checkpoints written before the plug-in

    def save(self, step: int) -> Path:
        state = {
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "update_generator": self.updater.generator.get_state(),
            "policy_version": self.version,
            "data": {"source": self.cfg.data.source, "seed": self.cfg.seed, "next_step": step + 1},
            "method": self.method.state_dict(),
        }
        return save_checkpoint(self.out / "checkpoints", step, self.model, self.tokenizer, state,
                               self.cfg.trainer.keep_last_n)

    # ---------------------------------------------------------------- the step
    def step(self, step: int) -> dict[str, float]:
        """rollout -> score -> method -> advantages -> update -> weight sync."""
        timer, metrics = StepTimer(), {}
        with timer("step"):
            plan = self.method.before_rollout(step, self.source.batch(step, self.cfg.rollout.prompts_per_step),
                                              self.version)
            groups, rider_samples = self.rollout(plan, step, timer, metrics)
            with timer("reward"):
                metrics.update(self.scorer.score([r for g in groups for r in g.rollouts]))
            metrics.update(plan.metrics | group_metrics(groups))  # the initial rollouts, before the method
            with timer("mentor"):
                groups, method_metrics = self.method.after_score(step, groups, rider_samples, self.version)
            batch = build_train_batch(groups, self.cfg.advantage)
            metrics.update(method_metrics | batch_metrics(batch))
            if batch.num_seqs == 0:  # every prompt was dropped: nothing to learn from, say so and go on
                metrics["trainer/skipped_step"] = 1.0
            else:
                with timer("update"):
                    metrics.update(self.updater.update(batch, self.version))
                self.version += 1
                with timer("weight_sync"):
                    self.engine.update_weights(self.model, self.version)
                metrics.update(self.engine.pop_metrics())
        metrics = timer.metrics | metrics  # an engine's own timing_s/weight_sync wins
        metrics["perf/tokens_per_s"] = float(batch.completion_lens.sum()) / metrics["timing_s/step"]
        metrics["perf/peak_mem_gb"] = peak_mem_gb()
        return to_scalars(metrics)

    def rollout(self, plan: RolloutPlan, step: int, timer: StepTimer,
                metrics: dict) -> tuple[list[Group], list[list[list[Sample]]]]:
        """G samples of each prompt of the plan (prompts over the length limit are dropped and
        counted), unscored, and the riders' samples from the same engine call."""
        kept, prompts = [], []
        for p in plan.problems:
            try:
                prompts.append(self.builder.encode(p))
                kept.append(p)
            except PromptTooLong:
                metrics["data/dropped_long_prompts"] = metrics.get("data/dropped_long_prompts", 0) + 1
        with timer("gen"):
            samples, *rider_samples = self.engine.generate_many(
                [(prompts, self.sampling(step)), *plan.riders], tag="initial+reroll" if plan.riders else "initial",
                horizon=plan.horizon if plan.riders else 0.0)
        groups = []
        for g_idx, (p, ids, group_samples) in enumerate(zip(kept, prompts, samples)):
            rollouts = [
                Rollout(problem=p, group_id=step * 100_000 + g_idx, prompt_ids=ids, completion_ids=s.token_ids,
                        sampler_logprobs=s.logprobs, text=self.builder.decode_completion(s.token_ids),
                        finish_reason=s.finish_reason, policy_version=s.policy_version)
                for s in group_samples
            ]
            groups.append(Group(group_id=rollouts[0].group_id, problem=p, prompt_ids=ids, rollouts=rollouts))
        return groups, rider_samples

    def sampling(self, step: int, stream: int = 0) -> SamplingParams:
        """Initial rollouts and mentor re-rolls use the same sampling parameters (not the same seeds)."""
        r = self.cfg.rollout
        return SamplingParams(n=r.num_generations, max_new_tokens=r.max_new_tokens, temperature=r.temperature,
                              top_p=r.top_p, seed=sampling_seed(self.cfg.seed, step, stream))

    def fit(self) -> Path:
        cfg = self.cfg
        logger = MetricsLogger(self.out, cfg.trainer.tensorboard, cfg.trainer.wandb, to_dict(cfg),
                               cfg.trainer.max_steps, cfg.trainer.progress, self.start_step)
        try:
            for step in range(self.start_step + 1, cfg.trainer.max_steps + 1):
                row = self.step(step)
                if cfg.trainer.eval_every and step % cfg.trainer.eval_every == 0:
                    row.update(self.evaluate(step))
                if step % cfg.trainer.log_every == 0 or step == cfg.trainer.max_steps:
                    logger.log(step, row)
                if cfg.trainer.save_every and step % cfg.trainer.save_every == 0:
                    self.save(step)
            last = cfg.trainer.max_steps
            if self.start_step < last and not (cfg.trainer.save_every and last % cfg.trainer.save_every == 0):
                self.save(last)
        finally:
            logger.close()
            self.close()
        write_report(self.out / "metrics.jsonl", self.out / "report.png", title=str(self.out.name))
        return self.out

    def evaluate(self, step: int) -> dict[str, float]:
        """Held-out sampled pass@1 of the current policy, prompts without hints (trainer.eval_every)."""
        from mentor_fast.evaluate import evaluate

        t0 = time.perf_counter()
        r = self.cfg.rollout
        summary = evaluate(
            self.engine, self.builder, self.scorer.verifier.verify_batch, self.source.eval_problems(),
            n=self.cfg.trainer.eval_n, ks=[1], temperature=r.temperature, top_p=r.top_p,
            max_new_tokens=r.max_new_tokens, seed=sampling_seed(self.cfg.seed, step, 2),
            out_jsonl=self.out / "eval" / f"step_{step:06d}.jsonl",
        )
        return {"eval/pass@1": summary["pass@1"], "eval/truncated_frac": summary["truncated_frac"],
                "eval/count": float(summary["count"]), "timing_s/eval": time.perf_counter() - t0}

    def close(self) -> None:
        self.method.close()
        self.scorer.close()
        self.engine.close()


def group_metrics(groups: list[Group]) -> dict[str, float]:
    """Metrics of the initial (unhinted) rollouts."""
    rollouts = [r for g in groups for r in g.rollouts]
    if not rollouts:
        return {"groups/count": 0.0}
    n = len(groups)
    return {
        "reward/mean": float(np.mean([r.reward for r in rollouts])),
        "reward/std": float(np.std([r.reward for r in rollouts])),
        "acc": float(np.mean([r.correct for r in rollouts])),
        "groups/count": float(n),
        "groups/all_fail_frac": sum(g.all_fail for g in groups) / n,
        "groups/all_pass_frac": sum(g.all_pass for g in groups) / n,
        "response_length/mean": float(np.mean([len(r.completion_ids) for r in rollouts])),
        "response_length/max": float(max(len(r.completion_ids) for r in rollouts)),
        "response_length/clip_frac": float(np.mean([r.truncated for r in rollouts])),
    }


def batch_metrics(batch: TrainBatch) -> dict[str, float]:
    """signal_yield: the share of generated tokens whose advantage is non-zero (i.e. that teach)."""
    lens = batch.completion_lens.double()
    total = float(lens.sum())
    useful = float((lens * (batch.advantages != 0).double()).sum())
    return {"signal_yield": useful / total if total else 0.0, "batch/tokens": total,
            "batch/sequences": float(batch.num_seqs)}
