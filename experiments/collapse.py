#!/usr/bin/env python
"""Zero-reward collapse and recovery: GRPO, two baselines and MENTOR through a sudden difficulty jump.

    .venv/bin/python experiments/collapse.py --seeds 2 --out runs/collapse
    .venv/bin/python experiments/collapse.py --task code --seeds 2 --out runs/collapse_code

Per seed: (0) a short supervised warm-up on worked solutions of the easy levels (see sft_warmup:
the embedded model cannot do the ladder at all without it); (1) a shared GRPO warm-up on the easy
levels (vanilla GRPO; no method has anything to do there), saved as the common start; (2) from
that start, the same number of post-jump steps on the jumped level for every arm (same seed, so
the same prompts and sampling seeds for the initial rollouts); (3) each final policy is evaluated
on held-out problems of the jumped level without hints.

The arms (ARMS; --arms, all by default): vanilla GRPO; dynamic_sampling (re-samples groups
without signal, --ds-rounds); scaf (Scaf-GRPO's static tiered hints, on MENTOR's re-roll budget)
and luffy (LUFFY's worked solution in place of a rollout, on MENTOR's trigger); mentor; and two
ablations, mentor_no_diagnosis (the hint writer never sees the failed attempts) and
mentor_no_distill (no self-distillation). --mentor-set applies to the three mentor arms.

As each arm of each seed finishes it is merged into the results file (--results, default
experiments/results/baselines_math.json or baselines_code.json; a table and a figure from it:
experiments/baselines_report.py), so a run cut short loses nothing, and written to
DIR/seedN/ARM/arm_summary.json. An arm saves a checkpoint every --save-every steps, so an arm cut
short goes on from its last one when rerun with --reuse, and drops them once its summary is written
(--keep-checkpoints keeps the last). At the end: DIR/summary.json (per arm, the means over seeds and
each seed's numbers; the ratios to vanilla when vanilla ran) and DIR/collapse.png (the
initial-rollout all-fail fraction against the step).

--task math (the default) is the experiment of docs/experiments/collapse.md: a jump from levels
1-2 to level 7 ("What is 7 # 42?", where a # b = 2 * a + b and nothing in the question says so),
32 steps after it at lr 2e-5, MENTOR with the worked_solutions backend, `replace`, hints from
level 2 (the plan), one round of 2 re-rolls per failed group, riding in the next step's generate
call (--mentor-async true), cut at the merged call's longest initial rollout (--mentor-horizon 1)
and decoded in the rows of the step's last prompts (--mentor-budget shared, so MENTOR decodes
about as many rows a step as vanilla: recovery.reroll.schedule=next_step_shared_rows), and
self-distillation (--mentor-distill 1.0, mentor.loss.distill_coef). --task code is the experiment
of docs/experiments/collapse_code.md: the code ladder's jump from levels 1-2 to level 5, a
supervised warm-up of 20 steps x 8 rows with hinted rows of levels 3-4, 128 new tokens and no
re-roll horizon. The flags whose default differs by task are in TASK_DEFAULTS; a flag given
explicitly wins.

Runs A-H of docs/experiments/history.md used 4 re-rolls, no horizon and extra rows
(`--mentor-rerolls 4 --mentor-horizon 0 --mentor-budget extra`). AdamW skips batches with no
signal in every arm (--step-without-signal false; see optim.step_without_signal). The arithmetic
jumps of runs A-F (levels 3-4) need their flags spelled out: `--jump-level 3 --post-steps 12
--post-lr 0 --mentor-start-level 3 --mentor-distill 0 --step-without-signal true
--eval-exclude-draws 10000 --mentor-rerolls 4 --mentor-horizon 0 --mentor-budget extra`. Measure
what a hint level does for a start with `mentor-fast eval --hint-level`. --reuse picks up what an
earlier run left in DIR.

The four numbers per arm and seed (arm_results.arm_summary has the rest):
post_jump_all_fail_frac: mean over post-jump steps of the fraction of groups whose *initial*,
unhinted rollouts all fail (a method's re-rolls never enter it). heldout_acc_no_hint: sampled
pass@1 on held-out jumped-level problems, no hint anywhere in the prompt. gen_tokens_per_step:
mean over post-jump steps of every token the arm decoded (initial rollouts, dynamic sampling's
extra rounds, re-rolls; LUFFY's expert tokens are written, not decoded: expert_tokens_per_step).
s_per_step: mean wall time of a post-jump step.
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from pathlib import Path

from arm_results import (
    arm_summary,
    earlier_wall,
    is_current,
    machine_load,
    merge_result,
    post_jump_rows,
    refresh_summary,
    resume_point,
    source_commit,
    write_summary,
)

from mentor_fast.config import ConfigError, load_config
from mentor_fast.metrics import read_metrics


def task_overrides(args) -> list[str]:
    """The task's data source and verifier: the arithmetic ladder and math-verify, or the code
    ladder (data/code_ladder.py) and sandboxed tests."""
    if args.task == "math":
        return [f"data.max_digits={args.max_digits}"]
    return ["data.source=code_ladder", f"reward.code.timeout_s={args.code_timeout}"]


def _common(args, out: Path, seed: int) -> list[str]:
    return [
        *task_overrides(args), f"output_dir={out}", f"seed={seed}", f"rollout.prompts_per_step={args.prompts}",
        f"rollout.num_generations={args.group}", f"rollout.max_new_tokens={args.max_new_tokens}",
        f"optim.lr={args.lr}", "trainer.tensorboard=false", "trainer.keep_last_n=1", "trainer.threads=2",
        f"loss.impl={args.loss_impl}",
    ]


def reroll_schedule(args) -> str:
    """recovery.reroll.schedule from --mentor-async and --mentor-budget: within the step, or riding in the
    next step's generate call on top of its rows (extra) or in them (shared)."""
    if args.mentor_async == "false":
        return "in_step"
    return {"extra": "next_step_extra_rows", "shared": "next_step_shared_rows"}[args.mentor_budget]


