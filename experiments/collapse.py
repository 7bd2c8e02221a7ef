#!/usr/bin/env python
"""Zero-reward collapse and recovery: vanilla GRPO vs MENTOR through a sudden difficulty jump.

    .venv/bin/python experiments/collapse.py --seeds 1 --out runs/collapse

Per seed: (0) a short supervised warm-up on worked solutions of the easy levels (see sft_warmup:
the embedded model cannot do the ladder at all without it); (1) a shared GRPO warm-up on the easy
levels (vanilla GRPO; the mentor has nothing to do there), saved as the common start; (2) from
that start, the same number of post-jump steps on the jumped level for vanilla GRPO and for
MENTOR (same seed, so the same prompts and sampling seeds for the initial rollouts); (3) both
final policies are evaluated on held-out problems of the jumped level without hints. Writes
DIR/summary.json = {"vanilla": {...}, "mentor": {...}, "setup": {...}} and DIR/collapse.png
(the initial-rollout all-fail fraction against the step, both arms).

The defaults are the experiment of docs/experiments/collapse.md: a jump from levels 1-2 to level 7
("What is 7 # 42?", where a # b = 2 * a + b and nothing in the question says so), 32 steps after it
at lr 2e-5,
MENTOR with the worked_solutions backend, `replace`, hints from level 2 (the plan), one round of 2
re-rolls per failed group, riding in the next step's generate call (--mentor-async true), cut at
the merged call's longest initial rollout (--mentor-horizon 1; 0, no cut, with --task code) and
decoded in the rows of the step's last prompts (--mentor-budget shared, so MENTOR decodes about as
many rows a step as vanilla: mentor.reroll.schedule=next_step_shared_rows), and self-distillation
(--mentor-distill 1.0, mentor.loss.distill_coef). Runs A-H of docs/experiments/history.md used 4
re-rolls, no horizon and extra rows (`--mentor-rerolls 4 --mentor-horizon 0 --mentor-budget
extra`). AdamW skips batches with no signal in both arms (--step-without-signal false; see
optim.step_without_signal). The arithmetic jumps of
runs A-F of docs/experiments/history.md (levels 3-4) need their flags spelled out: `--jump-level 3
--post-steps 12 --post-lr 0 --mentor-start-level 3 --mentor-distill 0 --step-without-signal true
--eval-exclude-draws 10000 --mentor-rerolls 4 --mentor-horizon 0 --mentor-budget extra`. Measure
what a hint level does for a start with `mentor-fast eval --hint-level`. --reuse picks up what an
earlier run left in DIR; --arms runs one arm only.

post_jump_all_fail_frac: mean over post-jump steps of the fraction of groups whose *initial*,
unhinted rollouts all fail (MENTOR's re-rolls never enter it). heldout_acc_no_hint: sampled
pass@1 on held-out jumped-level problems, no hint anywhere in the prompt.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from mentor_fast.config import ConfigError, load_config
from mentor_fast.metrics import read_metrics
from mentor_fast.trainer import Trainer


def task_overrides(args) -> list[str]:
    """The task's data source and verifier: the arithmetic ladder and math-verify, or the code
    ladder (data/code_ladder.py) and sandboxed tests."""
    if args.task == "math":
        return [f"data.max_digits={args.max_digits}"]
    return ["data.source=code_ladder", "reward.kind=code", f"reward.code.timeout_s={args.code_timeout}"]


def _common(args, out: Path, seed: int) -> list[str]:
    return [*task_overrides(args), 
        f"output_dir={out}", f"seed={seed}", f"rollout.prompts_per_step={args.prompts}",
        f"rollout.num_generations={args.group}", f"rollout.max_new_tokens={args.max_new_tokens}",
        f"optim.lr={args.lr}", "trainer.tensorboard=false", "trainer.keep_last_n=1", "trainer.threads=2",
        f"loss.impl={args.loss_impl}",
    ]


def reroll_schedule(args) -> str:
    """mentor.reroll.schedule from --mentor-async and --mentor-budget: within the step, or riding in the
    next step's generate call on top of its rows (extra) or in them (shared)."""
    if args.mentor_async == "false":
        return "in_step"
    return {"extra": "next_step_extra_rows", "shared": "next_step_shared_rows"}[args.mentor_budget]


