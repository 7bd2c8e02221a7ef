"""The trainer wires the stages; `step` reads as the algorithm does:

    rollout -> score -> method (MENTOR: diagnose, instruct, guard, re-roll, assemble)
            -> advantages -> GRPO update -> weight sync

The trainer knows no method: MENTOR (or none, vanilla GRPO) is called at fixed points through
mentor_fast/method.py, and whatever it wants done to a sequence arrives as data on the rollouts.

Across ranks (torchrun; mentor_fast/dist.py) each rank takes whole groups: rank r of W trains on
prompts [r P/W, (r+1) P/W) of the step's P, with its own engine. Sampling streams are keyed by
the global prompt index, so a run draws the same rollouts on any number of ranks. The policy is
sharded by FSDP2 (sharding.py); the update's normaliser, the metrics and the mentor's scheduler
are global. Rank 0 writes the logs; every rank writes its part of a checkpoint.
"""

from __future__ import annotations

import contextlib
import dataclasses
import random
import time
from pathlib import Path

import numpy as np
import torch

from mentor_fast.algo.batch import build_train_batch
from mentor_fast.checkpoint import (
    latest_checkpoint,
    load_optimizer,
    load_rank_state,
    load_trainer_state,
    save_checkpoint,
    saved_ranks,
    set_rng_state,
)
from mentor_fast.config import RunConfig, resolve, save_config, to_dict
from mentor_fast.config.schema import GROUPS_PER_STEP
from mentor_fast.data import PromptBuilder, PromptTooLong, build_source
from mentor_fast.determinism import deterministic_algorithms, wanted
from mentor_fast.dist import Dist, RankFailure
from mentor_fast.kernels import GRPOOptions
from mentor_fast.method import Method, MethodContext, RolloutPlan, build_method, timing_metrics
from mentor_fast.metrics import (
    MetricsLogger,
    batch_metrics,
    group_metrics,
    peak_mem_gb,
    reduce_metrics,
    to_scalars,
    write_report,
)
from mentor_fast.models import (
    ModelError,
    load_tokenizer,
    resolve_device,
    resolve_model_path,
)
from mentor_fast.policies import build_policies
from mentor_fast.rewards import RewardScorer
from mentor_fast.rollout import engine_dtype, make_engine
from mentor_fast.rollout.base import SamplingParams
from mentor_fast.types import Group, Rollout, Sample
from mentor_fast.update import PolicyUpdater, build_optimizer

# Metrics that depend on wall-clock or machine state, not on the computation.
TIMING_PREFIXES = ("timing_s/", "perf/", *timing_metrics())


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def sampling_seed(run_seed: int, step: int, stream: int = 0) -> int:
    """Sampling seeds are a pure function of (run seed, step, stream): a resumed run samples the same."""
    return (run_seed * 1_000_003 + step * 7919 + stream * 104_729) % (2**31 - 1)


class StepTimer:
    """Wall seconds of a step's stages, as `timing_s/<stage>` metrics. On a GPU each stage ends with a
    device synchronize: the update queues its work without waiting for it, and its time would otherwise
    land in whichever later stage first reads a result (one wait per stage, a few per step)."""

    def __init__(self) -> None:
        self.metrics: dict[str, float] = {}

    @contextlib.contextmanager
    def __call__(self, stage: str):
        t0 = time.perf_counter()
        try:
            yield
        finally:
            if torch.cuda.is_initialized():  # never true on a CPU machine
                torch.cuda.synchronize()
            key = f"timing_s/{stage}"
            self.metrics[key] = self.metrics.get(key, 0.0) + time.perf_counter() - t0