def _reroll_budget(args) -> list[str]:
    """The budget knobs MENTOR and Scaf share: when the re-rolls run, how many a round, where they are
    cut."""
    return [f"recovery.reroll.schedule={reroll_schedule(args)}", f"recovery.reroll.count={args.mentor_rerolls}",
            f"recovery.reroll.horizon={args.mentor_horizon}"]


def _vanilla(args) -> list[str]:
    return ["method=grpo"]


def _dynamic_sampling(args) -> list[str]:
    return ["method=grpo", "rollout.dynamic_sampling=true", f"rollout.dynamic_sampling_rounds={args.ds_rounds}"]


def _scaf(args) -> list[str]:
    # Scaf fixes its own start tier, rounds, loss mode and distillation (baselines/scaf.py)
    return ["method=scaf", *_reroll_budget(args)]


def _luffy(args) -> list[str]:
    return ["method=luffy"]  # which groups: recovery.trigger's defaults, as for MENTOR


def _mentor(args) -> list[str]:
    return ["method=mentor", "mentor.agents.backend=worked_solutions", *_reroll_budget(args),
            f"recovery.trigger.start_level={args.mentor_start_level}", f"recovery.reroll.max_rounds={args.mentor_rounds}",
            f"mentor.loss.mode={args.mentor_loss_mode}", f"mentor.loss.distill_coef={args.mentor_distill}",
            *args.mentor_set]


def _mentor_no_diagnosis(args) -> list[str]:
    return [*_mentor(args), "mentor.agents.blind=true"]


def _mentor_no_distill(args) -> list[str]:
    return [*_mentor(args), "mentor.loss.distill_coef=0"]


# arm -> the overrides that make it, on top of the post-jump run's own (arm_overrides)
ARMS = {
    "vanilla": _vanilla,
    "dynamic_sampling": _dynamic_sampling,
    "scaf": _scaf,
    "luffy": _luffy,
    "mentor": _mentor,
    "mentor_no_diagnosis": _mentor_no_diagnosis,
    "mentor_no_distill": _mentor_no_distill,
}