def arm_overrides(args, arm: str, out: Path, seed: int, start: Path | str) -> list[str]:
    """The post-jump run of one arm (ARMS) from the policy folder `start`."""
    extra = {
        "vanilla": ["mentor.enable=false"],
        "dynamic_sampling": ["mentor.enable=false", "rollout.dynamic_sampling=true",
                             f"rollout.dynamic_sampling_rounds={args.ds_rounds}"],
        "mentor": ["mentor.enable=true", "mentor.agents.backend=worked_solutions",
                   f"mentor.reroll.schedule={reroll_schedule(args)}",
                   f"mentor.trigger.start_level={args.mentor_start_level}",
                   f"mentor.reroll.max_rounds={args.mentor_rounds}", f"mentor.reroll.count={args.mentor_rerolls}",
                   f"mentor.loss.mode={args.mentor_loss_mode}", f"mentor.loss.distill_coef={args.mentor_distill}",
                   f"mentor.reroll.horizon={args.mentor_horizon}", *args.mentor_set],
    }[arm]
    return _common(args, out, seed) + extra + [
        f"optim.lr={args.post_lr or args.lr}", f"optim.step_without_signal={args.step_without_signal}",
        f"model.path={start}", f"data.levels=[{args.jump_level}]", f"trainer.max_steps={args.post_steps}"]


def train(overrides: list[str], resume: str | None = None) -> Path:
    cfg = load_config([], overrides)
    return Trainer(cfg, resume=resume).fit()