class Trainer:
    def __init__(self, cfg: RunConfig, resume: str | Path | None = None, rows: list | None = None):
        """rows: data.source=dataset's rows (the Python API's train_dataset)."""
        resolve(cfg)  # a config built in code, not by load_config, still gets its derived defaults
        self.cfg = cfg
        if cfg.trainer.threads > 0:
            torch.set_num_threads(cfg.trainer.threads)
        self.dist = Dist.from_env(resolve_device(cfg.model.device), cfg.dist.timeout_s, cfg.trainer.threads)
        self.out = Path(cfg.output_dir)
        if self.dist.is_main:
            self.out.mkdir(parents=True, exist_ok=True)
            save_config(cfg, self.out / "config.yaml")
        self.dist.barrier()
        seed_everything(cfg.seed)
        self.shard = self.dist.shard(cfg.rollout.prompts_per_step)  # this rank's [start, stop) of the prompts

        self.model_path = resolve_model_path(cfg.model.path)
        ckpt = self._find_resume(resume)
        lora = cfg.model.lora.rank > 0
        if lora and self.dist.enabled:
            raise ModelError("model.lora.rank > 0 trains on one rank for now (LoRA under FSDP2 is not built); "
                             "run without --nproc, or set model.lora.rank=0")
        # with LoRA a checkpoint holds only the adapter: the base weights come from model.path
        weights_path = ckpt / "policy" if ckpt and not lora else self.model_path
        self.tokenizer = load_tokenizer(self.model_path)
        self.device = self.dist.device
        self._settings = contextlib.ExitStack()  # process-wide torch settings of the run, undone by close()
        self._settings.enter_context(deterministic_algorithms(wanted(cfg.trainer.deterministic, self.device)))
        if self.device.type == "cuda" and cfg.model.tf32:
            torch.set_float32_matmul_precision("high")  # TF32 tensor cores for what stays fp32
        policies = build_policies(cfg, self.dist, weights_path, adapter=ckpt / "policy" if ckpt and lora else None)
        self.model, self.policy, self.weights = policies.model, policies.policy, policies.weights
        self.ref_model = policies.ref_model

        self.optimizer, self.scheduler = build_optimizer(self.policy, cfg.optim, cfg.trainer.max_steps)
        loss = GRPOOptions.of(cfg.loss, temperature=cfg.rollout.temperature,
                              compute_dtype=torch.bfloat16 if cfg.model.autocast_bf16 else None,
                              max_completion_len=cfg.rollout.max_new_tokens)
        self.updater = PolicyUpdater(self.policy, self.optimizer, self.scheduler, loss, cfg.trainer, cfg.optim,
                                     pad_id=self.tokenizer.pad_token_id, ref_model=self.ref_model, seed=cfg.seed,
                                     dist=self.dist, checkpointing=cfg.model.gradient_checkpointing)
        self.builder = PromptBuilder(self.tokenizer, cfg.data.system_prompt, cfg.data.max_prompt_tokens)
        self.source = build_source(cfg.data, cfg.seed, rows)
        self.scorer = RewardScorer(cfg.reward, messages=self.builder.chat, max_new_tokens=cfg.rollout.max_new_tokens,
                                   task=cfg.task)
        if self.dist.is_main:
            print(f"reward: {self.scorer.verifier.describe()}", flush=True)
        self.start_step = 0
        self.policy_version = 0
        self._regroup: list | None = None
        self._warned_short = False
        self.last_metrics: dict[str, float] = {}  # the last step's row (what the Python API's train() returns)
        method_state = None
        if ckpt is not None:
            method_state = self._restore(ckpt)
        self.engine = make_engine(cfg.rollout, policies.engine_model, self.tokenizer, weights_path, engine_dtype(cfg),
                                  cfg.seed, owns_weights=policies.engine_owns_weights, lora_rank=cfg.model.lora.rank)
        if self.policy_version or self.engine.policy_version != self.policy_version:  # resumed, or a server's other weights
            self.engine.update_weights(self.weights, self.policy_version)
        self.method: Method = self._build_method()
        if self._regroup is not None:  # resumed on another number of ranks
            method_state = self.method.regroup(self._regroup, self._holds)
        self.method.load_state_dict(method_state)

    def _build_method(self) -> Method:
        return build_method(MethodContext(
            cfg=self.cfg, engine=self.engine, tokenizer=self.tokenizer, builder=self.builder, score=self.scorer.score,
            sampling=self.sampling, num_generations=self.cfg.rollout.num_generations, out=self.out, dist=self.dist,
            device=str(self.device)))

    # ---------------------------------------------------------------- resume
    def _find_resume(self, resume) -> Path | None:
        if resume is None:
            return None
        if resume == "auto":
            return latest_checkpoint(self.out / "checkpoints")
        return Path(resume)

    def _restore(self, ckpt: Path):
        """Optimizer, schedule, RNGs and position from `ckpt`; returns the method's saved state.

        On the number of ranks that wrote it, every rank gets back exactly its own state. On
        another number the weights, optimizer, schedule and position are exact (the sampling
        streams do not depend on the ranks); each rank's update generator and RNGs start from
        rank 0's, and hints in flight go to the rank that now holds their group."""
        state = load_trainer_state(ckpt)
        load_optimizer(ckpt, self.policy, self.optimizer, self.dist)
        self.scheduler.load_state_dict(state["scheduler"])
        self.start_step = state["step"]
        self.policy_version = state["policy_version"]
        same = state.get("world_size", 1) == self.dist.world_size
        mine = load_rank_state(ckpt, self.dist.rank if same else 0)
        self.updater.generator.set_state(mine["update_generator"])
        set_rng_state(mine["rng"])
        if not same:
            self._regroup = [r["method"] for r in saved_ranks(ckpt)]
        return mine["method"]

    def _holds(self, group_id: int) -> bool:
        """Whether this rank holds the group (an id is step * GROUPS_PER_STEP + global prompt index)."""
        start, stop = self.shard
        return start <= group_id % GROUPS_PER_STEP < stop

    def save(self, step: int) -> Path:
        state = {
            "scheduler": self.scheduler.state_dict(),
            "policy_version": self.policy_version,
        }
        rank_state = {"update_generator": self.updater.generator.get_state(), "method": self.method.state_dict()}
        return save_checkpoint(self.out / "checkpoints", step, policy=self.policy, optimizer=self.optimizer,
                               tokenizer=self.tokenizer, state=state, rank_state=rank_state,
                               keep_last_n=self.cfg.trainer.keep_last_n, dist=self.dist)

    # ---------------------------------------------------------------- the step
    def step(self, step: int) -> dict[str, float]:
        """rollout -> score -> method -> advantages -> update -> weight sync."""
        timer, metrics = StepTimer(), {}
        with timer("step"):
            plan = self.method.before_rollout(step, self.problems(step), self.policy_version)
            groups, rider_samples = self.rollout(plan, step, timer, metrics)
            with timer("reward"):
                metrics.update(self.scorer.score([r for g in groups for r in g.rollouts]))
            initial = group_metrics(groups, self.dist)  # the initial rollouts, before the method
            with timer("mentor"):
                groups, method_metrics = self.method.after_score(step, groups, rider_samples, self.policy_version)
            sampled = {}
            if self.cfg.rollout.dynamic_sampling:  # after the method: it takes its all-fail groups first
                groups, sampled = self.keep_groups_with_signal(step, groups, timer)
            batch = build_train_batch(groups, self.cfg.advantage)
            metrics.update(plan.metrics | method_metrics)
            learned = batch_metrics(batch, self.dist)
            if learned["batch/sequences"] == 0:  # every prompt was dropped: nothing to learn from, say so and go on
                metrics["trainer/skipped_step"] = 1.0
            else:
                self.engine.sleep()  # colocated vLLM with sleep mode: the update gets its memory
                with timer("update"):
                    learned.update(self.updater.update(batch, self.policy_version))  # reduced over ranks already
                self.policy_version += 1
                with timer("weight_sync"):
                    self.engine.update_weights(self.weights, self.policy_version)
                metrics.update(self.engine.pop_metrics())
        metrics = timer.metrics | metrics  # an engine's own timing_s/weight_sync wins
        metrics["perf/peak_mem_gb"] = peak_mem_gb()
        row = reduce_metrics(self.dist, to_scalars(metrics), self.method.metrics) | initial | sampled | to_scalars(learned)
        row["perf/tokens_per_s"] = row["batch/tokens"] / row["timing_s/step"]
        if "timing_s/weight_sync" in row:
            row["perf/weight_sync_frac"] = row["timing_s/weight_sync"] / row["timing_s/step"]
        return row

    def problems(self, step: int) -> list:
        """This rank's share of the step's prompts."""
        start, stop = self.shard
        return self.source.batch(step, self.cfg.rollout.prompts_per_step)[start:stop]

    def keep_groups_with_signal(self, step: int, groups: list[Group],
                                timer: StepTimer) -> tuple[list[Group], dict[str, float]]:
        """Dynamic sampling (rollout.dynamic_sampling): drops the groups whose rewards are all equal
        and draws prompts_per_step more prompts a round (the source's round k of the step) until
        prompts_per_step groups with a signal are kept, or dynamic_sampling_rounds rounds are spent.
        Whether to go on is decided on the global count, so every rank joins every round's
        collectives whatever it keeps; the last round's surplus is cut in global prompt order, so
        the kept groups are the same on any number of ranks. Returns the groups and the run's
        dynamic_sampling/* metrics (global already; extra_tokens: what the extra rounds decoded)."""
        r, dist = self.cfg.rollout, self.dist
        want = r.prompts_per_step
        kept = [g for g in groups if g.has_signal]
        seen, have = (int(x) for x in dist.sum([len(groups), len(kept)]))  # over ranks
        drawn, rounds, tokens = want, 0, 0
        while have < want and rounds < r.dynamic_sampling_rounds:
            rounds += 1
            start, stop = self.shard
            problems = self.source.batch(step, want, round=rounds)[start:stop]
            new, _ = self.rollout(RolloutPlan(problems), step, timer, {}, round=rounds)
            with timer("reward"):
                self.scorer.score([x for g in new for x in g.rollouts])
            mine = [g for g in new if g.has_signal]
            decoded = sum(len(x.completion_ids) for g in new for x in g.rollouts)
            # the round's groups with a signal by rank, in rank (= prompt) order, then the groups and
            # tokens it drew: rank q keeps what the ranks before it leave of the groups still wanted
            *by_rank, n_new, n_tokens = (int(x) for x in dist.sum(
                [len(mine) if q == dist.rank else 0 for q in range(dist.world_size)] + [len(new), decoded]))
            seen, tokens = seen + n_new, tokens + n_tokens
            kept += mine[:max(0, want - have - sum(by_rank[:dist.rank]))]
            drawn += want
            have = min(want, have + sum(by_rank))
        if have < want and dist.is_main and not self._warned_short:
            self._warned_short = True
            print(f"step {step}: dynamic sampling kept {int(have)} of {want} groups after "
                  f"{r.dynamic_sampling_rounds} extra rounds; the step trains on those "
                  "(dynamic_sampling/short counts it every step; said once)", flush=True)
        return kept, {"dynamic_sampling/rounds": float(rounds), "dynamic_sampling/prompts_drawn": float(drawn),
                      "dynamic_sampling/groups_kept": float(have),
                      "dynamic_sampling/discarded_frac": 1.0 - have / seen if seen else 0.0,
                      "dynamic_sampling/short": float(max(0, want - have)),
                      "dynamic_sampling/extra_tokens": float(tokens)}

    def rollout(self, plan: RolloutPlan, step: int, timer: StepTimer,
                metrics: dict, round: int = 0) -> tuple[list[Group], list[list[list[Sample]]]]:
        """G samples of each prompt of the plan (prompts over the length limit are dropped and
        counted), unscored, and the riders' samples from the same engine call. A prompt's group id
        and sampling stream are keyed by its global index (round * prompts_per_step + its place in
        the round: dynamic sampling's rounds), the same on any number of ranks."""
        kept, prompts, index = [], [], []
        first = round * self.cfg.rollout.prompts_per_step + self.shard[0]
        for i, p in enumerate(plan.problems):
            try:
                prompts.append(self.builder.encode(p))
                kept.append(p)
                index.append(first + i)
            except PromptTooLong:
                metrics["data/dropped_long_prompts"] = metrics.get("data/dropped_long_prompts", 0) + 1
        params = dataclasses.replace(self.sampling(step), keys=tuple(index))
        with timer("gen"):
            samples, *rider_samples = self.engine.generate_many(
                [(prompts, params), *plan.riders], tag="initial+riders" if plan.riders else "initial")
        groups = []
        for g_idx, p, ids, group_samples in zip(index, kept, prompts, samples):
            rollouts = [Rollout.from_sample(p, step * GROUPS_PER_STEP + g_idx, ids, s,
                                            self.builder.decode_completion(s.token_ids)) for s in group_samples]
            groups.append(Group(group_id=rollouts[0].group_id, problem=p, prompt_ids=ids, rollouts=rollouts))
        return groups, rider_samples

    def sampling(self, step: int, stream: int = 0) -> SamplingParams:
        """Initial rollouts and mentor re-rolls use the same sampling parameters (not the same seeds)."""
        r = self.cfg.rollout
        return SamplingParams(n=r.num_generations, max_new_tokens=r.max_new_tokens, temperature=r.temperature,
                              top_p=r.top_p, seed=sampling_seed(self.cfg.seed, step, stream))

    def fit(self) -> Path:
        cfg, main = self.cfg, self.dist.is_main
        logger = (MetricsLogger(self.out, cfg.trainer.tensorboard, cfg.trainer.wandb, to_dict(cfg),
                                cfg.trainer.max_steps, cfg.trainer.progress, self.start_step) if main else None)
        step = self.start_step
        try:
            for step in range(self.start_step + 1, cfg.trainer.max_steps + 1):
                self._mark(step)
                row = self.step(step)
                if cfg.trainer.eval_every and step % cfg.trainer.eval_every == 0:
                    row.update(self.evaluate(step))
                self.last_metrics = row
                if logger and (step % cfg.trainer.log_every == 0 or step == cfg.trainer.max_steps):
                    logger.log(step, row)
                if cfg.trainer.save_every and step % cfg.trainer.save_every == 0:
                    self.save(step)
            last = cfg.trainer.max_steps
            if self.start_step < last and not (cfg.trainer.save_every and last % cfg.trainer.save_every == 0):
                self.save(last)
        except Exception as e:
            if self.dist.enabled:  # name the rank and the step; torchrun stops the other ranks
                raise RankFailure(f"rank {self.dist.rank} of {self.dist.world_size} failed at step {step}: "
                                  f"{type(e).__name__}: {e}") from e
            raise
        finally:
            if logger:
                logger.close()
            self.close()
        if main:
            write_report(self.out / "metrics.jsonl", self.out / "report.png", title=str(self.out.name))
        return self.out

    def _mark(self, step: int) -> None:
        """Across ranks: the step this rank is in, in OUTPUT_DIR/ranks/ (what `mentor-fast train
        --nproc` reports when a rank dies without a word, e.g. killed)."""
        if self.dist.enabled:
            folder = self.out / "ranks"
            folder.mkdir(exist_ok=True)
            (folder / f"rank_{self.dist.rank}.step").write_text(f"{step}\n")

    def evaluate(self, step: int) -> dict[str, float]:
        """Held-out sampled pass@1 of the current policy, prompts without hints (trainer.eval_every);
        on rank 0, from its engine (the others go on to the next step's collectives)."""
        from mentor_fast.evaluate import evaluate

        if not self.dist.is_main:
            return {}
        t0 = time.perf_counter()
        r = self.cfg.rollout
        summary = evaluate(
            self.engine, self.builder, self.scorer.verifier.check, self.source.eval_problems(),
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
        self.dist.close()
        self._settings.close()