def arm_overrides(args, arm: str, out: Path, seed: int, start: Path | str) -> list[str]:
    """The post-jump run of one arm (ARMS) from the policy folder `start`."""
    return _common(args, out, seed) + ARMS[arm](args) + [
        f"optim.lr={args.post_lr or args.lr}", f"optim.step_without_signal={args.step_without_signal}",
        f"model.path={start}", f"data.levels=[{args.jump_level}]", f"trainer.max_steps={args.post_steps}",
        f"trainer.save_every={args.save_every}"]


def train(overrides: list[str], resume: str | None = None) -> Path:
    from mentor_fast.trainer import Trainer

    cfg = load_config([], overrides)
    return Trainer(cfg, resume=resume).fit()


def sft_warmup(args, out: Path, seed: int) -> Path:
    """The supervised start of every arm (mentor_fast/sft.py): worked solutions of the easy levels,
    a --sft-hinted-frac share of hinted rows of --sft-hinted-level. SmolLM2-135M-Instruct solves
    almost none of the ladder out of the box (sampled pass@1 0.02 over levels 1-4, measured with
    `mentor-fast eval --levels 1,2,3,4 --n 4 --k 1 --greedy --limit 24 rollout.max_new_tokens=96`),
    and a collapse needs a working regime to collapse from."""
    from mentor_fast.sft import SFTSchedule
    from mentor_fast.sft import sft_warmup as run_sft

    sched = SFTSchedule(steps=args.sft_steps, batch=args.sft_batch, lr=args.sft_lr, schedule=args.sft_schedule,
                        hinted_frac=args.sft_hinted_frac, threads=2)
    data = [*task_overrides(args), f"data.levels=[{args.easy_levels}]"]
    return run_sft(args.model, data, out, seed, sched, _hinted_overrides(args),
                   log=lambda line: print(line, flush=True))


def _hinted_overrides(args) -> list[str] | None:
    """The hinted rows' source: a level that is neither warm-up nor jump (parse_args checks), so the
    policy learns to follow a hint without ever seeing the jumped level before the jump."""
    if not args.sft_hinted_frac:
        return None
    digits = args.max_digits if args.sft_hinted_max_digits is None else args.sft_hinted_max_digits
    return [*task_overrides(args), f"data.levels=[{args.sft_hinted_level}]"] + (
        [f"data.max_digits={digits}"] if args.task == "math" else [])


def heldout_accuracy(policy: Path, args, seed: int, out_jsonl: Path) -> dict:
    """Sampled pass@1 on held-out problems of the jumped level; prompts carry no hint."""
    from mentor_fast.data import PromptBuilder, build_source
    from mentor_fast.evaluate import evaluate
    from mentor_fast.models import load_policy, load_tokenizer
    from mentor_fast.rollout import make_engine
    from mentor_fast.tasks import TASKS, TaskKind

    cfg = load_config([], [*task_overrides(args), f"model.path={policy}", f"seed={seed}",
                           f"data.jump_levels=[{args.jump_level}]", f"data.levels=[{args.jump_level}]",
                           f"data.eval_exclude_draws={args.eval_exclude_draws}"])
    tok = load_tokenizer(policy)
    model = load_policy(policy, cfg.model.dtype)
    engine = make_engine(cfg.rollout, model, tok, policy, cfg.model.dtype, seed)
    builder = PromptBuilder(tok, cfg.data.system_prompt, cfg.data.max_prompt_tokens)
    problems = build_source(cfg.data, seed).eval_problems(args.eval_problems, levels=[args.jump_level])
    verifier = TASKS[TaskKind(cfg.task)].verifier(cfg.reward)
    try:
        summary = evaluate(engine, builder, verifier.check, problems, n=args.eval_n, ks=[1],
                           temperature=1.0, max_new_tokens=args.max_new_tokens, seed=10_000 + seed,
                           out_jsonl=out_jsonl)
    finally:
        verifier.close()
        engine.close()
    return summary


