"""The trainer wires the stages; `step` reads like the pseudocode in research/algorithm.md 2.12:

    rollout -> score -> (mentor: diagnose, instruct, guard, re-roll, assemble) -> advantages
            -> GRPO update -> weight sync
"""

from __future__ import annotations

import copy
import json
import math
import random
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

import numpy as np
import torch

from mentor_fast.algo.batch import build_train_batch
from mentor_fast.checkpoint import latest_checkpoint, load_trainer_state, save_checkpoint, set_rng_state
from mentor_fast.config import RunConfig, save_config, to_dict
from mentor_fast.data import PromptBuilder, PromptTooLong, build_source
from mentor_fast.metrics import MetricsLogger, peak_mem_gb, to_scalars, write_report
from mentor_fast.models import load_policy, load_tokenizer, resolve_device, resolve_model_path
from mentor_fast.rewards import RewardScorer
from mentor_fast.rollout import make_engine
from mentor_fast.rollout.base import Request, SamplingParams, generate_many
from mentor_fast.types import Group, Problem, Rollout, Sample
from mentor_fast.update import PolicyUpdater, build_optimizer

if TYPE_CHECKING:
    from mentor_fast.mentor.pipeline import Intervention, RerollRequest

# Metrics that depend on wall-clock or machine state, not on the computation.
TIMING_PREFIXES = ("timing_s/", "perf/", "mentor/latency_s", "mentor/overlap_frac")


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def sampling_seed(run_seed: int, step: int, stream: int = 0) -> int:
    """Sampling seeds are a pure function of (run seed, step, stream): a resumed run samples the same."""
    return (run_seed * 1_000_003 + step * 7919 + stream * 104_729) % (2**31 - 1)