def sft_warmup(args, out: Path, seed: int) -> Path:
    """The supervised start of both arms (mentor_fast/sft.py): worked solutions of the easy levels,
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
    """The hinted rows' source: a level that is neither warm-up nor jump, so the policy learns to
    follow a hint without ever seeing the jumped level before the jump."""
    if not args.sft_hinted_frac:
        return None
    hinted = {int(x) for x in str(args.sft_hinted_level).split(",")}
    if hinted & {args.jump_level, *(int(x) for x in args.easy_levels.split(","))}:
        raise SystemExit("--sft-hinted-level must differ from the jump level and the easy levels")
    digits = args.max_digits if args.sft_hinted_max_digits is None else args.sft_hinted_max_digits
    return [*task_overrides(args), f"data.levels=[{args.sft_hinted_level}]"] + (
        [f"data.max_digits={digits}"] if args.task == "math" else [])


def heldout_accuracy(policy: Path, args, seed: int, out_jsonl: Path) -> dict:
    """Sampled pass@1 on held-out problems of the jumped level; prompts carry no hint."""
    from mentor_fast.data import PromptBuilder, build_source
    from mentor_fast.evaluate import evaluate
    from mentor_fast.models import load_policy, load_tokenizer
    from mentor_fast.rewards import VERIFIERS, RewardKind
    from mentor_fast.rollout import make_engine

    cfg = load_config([], [*task_overrides(args), f"model.path={policy}", f"seed={seed}",
                           f"data.jump_levels=[{args.jump_level}]", f"data.levels=[{args.jump_level}]",
                           f"data.eval_exclude_draws={args.eval_exclude_draws}"])
    tok = load_tokenizer(policy)
    model = load_policy(policy, cfg.model.dtype)
    engine = make_engine(cfg.rollout, model, tok, policy, cfg.model.dtype, seed)
    builder = PromptBuilder(tok, cfg.data.system_prompt, cfg.data.max_prompt_tokens)
    problems = build_source(cfg.data, seed).eval_problems(args.eval_problems, levels=[args.jump_level])
    verifier = VERIFIERS[RewardKind(cfg.reward.kind)](cfg.reward)
    try:
        summary = evaluate(engine, builder, verifier.check, problems, n=args.eval_n, ks=[1],
                           temperature=1.0, max_new_tokens=args.max_new_tokens, seed=10_000 + seed,
                           out_jsonl=out_jsonl)
    finally:
        verifier.close()
        engine.close()
    return summary


def arm_summary(rows: list[dict], eval_summary: dict, wall_s: float, group: int) -> dict:
    post = rows
    return {
        "post_jump_all_fail_frac": statistics.mean(r["groups/all_fail_frac"] for r in post),
        "post_jump_acc": statistics.mean(r["acc"] for r in post),
        "post_jump_signal_yield": statistics.mean(r["signal_yield"] for r in post),
        "heldout_acc_no_hint": eval_summary["pass@1"],
        "mean_step_s": statistics.mean(r["timing_s/step"] for r in post),
        "rescued_total": sum(r.get("mentor/rescued", 0.0) for r in post),
        "triggered_total": sum(r.get("mentor/triggered", 0.0) for r in post),
        "rerolls_total": sum(r.get("mentor/rerolls", 0.0) for r in post),
        "rerolls_cut_total": sum(r.get("mentor/rerolls_cut", 0.0) for r in post),
        "prompts_total": sum(r["groups/count"] for r in post),
        "prompts_skipped_total": sum(r.get("mentor/prompts_skipped", 0.0) for r in post),
        "mean_gen_s": statistics.mean(r["timing_s/gen"] for r in post),
        "mean_update_s": statistics.mean(r.get("timing_s/update", 0.0) for r in post),
        "wall_s": wall_s,
        "curve": [r["groups/all_fail_frac"] for r in post],
        # the tokens of the initial rollouts and of dynamic sampling's rounds (MENTOR's re-rolls are
        # in rerolls_total), and the groups trained on
        "generated_tokens_total": sum(r["response_length/mean"] * r["groups/count"] * group
                                      + r.get("dynamic_sampling/extra_tokens", 0.0) for r in post),
        "groups_trained_total": sum(r["batch/sequences"] / group for r in post),
        # groups with a signal: dynamic sampling's kept ones, else the initial groups neither all
        # failed nor all passed (binary rewards; a method's rescues are in rescued_total)
        "signal_groups_total": sum(r.get("dynamic_sampling/groups_kept", r["groups/count"] * (
            1.0 - r["groups/all_fail_frac"] - r["groups/all_pass_frac"])) for r in post),
    }


def plot(summary: dict, pre_rows: list[dict], out_png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    k = len(pre_rows)
    ax.plot(range(1, k + 1), [r["groups/all_fail_frac"] for r in pre_rows], color="gray", marker="o",
            label="warm-up (shared)")
    for arm, color in (("vanilla", "tab:red"), ("mentor", "tab:blue")):
        for s, per_seed in enumerate(summary[arm]["per_seed"]):
            curve = per_seed["curve"]
            ax.plot(range(k + 1, k + 1 + len(curve)), curve, color=color, marker=".", alpha=0.8,
                    label=f"{arm}" if s == 0 else None)
    ax.axvline(k + 0.5, ls="--", color="k", lw=1)
    ax.set_xlabel("step")
    ax.set_ylabel("all-fail fraction (initial rollouts)")
    ax.set_ylim(-0.05, 1.05)
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out_png, dpi=110)
    plt.close(fig)


ARMS = ("vanilla", "mentor", "dynamic_sampling")


def _arms(text: str) -> str:
    unknown = [a for a in text.split(",") if a not in ARMS]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown arm(s) {unknown}; choose from {', '.join(ARMS)}")
    return text


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", type=int, default=1)
    p.add_argument("--first-seed", type=int, default=0, help="run seeds first-seed .. seeds-1 only")
    p.add_argument("--out", required=True)
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--task", default="math", choices=("math", "code"),
                   help="math: the arithmetic ladder; code: the function-writing ladder with sandboxed tests "
                        "(pick --easy-levels, --jump-level and --sft-hinted-level of that ladder)")
    p.add_argument("--code-timeout", type=float, default=4.0,
                   help="--task code: reward.code.timeout_s (an infinite loop costs its sandbox slot this long)")
    p.add_argument("--easy-levels", default="1,2")
    p.add_argument("--jump-level", type=int, default=7,
                   help="the level trained after the jump (7: a # b = 2 * a + b, never defined in the question; "
                        "3-6: harder arithmetic)")
    p.add_argument("--max-digits", type=int, default=0,
                   help="cap on operand digits at every level (data.max_digits; 0: none)")
    p.add_argument("--pre-steps", type=int, default=4)
    p.add_argument("--post-steps", type=int, default=32)
    p.add_argument("--prompts", type=int, default=4)
    p.add_argument("--group", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=96)
    p.add_argument("--lr", type=float, default=1e-5)
    p.add_argument("--post-lr", type=float, default=2e-5, help="learning rate after the jump (0: --lr)")
    p.add_argument("--loss-impl", default="fused")
    p.add_argument("--mentor-async", default="true", choices=("true", "false"),
                   help="false: hints and re-rolls within the step (mentor.reroll.schedule=in_step, no "
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
                   help="further overrides for the MENTOR arm only, e.g. mentor.trigger.max_groups_frac=0.5")
    p.add_argument("--mentor-horizon", type=float, default=None,
                   help="mentor.reroll.horizon: re-rolls cut at this many times the merged call's longest "
                        "initial rollout (0: off; else >= 1). Default 1 for math, 0 for code (and for "
                        "--mentor-async false, where nothing rides): a plan makes a "
                        "program longer than the one-line attempts it answers, and the cut re-rolls could "
                        "not rescue (docs/experiments/collapse_code.md)")
    p.add_argument("--mentor-budget", default="shared", choices=("extra", "shared"),
                   help="with --mentor-async true, whose rows the merged re-rolls take: shared takes them out of "
                        "the step's own (the step skips its last prompts; mentor.reroll.schedule="
                        "next_step_shared_rows), so MENTOR decodes as many rows as vanilla; extra adds them "
                        "(next_step_extra_rows)")
    p.add_argument("--step-without-signal", default="false", choices=("true", "false"),
                   help="optim.step_without_signal for both arms after the jump: false skips the AdamW "
                        "step on a batch with no signal (the warm-ups are unchanged)")
    p.add_argument("--arms", default="vanilla,mentor", type=_arms,
                   help=f"the arms to run, comma-separated, of {', '.join(ARMS)} (each seed's start is built "
                        "if missing; the comparison, summary.json, is written when a run has vanilla and mentor; "
                        "a later --reuse run can add an arm)")
    p.add_argument("--ds-rounds", type=int, default=3,
                   help="the dynamic_sampling arm's rollout.dynamic_sampling_rounds")
    p.add_argument("--reuse", action="store_true",
                   help="reuse what an earlier run with the same flags left in DIR/seedN: a finished arm "
                        "(its arm_summary.json; an arm with fewer --post-steps is extended from its last "
                        "checkpoint), the GRPO warm-up's final checkpoint, else the supervised warm-up's "
                        "policy (copy only what the flags you change leave valid)")
    p.add_argument("--eval-problems", type=int, default=32)
    p.add_argument("--eval-n", type=int, default=4)
    p.add_argument("--eval-exclude-draws", type=int, default=1000,
                   help="held-out problems avoid the questions of training draws 0..N-1 (data.eval_exclude_draws; "
                        "the trainer's default is 10,000). It must cover the run's post-jump draws, (post-steps + 1) "
                        "x prompts; level 7 (891 questions) and levels capped by --max-digits 1 have too few "
                        "questions for 10,000")
    p.add_argument("--sft-steps", type=int, default=40, help="supervised warm-up steps before GRPO (0: none)")
    p.add_argument("--sft-batch", type=int, default=16)
    p.add_argument("--sft-lr", type=float, default=3e-5)
    p.add_argument("--sft-schedule", default="constant", choices=("constant", "cosine"),
                   help="cosine: 5%% linear warm-up, then down to 0.1x (for --model ladder-llama, from scratch)")
    p.add_argument("--sft-hinted-frac", type=float, default=0.25,
                   help="share of SFT rows from --sft-hinted-level, with the mentor's hint in the prompt")
    p.add_argument("--sft-hinted-level", default="5",
                   help="level(s) of the hinted SFT rows, e.g. 4,5,6 (several shapes, so that a hint is "
                        "read rather than taken as a sign of one level's shape)")
    p.add_argument("--sft-hinted-max-digits", type=int, default=None,
                   help="data.max_digits of the hinted SFT rows (default: --max-digits; 0: no cap). Operands "
                        "too large for the model make the hint's stated step necessary, not redundant")
    p.add_argument("--sft-only", action="store_true",
                   help="stop after the supervised warm-up (DIR/seedN/sft/policy), e.g. to measure hints on it "
                        "with `mentor-fast eval --hint-level`")
    return p


def main() -> None:
    p = build_parser()
    args = p.parse_args()
    if args.mentor_horizon is None:  # nothing rides in_step, so nothing to cut
        args.mentor_horizon = 0.0 if args.task == "code" or args.mentor_async == "false" else 1.0
    if args.eval_exclude_draws < (args.post_steps + 1) * args.prompts:
        p.error(f"--eval-exclude-draws {args.eval_exclude_draws} does not cover the post-jump draws, "
                f"(--post-steps + 1) x --prompts = {(args.post_steps + 1) * args.prompts}: held-out problems "
                "could repeat training questions")
    for arm in args.arms.split(","):  # the arms' config errors now, not after the warm-ups
        try:
            load_config([], arm_overrides(args, arm, Path(args.out) / arm, args.first_seed, args.model))
        except ConfigError as e:
            p.error(f"the {arm} arm's config: {e}")
    if not 0 <= args.first_seed < args.seeds:
        p.error(f"--first-seed {args.first_seed} must be in [0, --seeds {args.seeds})")
    t_script = time.time()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.sft_only:
        for seed in range(args.first_seed, args.seeds):
            sft = out / f"seed{seed}" / "sft"
            if not (args.reuse and (sft / "policy" / "config.json").exists()):
                sft_warmup(args, sft, seed)
        return
    per_arm: dict[str, list[dict]] = {arm: [] for arm in ARMS}
    stage_walls: dict[str, dict[str, float]] = {}
    pre_rows: list[dict] = []
    for seed in range(args.first_seed, args.seeds):
        base = out / f"seed{seed}"
        pre = base / "warmup"
        start = pre / "checkpoints" / f"step_{args.pre_steps:06d}" / "policy"
        stages = {}  # wall seconds of what this invocation ran (not of what --reuse picked up)
        if not (args.reuse and (start / "config.json").exists()):
            sft = base / "sft" / "policy"
            if args.reuse and (sft / "config.json").exists():
                start_model = sft
            else:
                t0 = time.time()
                start_model = sft_warmup(args, base / "sft", seed) if args.sft_steps else args.model
                stages["sft"] = time.time() - t0
            t0 = time.time()
            train(_common(args, pre, seed) + [
                f"model.path={start_model}", f"data.levels=[{args.easy_levels}]",
                f"trainer.max_steps={args.pre_steps}"])
            stages["grpo_warmup"] = time.time() - t0
        pre_rows = read_metrics(pre / "metrics.jsonl") if seed == args.first_seed else pre_rows
        for arm in args.arms.split(","):
            done = base / arm / "arm_summary.json"
            earlier = json.loads(done.read_text()) if args.reuse and done.exists() else None
            if earlier and len(earlier["curve"]) == args.post_steps:
                per_arm[arm].append(earlier)
                continue
            # A shorter finished arm is extended from its last checkpoint (constant lr: the same
            # as one longer run; the trainer restores the optimizer, RNGs and pending mentor work).
            resume = "auto" if earlier and len(earlier["curve"]) < args.post_steps else None
            t0 = time.time()
            run = train(arm_overrides(args, arm, base / arm, seed, start), resume)
            stages[arm] = time.time() - t0
            wall = stages[arm] + (earlier["wall_s"] if resume else 0.0)
            final = run / "checkpoints" / f"step_{args.post_steps:06d}" / "policy"
            t0 = time.time()
            ev = heldout_accuracy(final, args, seed, base / arm / "heldout.jsonl")
            stages[f"{arm}_eval"] = time.time() - t0
            per_arm[arm].append(arm_summary(read_metrics(run / "metrics.jsonl"), ev, wall, args.group))
            done.write_text(json.dumps(per_arm[arm][-1]))
        stage_walls[f"seed{seed}"] = stages
    if not {"vanilla", "mentor"} <= set(args.arms.split(",")):
        print(json.dumps({"arms": args.arms, "wall_s": time.time() - t_script, **stage_walls}))
        return
    from mentor_fast.bench import versions

    summary: dict = {"setup": vars(args), "machine": versions(),
                     "wall_s": {"script": time.time() - t_script, **stage_walls}}
    for arm, seeds in ((arm, seeds) for arm, seeds in per_arm.items() if seeds):
        # keys every seed has (an arm summary picked up by --reuse may predate a key)
        keys = [k for k in seeds[0] if k != "curve" and all(k in s for s in seeds)]
        summary[arm] = {k: statistics.mean(s[k] for s in seeds) for k in keys}
        summary[arm]["per_seed"] = seeds
    v, m = summary["vanilla"], summary["mentor"]
    summary["ratios"] = {
        "all_fail_mentor_over_vanilla": (m["post_jump_all_fail_frac"] / v["post_jump_all_fail_frac"]
                                         if v["post_jump_all_fail_frac"] else None),
        "step_time_mentor_over_vanilla": m["mean_step_s"] / v["mean_step_s"],
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    plot(summary, pre_rows, out / "collapse.png")
    print(json.dumps({arm: {k: summary[arm][k] for k in ("post_jump_all_fail_frac", "heldout_acc_no_hint",
                                                          "mean_step_s")} for arm in ARMS if per_arm[arm]}))


if __name__ == "__main__":
    main()