def _arms(text: str) -> str:
    unknown = [a for a in text.split(",") if a not in ARMS]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown arm(s) {unknown}; choose from {', '.join(ARMS)}")
    return text


# The flags whose default depends on --task (None on the parser, filled by parse_args; a flag given
# explicitly wins): math is the level-7 experiment of docs/experiments/collapse.md, code the level-5
# one of docs/experiments/collapse_code.md. Code has no re-roll horizon: a plan makes a program
# longer than the one-line attempts it answers, and the cut re-rolls could not rescue.
TASK_DEFAULTS = {
    "math": {"jump_level": 7, "sft_hinted_level": "5", "sft_steps": 40, "sft_batch": 16, "max_new_tokens": 96,
             "mentor_horizon": 1.0},
    "code": {"jump_level": 5, "sft_hinted_level": "3,4", "sft_steps": 20, "sft_batch": 8, "max_new_tokens": 128,
             "mentor_horizon": 0.0},
}
RESULTS_DIR = Path(__file__).resolve().parent / "results"


def _per_task(key: str) -> str:
    return "default: " + ", ".join(f"{v[key]} for {task}" for task, v in TASK_DEFAULTS.items())


def default_results(args) -> Path:
    """RESULTS_DIR/baselines_TASK.json for the task's own jump, baselines_TASK_levelJ.json for
    another."""
    jump = "" if args.jump_level == TASK_DEFAULTS[args.task]["jump_level"] else f"_level{args.jump_level}"
    return RESULTS_DIR / f"baselines_{args.task}{jump}.json"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", type=int, default=1)
    p.add_argument("--first-seed", type=int, default=0, help="run seeds first-seed .. seeds-1 only")
    p.add_argument("--out", required=True)
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--task", default="math", choices=("math", "code"),
                   help="math: the arithmetic ladder; code: the function-writing ladder with sandboxed tests. "
                        "Sets the defaults of the flags that say so (TASK_DEFAULTS)")
    p.add_argument("--code-timeout", type=float, default=4.0,
                   help="--task code: reward.code.timeout_s (an infinite loop costs its sandbox slot this long)")
    p.add_argument("--easy-levels", default="1,2")
    p.add_argument("--jump-level", type=int, default=None,
                   help="the level trained after the jump (math 7: a # b = 2 * a + b, never defined in the "
                        f"question; 3-6: harder arithmetic; {_per_task('jump_level')})")
    p.add_argument("--max-digits", type=int, default=0,
                   help="cap on operand digits at every level (data.max_digits; 0: none)")
    p.add_argument("--pre-steps", type=int, default=4)
    p.add_argument("--post-steps", type=int, default=32)
    p.add_argument("--prompts", type=int, default=4)
    p.add_argument("--group", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=None, help=_per_task("max_new_tokens"))
    p.add_argument("--lr", type=float, default=1e-5)
    p.add_argument("--post-lr", type=float, default=2e-5, help="learning rate after the jump (0: --lr)")
    p.add_argument("--loss-impl", default="fused")
    p.add_argument("--mentor-async", default="true", choices=("true", "false"),
                   help="false: hints and re-rolls within the step (recovery.reroll.schedule=in_step, no "
                        "horizon); true: the first round rides in the next step's call")
    p.add_argument("--mentor-start-level", type=int, default=2,
                   help="first hint level; on the arithmetic jumps only level 3 rescues the warmed-up 135M model, "
                        "on level 7 the level-2 plan does (docs/experiments/history.md)")
    p.add_argument("--mentor-loss-mode", default="replace", choices=("replace", "group", "transfer", "shaping"))
    p.add_argument("--mentor-distill", type=float, default=1.0,
                   help="mentor.loss.distill_coef: self-distillation of the hinted policy into the bare prompt (0: off; "
                        "the trainer's own default is 0)")
    p.add_argument("--mentor-rounds", type=int, default=1)
    p.add_argument("--mentor-rerolls", type=int, default=2)
    p.add_argument("--mentor-set", nargs="*", default=[], metavar="KEY=VALUE",
                   help="further overrides for the three mentor arms only, e.g. recovery.trigger.max_groups_frac=0.5")
    p.add_argument("--mentor-horizon", type=float, default=None,
                   help="recovery.reroll.horizon: re-rolls cut at this many times the merged call's longest "
                        "initial rollout (0: off; else >= 1); for the mentor arms and scaf. Default 1 for "
                        "math, 0 for code (and for --mentor-async false, where nothing rides): a plan makes a "
                        "program longer than the one-line attempts it answers, and the cut re-rolls could "
                        "not rescue (docs/experiments/collapse_code.md)")
    p.add_argument("--mentor-budget", default="shared", choices=("extra", "shared"),
                   help="with --mentor-async true, whose rows the merged re-rolls take: shared takes them out of "
                        "the step's own (the step skips its last prompts; recovery.reroll.schedule="
                        "next_step_shared_rows), so MENTOR decodes as many rows as vanilla; extra adds them "
                        "(next_step_extra_rows)")
    p.add_argument("--step-without-signal", default="false", choices=("true", "false"),
                   help="optim.step_without_signal for every arm after the jump: false skips the AdamW "
                        "step on a batch with no signal (the warm-ups are unchanged)")
    p.add_argument("--arms", default=",".join(ARMS), type=_arms,
                   help=f"the arms to run, comma-separated, of {', '.join(ARMS)} (default: all; each seed's "
                        "start is built if missing; a later --reuse run can add an arm)")
    p.add_argument("--results", default=None,
                   help="the results file every finished arm of every seed is merged into (default: "
                        "experiments/results/baselines_TASK.json, baselines_TASK_levelJ.json for a --jump-level "
                        "other than the task's); it refuses a file written with other flags")
    p.add_argument("--ds-rounds", type=int, default=3,
                   help="the dynamic_sampling arm's rollout.dynamic_sampling_rounds")
    p.add_argument("--reuse", action="store_true",
                   help="reuse what an earlier run with the same flags left in DIR/seedN: a finished arm "
                        "(its arm_summary.json), an arm's last checkpoint (an arm cut short, or one with fewer "
                        "--post-steps, goes on from it), the GRPO warm-up's final checkpoint, else the supervised "
                        "warm-up's policy (copy only what the flags you change leave valid)")
    p.add_argument("--save-every", type=int, default=4,
                   help="an arm saves a checkpoint every N post-jump steps (0: only at its end), so an arm cut short "
                        "loses at most N steps: rerun with --reuse (the resumed arm logs what the uninterrupted "
                        "one would). Only the last is kept")
    p.add_argument("--keep-checkpoints", action="store_true",
                   help="keep an arm's last checkpoint once its summary is written (default: dropped, ~1.6 GB an "
                        "arm of the 135M model; keep it to extend the arm later with more --post-steps)")
    p.add_argument("--eval-problems", type=int, default=32)
    p.add_argument("--eval-n", type=int, default=4)
    p.add_argument("--eval-exclude-draws", type=int, default=1000,
                   help="held-out problems avoid the questions of training draws 0..N-1 (data.eval_exclude_draws; "
                        "the trainer's default is 10,000). It must cover the run's post-jump draws, (post-steps + 1) "
                        "x prompts; level 7 (891 questions) and levels capped by --max-digits 1 have too few "
                        "questions for 10,000")
    p.add_argument("--sft-steps", type=int, default=None,
                   help=f"supervised warm-up steps before GRPO (0: none; {_per_task('sft_steps')})")
    p.add_argument("--sft-batch", type=int, default=None, help=_per_task("sft_batch"))
    p.add_argument("--sft-lr", type=float, default=3e-5)
    p.add_argument("--sft-schedule", default="constant", choices=("constant", "cosine"),
                   help="cosine: 5%% linear warm-up, then down to 0.1x (for --model ladder-llama, from scratch)")
    p.add_argument("--sft-hinted-frac", type=float, default=0.25,
                   help="share of SFT rows from --sft-hinted-level, with the mentor's hint in the prompt")
    p.add_argument("--sft-hinted-level", default=None,
                   help="level(s) of the hinted SFT rows, e.g. 4,5,6 (several shapes, so that a hint is "
                        f"read rather than taken as a sign of one level's shape; {_per_task('sft_hinted_level')})")
    p.add_argument("--sft-hinted-max-digits", type=int, default=None,
                   help="data.max_digits of the hinted SFT rows (default: --max-digits; 0: no cap). Operands "
                        "too large for the model make the hint's stated step necessary, not redundant")
    p.add_argument("--sft-only", action="store_true",
                   help="stop after the supervised warm-up (DIR/seedN/sft/policy), e.g. to measure hints on it "
                        "with `mentor-fast eval --hint-level`")
    return p