class PendingHints(NamedTuple):
    """Async MENTOR: hints written in the background for step `step`'s all-fail groups."""

    interventions: list[Intervention]
    groups: list[Group]
    step: int
    wait_s: float  # how long the trainer waited for them


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
            ref_model=self.ref_model, seed=cfg.seed, transfer_is_cap=cfg.mentor.transfer_is_cap,
            shaping_gamma=cfg.mentor.shaping_gamma if cfg.mentor.loss_mode == "shaping" else None,
            distill_coef=cfg.mentor.distill_coef if cfg.mentor.enable else 0.0,
        )
        self.builder = PromptBuilder(self.tokenizer, cfg.data.system_prompt, cfg.data.max_prompt_tokens)
        self.source = build_source(cfg.data, cfg.seed)
        self.scorer = RewardScorer(cfg.reward)
        self.start_step = 0
        self.version = 0
        self._mentor_state = None
        if ckpt is not None:
            self._restore(ckpt)
        self.engine = make_engine(cfg.rollout, self.model, self.tokenizer, weights_path, cfg.model.dtype, cfg.seed)
        if self.version:
            self.engine.update_weights(self.model, self.version)
        self.mentor = None
        self._mentor_pool: ThreadPoolExecutor | None = None
        self._pending: tuple[Future, list[Group], int] | None = None  # async: hints for the last step
        if cfg.mentor.enable:
            from mentor_fast.mentor import Mentor

            self.mentor = Mentor.from_config(cfg.mentor, self.builder, engine=self.engine,
                                             tokenizer=self.tokenizer, seed=cfg.seed, device=str(self.device))
            # backend=self writes hints with the policy itself, so it cannot run beside the update.
            if cfg.mentor.async_ and cfg.mentor.backend != "self":
                self._mentor_pool = ThreadPoolExecutor(1, thread_name_prefix="mentor")
            if self._mentor_state is not None:
                self.mentor.load_state_dict(self._mentor_state["mentor"])
                pending = self._mentor_state.get("pending")
                if pending is not None:
                    done: Future = Future()
                    done.set_result(pending["interventions"])
                    self._pending = (done, pending["groups"], pending["step"])

    # ---------------------------------------------------------------- resume
    def _find_resume(self, resume) -> Path | None:
        if resume is None:
            return None
        if resume == "auto":
            return latest_checkpoint(self.out / "checkpoints")
        return Path(resume)

    def _restore(self, ckpt: Path) -> None:
        state = load_trainer_state(ckpt)
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.updater.generator.set_state(state["update_generator"])
        set_rng_state(state["rng"])
        self.start_step = state["step"]
        self.version = state["policy_version"]
        self._mentor_state = state.get("mentor")

    def save(self, step: int) -> Path:
        state = {
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "update_generator": self.updater.generator.get_state(),
            "policy_version": self.version,
            "data": {"source": self.cfg.data.source, "seed": self.cfg.seed, "next_step": step + 1},
        }
        if self.mentor is not None:
            pending = None
            if self._pending is not None:  # the mentor queue: hints written for the last step's failures
                future, groups, pstep = self._pending
                pending = {"interventions": future.result(), "groups": groups, "step": pstep}
            state["mentor"] = {"mentor": self.mentor.state_dict(), "pending": pending}
        return save_checkpoint(self.out / "checkpoints", step, self.model, self.tokenizer, state,
                               self.cfg.trainer.keep_last_n)

    # ---------------------------------------------------------------- the step
    def rollout(self, problems: list[Problem], step: int, metrics: dict,
                extra: list[Request] = ()) -> tuple[list[Group], list[list[list[Sample]]]]:
        """Generate G samples per prompt and score them. Prompts over the length limit are dropped.
        `extra` requests (the async mentor's first re-roll round) share the engine call; their
        samples come back unscored, in order."""
        kept, prompts = [], []
        for p in problems:
            try:
                prompts.append(self.builder.encode(p))
                kept.append(p)
            except PromptTooLong:
                metrics["data/dropped_long_prompts"] = metrics.get("data/dropped_long_prompts", 0) + 1
        t0 = time.perf_counter()
        horizon = self.cfg.mentor.reroll_horizon if extra else 0.0
        samples, *extra_samples = self.generate_many([(prompts, self.sampling(step)), *extra],
                                                     tag="initial+reroll" if extra else "initial",
                                                     horizon=horizon)
        metrics["timing_s/gen"] = time.perf_counter() - t0
        groups = []
        for g_idx, (p, ids, group_samples) in enumerate(zip(kept, prompts, samples)):
            rollouts = [
                Rollout(problem=p, group_id=step * 100_000 + g_idx, prompt_ids=ids, completion_ids=s.token_ids,
                        sampler_logprobs=s.logprobs, text=self.builder.decode_completion(s.token_ids),
                        finish_reason=s.finish_reason, policy_version=s.policy_version)
                for s in group_samples
            ]
            groups.append(Group(group_id=rollouts[0].group_id, problem=p, prompt_ids=ids, rollouts=rollouts))
        t0 = time.perf_counter()
        metrics.update(self.scorer.score([r for g in groups for r in g.rollouts]))
        metrics["timing_s/reward"] = time.perf_counter() - t0
        return groups, extra_samples

    def sampling(self, step: int, stream: int = 0) -> SamplingParams:
        """Initial rollouts and mentor re-rolls use the same sampling parameters (not the same seeds)."""
        r = self.cfg.rollout
        return SamplingParams(n=r.num_generations, max_new_tokens=r.max_new_tokens, temperature=r.temperature,
                              top_p=r.top_p, seed=sampling_seed(self.cfg.seed, step, stream))

    def generate_many(self, requests: list[Request], tag: str = "initial",
                      horizon: float = 0.0) -> list[list[list[Sample]]]:
        """Engines that count prefix-cache hits per phase (vLLM) get told which phase this is; a
        re-roll horizon (mentor.reroll_horizon, HF engine only) is passed when set."""
        kwargs = {"tag": tag} if hasattr(self.engine, "pop_metrics") else {}
        if horizon:
            kwargs["horizon"] = horizon
        return generate_many(self.engine, requests, **kwargs)

    def _reroll_generate(self, prompts, params):
        return self.generate_many([(prompts, params)], tag="reroll")[0]

    def _score(self, rollouts: list[Rollout]) -> None:
        self.scorer.score(rollouts)

    def _take_hints(self, metrics: dict) -> PendingHints | None:
        """Async: the hints written in the background for the last step's failures (waiting for them
        if need be); None when there are none, or when they are too stale to re-roll on-policy."""
        if self._pending is None:
            return None
        future, groups, step = self._pending
        self._pending = None
        t0 = time.perf_counter()
        interventions = future.result(timeout=self.cfg.mentor.timeout_s)
        wait_s = time.perf_counter() - t0
        lag = self.version - min(r.policy_version for g in groups for r in g.rollouts)
        if lag > self.cfg.mentor.max_staleness:  # too old to learn from on-policy: drop, and say so
            metrics["mentor/stale_dropped"] = float(len(interventions))
            return None
        return PendingHints(interventions, groups, step, wait_s)

    def mentor_step(self, groups: list[Group], step: int, metrics: dict, hints: PendingHints | None = None,
                    first: tuple[RerollRequest, list[list[Sample]]] | None = None) -> list[Group]:
        """MENTOR on the all-fail groups. Sync: diagnose, instruct, guard, re-roll and assemble now.
        Async: the hints for this step's failures are written in the background while the update
        runs; their re-rolls come from the next policy version and join the next step's batch
        (`hints`: the last step's, taken by `step`; `first`: their first round, already generated
        with this step's initial rollouts)."""
        cfg = self.cfg.mentor
        t0 = time.perf_counter()
        if not cfg.async_:
            out = self.mentor.intervene(groups, step, self._reroll_generate, self._score, self.sampling(step, 1),
                                        self.version)
            self._record_mentor(out, metrics)
            metrics["timing_s/mentor"] = time.perf_counter() - t0
            return out.groups
        carried: list[Group] = []
        if hints is not None:
            self.mentor.reroll(hints.interventions, self._reroll_generate, self._score,
                               self.sampling(hints.step, 1), self.version, first=first)
            out = self.mentor.finish(hints.groups, hints.interventions, hints.step)
            rescued = {iv.group.group_id for iv in hints.interventions if iv.rescued}
            carried = [g for g in out.groups if g.group_id in rescued]
            self._record_mentor(out, metrics)
            latency = metrics.get("mentor/latency_s", 0.0)
            metrics["mentor/overlap_frac"] = max(0.0, 1.0 - hints.wait_s / latency) if latency > 0 else 1.0
        metrics["off_policy/max_lag"] = float(max(
            (self.version - r.policy_version for g in carried for r in g.rollouts), default=0))
        if self._mentor_pool is not None:
            self._pending = (self._mentor_pool.submit(self.mentor.write_hints, groups, step), groups, step)
        else:  # backend=self: written now, on the trainer's thread
            done: Future = Future()
            done.set_result(self.mentor.write_hints(groups, step))
            self._pending = (done, groups, step)
        metrics["timing_s/mentor"] = time.perf_counter() - t0
        return groups + carried

    def _record_mentor(self, out, metrics: dict) -> None:
        metrics.update(out.metrics)
        if out.dump_rows:
            with (self.out / "mentor.jsonl").open("a") as f:
                for row in out.dump_rows:
                    f.write(json.dumps(row, default=str) + "\n")

    def step(self, step: int) -> dict[str, float]:
        cfg = self.cfg
        t_step = time.perf_counter()
        metrics: dict = {}
        problems = self.source.batch(step, cfg.rollout.prompts_per_step)
        hints = self._take_hints(metrics) if self.mentor is not None and cfg.mentor.async_ else None
        request = None
        if hints is not None and cfg.mentor.merge_rerolls:
            request = self.mentor.first_round(hints.interventions, self.sampling(hints.step, 1))
            rows = len(request.prompts) * request.params.n
            metrics["mentor/merged_rerolls"] = float(rows)
            if cfg.mentor.reroll_budget == "shared":  # the re-rolls take the rows of the last prompts
                skip = min(math.ceil(rows / cfg.rollout.num_generations), len(problems) - 1)
                problems = problems[: len(problems) - skip]
                metrics["mentor/prompts_skipped"] = float(skip)
        extra_requests = [(request.prompts, request.params)] if request else []
        groups, extra = self.rollout(problems, step, metrics, extra_requests)
        metrics.update(group_metrics(groups))  # the initial rollouts, before the mentor
        if self.mentor is not None:
            groups = self.mentor_step(groups, step, metrics, hints, (request, extra[0]) if request else None)
        batch = build_train_batch(groups, cfg.advantage)
        metrics.update(batch_metrics(batch))
        if batch.num_seqs == 0:  # every prompt was dropped: nothing to learn from, say so and go on
            metrics["trainer/skipped_step"] = 1.0
            metrics["timing_s/step"] = time.perf_counter() - t_step
            return to_scalars(metrics)

        t0 = time.perf_counter()
        old_logp = None
        if cfg.trainer.ppo_epochs > 1 or cfg.trainer.mini_batches > 1:
            old_logp = self.updater.logprobs(self.model, batch, self.updater.trainable(batch))
        metrics["timing_s/old_logprob"] = time.perf_counter() - t0

        t0 = time.perf_counter()
        metrics.update(self.updater.update(batch, old_logp, self.version))
        metrics["timing_s/update"] = time.perf_counter() - t0
        self.version += 1
        t0 = time.perf_counter()
        self.engine.update_weights(self.model, self.version)
        metrics["timing_s/weight_sync"] = time.perf_counter() - t0
        if hasattr(self.engine, "pop_metrics"):
            metrics.update(self.engine.pop_metrics())

        metrics["timing_s/step"] = time.perf_counter() - t_step
        metrics["perf/tokens_per_s"] = float(batch.completion_lens.sum()) / metrics["timing_s/step"]
        metrics["perf/peak_mem_gb"] = peak_mem_gb()
        return to_scalars(metrics)

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
        if self._mentor_pool is not None:
            self._mentor_pool.shutdown(wait=True)
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


def batch_metrics(batch) -> dict[str, float]:
    """signal_yield: the share of generated tokens whose advantage is non-zero (i.e. that teach)."""
    lens = batch.completion_lens.double()
    total = float(lens.sum())
    useful = float((lens * (batch.advantages != 0).double()).sum())
    return {"signal_yield": useful / total if total else 0.0, "batch/tokens": total,
            "batch/sequences": float(batch.num_seqs)}