def parse_args(p: argparse.ArgumentParser, argv: list[str] | None = None) -> argparse.Namespace:
    """The flags, with the task's defaults filled in (TASK_DEFAULTS) and the arms' configs checked now,
    not after the warm-ups."""
    args = p.parse_args(argv)
    if args.mentor_horizon is None and args.mentor_async == "false":  # nothing rides in_step: nothing to cut
        args.mentor_horizon = 0.0
    for key, value in TASK_DEFAULTS[args.task].items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    args.results = str(args.results or default_results(args))
    hinted = {int(x) for x in args.sft_hinted_level.split(",")}
    if args.sft_hinted_frac and hinted & {args.jump_level, *(int(x) for x in args.easy_levels.split(","))}:
        p.error(f"--sft-hinted-level {args.sft_hinted_level} must differ from the jump level and the easy levels")
    if args.eval_exclude_draws < (args.post_steps + 1) * args.prompts:
        p.error(f"--eval-exclude-draws {args.eval_exclude_draws} does not cover the post-jump draws, "
                f"(--post-steps + 1) x --prompts = {(args.post_steps + 1) * args.prompts}: held-out problems "
                "could repeat training questions")
    for arm in args.arms.split(","):
        try:
            load_config([], arm_overrides(args, arm, Path(args.out) / arm, args.first_seed, args.model))
        except ConfigError as e:
            p.error(f"the {arm} arm's config: {e}")
    if not 0 <= args.first_seed < args.seeds:
        p.error(f"--first-seed {args.first_seed} must be in [0, --seeds {args.seeds})")
    return args


# flags that say which part of an experiment an invocation runs, and where, not what it is: the results
# file, which gathers many invocations (on many machines), does not keep them
RUN_ONLY = {"seeds", "first_seed", "arms", "reuse", "out", "results", "sft_only", "save_every", "keep_checkpoints"}


def setup_conflicts(results: Path, setup: dict) -> list[str]:
    """The flags on which the results file's experiment differs from this one (none if no file)."""
    if not results.exists():
        return []
    old = json.loads(results.read_text())["setup"]
    new = json.loads(json.dumps(setup))  # as the file would hold it
    return sorted(k for k in old.keys() | new.keys()
                  if k not in RUN_ONLY | {"machine"} and old.get(k) != new.get(k))


def warm_start(args, base: Path, seed: int, stages: dict) -> Path:
    """The seed's common start: the GRPO warm-up's final policy, after the supervised warm-up."""
    pre = base / "warmup"
    start = pre / "checkpoints" / f"step_{args.pre_steps:06d}" / "policy"
    if args.reuse and (start / "config.json").exists():
        return start
    sft = base / "sft" / "policy"
    if args.reuse and (sft / "config.json").exists():
        start_model = sft
    else:
        t0 = time.time()
        start_model = sft_warmup(args, base / "sft", seed) if args.sft_steps else args.model
        stages["sft"] = time.time() - t0
    t0 = time.time()
    train(_common(args, pre, seed) + [
        f"model.path={start_model}", f"data.levels=[{args.easy_levels}]", f"trainer.max_steps={args.pre_steps}"])
    stages["grpo_warmup"] = time.time() - t0
    return start


def run_arm(args, arm: str, base: Path, seed: int, start: Path, stages: dict) -> dict:
    """One arm of one seed from the common start, trained and evaluated. The arm saves a checkpoint
    every --save-every steps, and drops its checkpoints once its summary is written (a policy with its
    AdamW state is ~1.6 GB for the 135M model) unless --keep-checkpoints. With --reuse a finished arm
    is picked up (its summary recomputed if it predates arm_summary's fields), and an arm cut short,
    or finished with fewer --post-steps, goes on from its last checkpoint (constant lr: the same as one
    longer run; the trainer restores the optimizer, RNGs and pending method work); a shorter arm
    without one trains again from the start. Anything else starts the arm's folder afresh."""
    folder = base / arm
    done = folder / "arm_summary.json"
    earlier = json.loads(done.read_text()) if args.reuse and done.exists() else None
    if earlier and len(earlier["curve"]) == args.post_steps:
        if not is_current(earlier):
            earlier = refresh_summary(folder, earlier, args.post_steps, args.group)
            done.write_text(json.dumps(earlier))
        return earlier
    ckpt = resume_point(folder, args.post_steps) if args.reuse else None
    if ckpt is None and folder.exists():  # an earlier run's rows, dumps and checkpoints would mix in
        shutil.rmtree(folder)
    t0 = time.time()
    with machine_load() as load:
        run = train(arm_overrides(args, arm, folder, seed, start), str(ckpt) if ckpt else None)
    stages[arm] = time.time() - t0
    rows = post_jump_rows(read_metrics(run / "metrics.jsonl"), args.post_steps)
    wall = stages[arm] + (earlier_wall(rows, ckpt) if ckpt else 0.0)
    final = run / "checkpoints" / f"step_{args.post_steps:06d}" / "policy"
    t0 = time.time()
    ev = heldout_accuracy(final, args, seed, folder / "heldout.jsonl")
    stages[f"{arm}_eval"] = time.time() - t0
    summary = arm_summary(rows, ev["pass@1"], wall, args.group, load)
    done.write_text(json.dumps(summary))
    if not args.keep_checkpoints:
        shutil.rmtree(run / "checkpoints")
    return summary


def main(argv: list[str] | None = None) -> None:
    p = build_parser()
    args = parse_args(p, argv)
    t_script = time.time()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.sft_only:
        for seed in range(args.first_seed, args.seeds):
            sft = out / f"seed{seed}" / "sft"
            if not (args.reuse and (sft / "policy" / "config.json").exists()):
                sft_warmup(args, sft, seed)
        return
    from mentor_fast.bench import versions

    setup = {**vars(args), "machine": versions()}
    commit = source_commit()
    results = Path(args.results)
    if conflicts := setup_conflicts(results, setup):
        p.error(f"--results {results} holds an experiment with other flags ({', '.join(conflicts)}); "
                "pass another --results")
    experiment = {k: v for k, v in setup.items() if k not in RUN_ONLY}
    arms = args.arms.split(",")
    per_arm: dict[str, list[dict]] = {arm: [] for arm in arms}
    walls: dict[str, dict[str, float]] = {}  # wall seconds of what this invocation ran, per seed and stage
    pre_rows: list[dict] = []
    for seed in range(args.first_seed, args.seeds):
        base = out / f"seed{seed}"
        stages: dict[str, float] = {}
        start = warm_start(args, base, seed, stages)
        if seed == args.first_seed:
            pre_rows = read_metrics(base / "warmup" / "metrics.jsonl")
        for arm in arms:
            per_arm[arm].append(run_arm(args, arm, base, seed, start, stages))
            # the machine and code each arm ran on: a results file gathers seeds run at different times
            merge_result(results, experiment, arm, seed,
                         {**per_arm[arm][-1], "machine": setup["machine"], "commit": commit})
        walls[f"seed{seed}"] = stages
    walls["script"] = time.time() - t_script
    summary = write_summary(setup, per_arm, pre_rows, walls, out)
    print(json.dumps({arm: {k: summary[arm][k] for k in ("post_jump_all_fail_frac", "heldout_acc_no_hint",
                                                          "gen_tokens_per_step", "s_per_step")} for arm in arms}))


if __name__ == "__main__":
    main()
