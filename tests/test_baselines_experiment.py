"""experiments/collapse.py's arms, per-task defaults and results file, and
experiments/baselines_report.py, without training."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

from mentor_fast.config import load_config

# the scripts import their sibling module arm_results, as they do when run from the repository
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "experiments"))
import arm_results
import baselines_report
import collapse

G = 8  # rollout.num_generations


def parse(*argv: str):
    return collapse.parse_args(collapse.build_parser(), ["--out", "runs/test", *argv])


@pytest.mark.parametrize("task", ["math", "code"])
def test_every_arm_loads_as_a_config_that_runs_its_method(task):
    args = parse("--task", task, "--mentor-set", "mentor.trigger.surge_steps=3")
    cfgs = {arm: load_config([], collapse.arm_overrides(args, arm, Path("runs/test") / arm, 0, args.model))
            for arm in collapse.ARMS}
    assert {arm: str(cfg.method) for arm, cfg in cfgs.items()} == {
        "vanilla": "grpo", "dynamic_sampling": "grpo", "scaf": "scaf", "luffy": "luffy", "mentor": "mentor",
        "mentor_no_diagnosis": "mentor", "mentor_no_distill": "mentor"}
    assert [arm for arm, cfg in cfgs.items() if cfg.rollout.dynamic_sampling] == ["dynamic_sampling"]
    assert cfgs["dynamic_sampling"].rollout.dynamic_sampling_rounds == args.ds_rounds
    # --mentor-set reaches the three mentor arms and no other
    assert [arm for arm, cfg in cfgs.items() if cfg.recovery.trigger.surge_steps == 3] == [
        "mentor", "mentor_no_diagnosis", "mentor_no_distill"]
    assert [arm for arm, cfg in cfgs.items() if cfg.mentor.agents.blind] == ["mentor_no_diagnosis"]
    assert {arm: cfgs[arm].mentor.loss.distill_coef for arm in ("mentor", "mentor_no_diagnosis", "mentor_no_distill")
            } == {"mentor": 1.0, "mentor_no_diagnosis": 1.0, "mentor_no_distill": 0.0}
    # Scaf has MENTOR's re-roll budget, and its own start level (the schema's default, not --mentor-start-level)
    scaf, mentor = cfgs["scaf"].recovery, cfgs["mentor"].recovery
    assert (scaf.reroll.schedule, scaf.reroll.count, scaf.reroll.horizon) == (
        mentor.reroll.schedule, mentor.reroll.count, mentor.reroll.horizon) == (
        "next_step_shared_rows", 2, {"math": 1.0, "code": 0.0}[task])
    assert (scaf.trigger.start_level, mentor.trigger.start_level) == (1, 2)
    assert {cfg.data.levels[0] for cfg in cfgs.values()} == {args.jump_level}


def test_code_gets_the_documented_experiment_without_flags_and_explicit_flags_win():
    documented = parse("--task", "code", "--jump-level", "5", "--sft-hinted-level", "3,4", "--sft-steps", "20",
                       "--sft-batch", "8", "--max-new-tokens", "128", "--mentor-start-level", "2")
    assert vars(parse("--task", "code")) == vars(documented)
    assert documented.mentor_horizon == 0.0
    math = parse()
    assert (math.jump_level, math.sft_hinted_level, math.sft_steps, math.sft_batch, math.max_new_tokens,
            math.mentor_horizon) == (7, "5", 40, 16, 96, 1.0)
    mine = parse("--task", "code", "--max-new-tokens", "64", "--jump-level", "6", "--mentor-horizon", "1")
    assert (mine.max_new_tokens, mine.jump_level, mine.mentor_horizon, mine.sft_steps) == (64, 6, 1.0, 20)
    assert parse("--mentor-async", "false").mentor_horizon == 0.0  # nothing rides, nothing to cut


def test_the_results_file_is_named_by_task_and_jump():
    names = [Path(parse(*argv).results).name for argv in ([], ["--jump-level", "4"], ["--task", "code"])]
    assert names == ["baselines_math.json", "baselines_math_level4.json", "baselines_code.json"]
    assert parse("--results", "elsewhere.json").results == "elsewhere.json"


def test_hinted_sft_rows_of_the_jumped_level_are_refused_before_anything_runs():
    with pytest.raises(SystemExit):
        parse("--task", "code", "--jump-level", "4")  # code's hinted rows are levels 3,4


def test_each_merged_arm_survives_the_next_and_the_file_is_whole_after_every_write(tmp_path):
    path = tmp_path / "results" / "baselines.json"
    setup = {"task": "math", "post_steps": 2}
    writes = [("vanilla", 0, {"post_jump_all_fail_frac": 0.9}), ("mentor", 0, {"post_jump_all_fail_frac": 0.5}),
              ("vanilla", 1, {"post_jump_all_fail_frac": 0.8})]
    for arm, seed, entry in writes:
        arm_results.merge_result(path, setup, arm, seed, entry)
        json.loads(path.read_text())
    assert json.loads(path.read_text()) == {"setup": setup, "arms": {
        "vanilla": {"seeds": {"0": {"post_jump_all_fail_frac": 0.9}, "1": {"post_jump_all_fail_frac": 0.8}}},
        "mentor": {"seeds": {"0": {"post_jump_all_fail_frac": 0.5}}}}}
    assert [p.name for p in path.parent.iterdir()] == ["baselines.json"]


def test_a_results_file_of_another_experiment_is_named_but_other_seeds_and_arms_are_not(tmp_path):
    path = tmp_path / "baselines.json"
    args = vars(parse())
    arm_results.merge_result(path, {**args, "machine": {"cpu": "a"}}, "vanilla", 0, {})
    assert collapse.setup_conflicts(path, {**args, "seeds": 3, "arms": "mentor", "machine": {"cpu": "b"}}) == []
    assert collapse.setup_conflicts(path, {**args, "post_steps": 16, "machine": {}}) == ["post_steps"]
    assert collapse.setup_conflicts(tmp_path / "none.json", args) == []


def row(step: int, *, length: float, groups: int = 4, all_fail: float = 0.5, **extra) -> dict:
    return {"step": step, "response_length/mean": length, "groups/count": groups, "groups/all_fail_frac": all_fail,
            "groups/all_pass_frac": 0.0, "acc": 0.25, "signal_yield": 0.5, "batch/sequences": groups * G,
            "timing_s/step": 2.0 * step, "timing_s/gen": 1.0, **extra}


def test_generated_tokens_count_initial_rollouts_extra_rounds_and_rerolls_but_not_expert_tokens():
    rows = [row(1, length=10.0),
            row(2, length=20.0, groups=3, **{"mentor/reroll_tokens": 100.0, "mentor/rerolls": 4.0}),
            row(3, length=5.0, **{"dynamic_sampling/extra_tokens": 60.0, "luffy/expert_tokens": 30.0})]
    s = arm_results.arm_summary(rows, heldout_acc=0.5, wall_s=9.0, group=G)
    assert s["gen_tokens_curve"] == [320.0, 480.0 + 100.0, 160.0 + 60.0]
    assert s["gen_tokens_per_step"] == pytest.approx((320 + 580 + 220) / 3)
    assert s["expert_tokens_per_step"] == pytest.approx(10.0)
    assert s["s_per_step"] == pytest.approx(4.0)
    assert s["curve"] == [0.5, 0.5, 0.5] and s["reroll_tokens_missing"] is False


def test_a_rerun_folder_keeps_the_last_row_of_each_step_up_to_the_arms_steps():
    rows = [row(1, length=1.0), row(2, length=2.0), row(1, length=3.0), row(2, length=4.0), row(3, length=5.0)]
    assert [r["response_length/mean"] for r in arm_results.post_jump_rows(rows, steps=2)] == [3.0, 4.0]


def test_an_older_arm_summary_is_recomputed_from_its_metrics_and_heldout_records(tmp_path):
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(row(s, length=10.0, **{"mentor/rerolls": 2.0}))
                                                    + "\n" for s in (1, 2)))
    (tmp_path / "heldout.jsonl").write_text("".join(json.dumps({"n": 4, "correct": c, "pass@1": c / 4}) + "\n"
                                                    for c in (1, 2)))
    old = {"curve": [0.5, 0.5], "heldout_acc_no_hint": 0.0, "wall_s": 7.0, "mean_step_s": 3.0}
    assert not arm_results.is_current(old)
    new = arm_results.refresh_summary(tmp_path, old, steps=2, group=G)
    assert arm_results.is_current(new)
    assert (new["heldout_acc_no_hint"], new["wall_s"], new["gen_tokens_per_step"]) == (0.375, 7.0, 320.0)
    assert new["reroll_tokens_missing"] is True and new["load_mean"] is None
    (tmp_path / "heldout.jsonl").unlink()
    assert arm_results.refresh_summary(tmp_path, old, steps=2, group=G)["heldout_acc_no_hint"] == 0.0


def test_the_machine_load_is_sampled_while_the_block_runs():
    with arm_results.machine_load(every_s=0.01) as load:
        assert load["load_mean"] is None
    assert load["load_mean"] >= 0.0 and load["load_max"] >= load["load_mean"]


def seed_entry(all_fail: float, acc: float, load: float | None = 2.0, commit: str | None = None,
               s_per_step: float = 5.0) -> dict:
    return {"post_jump_all_fail_frac": all_fail, "heldout_acc_no_hint": acc, "gen_tokens_per_step": 1000.0,
            "s_per_step": s_per_step, "load_mean": load, "curve": [all_fail, all_fail],
            "gen_tokens_curve": [1000.0, 1000.0], **({"commit": commit} if commit else {})}


def test_the_report_tables_each_arm_over_its_seeds_and_plots_both_panels(tmp_path, capsys):
    results = {"setup": {"task": "math", "jump_level": 7, "post_steps": 2, "machine": {"cpu": "test cpu"}},
               "arms": {"vanilla": {"seeds": {"0": seed_entry(0.8, 0.0), "1": seed_entry(1.0, 0.1, load=4.0)}},
                        "mentor": {"seeds": {"0": seed_entry(0.4, 0.4, commit="1234567890ab"),
                                             "1": seed_entry(0.5, 0.5, commit="abcdef012345+dirty", s_per_step=10.0),
                                             "2": seed_entry(0.6, 0.6, load=None, commit="1234567890ab")}}}}
    path = tmp_path / "baselines.json"
    path.write_text(json.dumps(results))
    baselines_report.main([str(path), "--plot", str(tmp_path / "report.png"), "--per-seed"])
    lines = capsys.readouterr().out.splitlines()
    assert "test cpu" in lines[0]
    vanilla, mentor = (next(line for line in lines if line.startswith(f"| {arm} |")) for arm in ("vanilla", "mentor"))
    # vanilla: two seeds, min-max; mentor: three, std; its ratios over the seeds vanilla ran (0 and 1)
    assert vanilla == "| vanilla | 2 | 0.900 (0.800-1.000) | 0.050 (0.000-0.100) | 1000 (1000-1000) | 5.0 (5.0-5.0) " \
                      "| 1.00x | 1.00x | 3.0 | - |"
    assert mentor == "| mentor | 3 | 0.500 ± 0.100 | 0.500 ± 0.100 | 1000 ± 0 | 6.7 ± 2.9 | 0.50x | 1.50x | 2.0 " \
                     "| 1234567, abcdef0 |"  # the commits the seeds ran at, each once
    # --per-seed: one row per arm and seed, in seed order
    # (its step time over vanilla's on the same seed; seed 2 has no vanilla run)
    rows = [line for line in lines if line.startswith("| mentor | ") and line.count("|") == 10]
    assert rows == ["| mentor | 0 | 0.400 | 0.400 | 1000 | 5.0 | 1.00x | 2.0 | 1234567 |",
                    "| mentor | 1 | 0.500 | 0.500 | 1000 | 10.0 | 2.00x | 2.0 | abcdef0 |",
                    "| mentor | 2 | 0.600 | 0.600 | 1000 | 5.0 | - | - | 1234567 |"]
    assert (tmp_path / "report.png").stat().st_size > 10_000


def test_with_a_load_limit_step_times_come_only_from_seeds_where_the_arm_and_vanilla_ran_quiet(tmp_path, capsys):
    """A step time taken beside other work is not the method's: --max-load keeps the seeds on which the
    arm and vanilla both trained at most that load (a row without a recorded load counts as loaded)."""
    results = {"setup": {"task": "math", "jump_level": 7, "post_steps": 2},
               "arms": {"vanilla": {"seeds": {"0": seed_entry(0.8, 0.0), "1": seed_entry(1.0, 0.1, load=4.0)}},
                        "mentor": {"seeds": {"0": seed_entry(0.4, 0.4), "1": seed_entry(0.5, 0.5, s_per_step=10.0),
                                             "2": seed_entry(0.6, 0.6, load=None)}}}}
    path = tmp_path / "baselines.json"
    path.write_text(json.dumps(results))
    baselines_report.main([str(path), "--max-load", "2.5"])
    lines = capsys.readouterr().out.splitlines()
    assert "s / step, load <= 2.5 (seeds)" in lines[2]
    vanilla, mentor = (next(line for line in lines if line.startswith(f"| {arm} |")) for arm in ("vanilla", "mentor"))
    # the efficacy columns keep every seed; the step time and its ratio only seed 0 (1: vanilla loaded,
    # 2: no load recorded), where without the limit mentor's ratio is 1.50x (seed 1's 10 s counted)
    assert vanilla == "| vanilla | 2 | 0.900 (0.800-1.000) | 0.050 (0.000-0.100) | 1000 (1000-1000) | 5.0 (1) " \
                      "| 1.00x | 1.00x | 3.0 | - |"
    assert mentor == "| mentor | 3 | 0.500 ± 0.100 | 0.500 ± 0.100 | 1000 ± 0 | 5.0 (1) | 0.50x | 1.00x | 2.0 | - |"


def test_the_sign_flip_test_is_exact_and_symmetric():
    # every one of 8 seeds ahead: only the all-plus and all-minus patterns are as extreme, 2 of 256
    assert baselines_report.sign_flip_p([0.1] * 8) == pytest.approx(2 / 256)
    assert baselines_report.sign_flip_p([-0.1] * 8) == pytest.approx(2 / 256)
    # one seed of 6 behind by as much as the others are ahead: 14 of the 64 patterns reach |mean| >= 4/6 of 0.1
    assert baselines_report.sign_flip_p([0.1] * 5 + [-0.1]) == pytest.approx(14 / 64)
    assert baselines_report.sign_flip_p([0.0, 0.0, 0.0]) == 1.0


def test_a_paired_difference_is_supported_only_over_enough_seeds_with_the_interval_and_the_test_agreeing():
    def verdict(diffs):  # a family of one comparison
        lo, hi = baselines_report.bootstrap_ci(diffs)
        p = baselines_report.sign_flip_p(diffs)
        return baselines_report.paired_verdict(diffs, lo, hi, p, p, 1)

    # two seeds far apart from 0: their bootstrap interval is their min-max, which proves nothing
    assert verdict([0.4, 0.5]) == "2 of 2 seeds > 0; too few seeds to rank"
    assert verdict([0.1] * 5) == "5 of 5 seeds > 0; too few seeds to rank"  # 2/32 > 0.05 even when all agree
    assert verdict([0.30, 0.20, 0.25, 0.35, 0.28, 0.22, 0.31, 0.26]) == "8 of 8 seeds > 0, sign-flip p = 0.008; supported"
    # a mean difference carried by one large seed: 7 small negatives and one large positive
    assert verdict([-0.02] * 7 + [0.5]).endswith("not supported")
    # significant alone, not once the comparison is one of a family of four
    diffs = [0.30, 0.20, 0.25, 0.35, 0.28, -0.05, 0.31, 0.26]
    p = baselines_report.sign_flip_p(diffs)
    assert 0.0125 < p < 0.05 and verdict(diffs).endswith("; supported")
    assert baselines_report.paired_verdict(diffs, 0.1, 0.3, p, 4 * p, 4).endswith(f"Holm over 4: {4 * p:.3f}; not supported")
    # a wide spread around 0
    assert verdict([0.3, -0.25, 0.1, -0.2, 0.15, -0.1, 0.05, -0.02]).endswith("not supported")


def test_holm_scales_the_smallest_p_by_the_family_and_keeps_the_order():
    adjusted = baselines_report.holm({"a": 0.01, "b": 0.04, "c": 0.03, "d": 0.5})
    assert adjusted == pytest.approx({"a": 0.04, "c": 0.09, "b": 0.09, "d": 0.5})
    assert baselines_report.holm({"a": 0.4, "b": 0.3}) == pytest.approx({"b": 0.6, "a": 0.6})
    assert baselines_report.holm({}) == {}


def test_the_intervals_table_pairs_seeds_and_says_which_differences_the_data_support(tmp_path, capsys):
    seeds = range(8)
    results = {"setup": {"task": "math", "jump_level": 7, "post_steps": 2},
               "arms": {"vanilla": {"seeds": {str(k): seed_entry(0.9, 0.01 * k) for k in seeds}},
                        # MENTOR sits 0.3 above vanilla on every seed, but the seeds spread by 0.07 each
                        "mentor": {"seeds": {str(k): seed_entry(0.5, 0.3 + 0.01 * k) for k in seeds}},
                        "luffy": {"seeds": {str(k): seed_entry(0.5, 0.3 + 0.01 * k + (0.1 if k % 2 else -0.1))
                                            for k in seeds}}}}
    path = tmp_path / "baselines.json"
    path.write_text(json.dumps(results))
    baselines_report.main([str(path), "--intervals"])
    out = capsys.readouterr().out
    interval_rows = out.rsplit("[95% CI]", 1)[1].splitlines()  # the third table, after its header
    vanilla, luffy = (next(line for line in interval_rows if line.startswith(f"| {arm} | 8 |")) for arm in ("vanilla", "luffy"))
    # paired: the seeds' spread cancels, so the held-out difference is exactly +0.3 with no width
    # two baselines ranked on each metric: vanilla's p of 2/256 is doubled by Holm's adjustment
    assert "+0.300 [+0.300, +0.300] (8 of 8 seeds > 0, sign-flip p = 0.008, Holm over 2: 0.016; supported)" in vanilla
    assert "-0.400 [-0.400, -0.400] (0 of 8 seeds > 0, sign-flip p = 0.008, Holm over 2: 0.016; supported)" in vanilla
    # equal all-fail fractions, and held-out differences of +-0.1 that cancel: p = 1 on both
    assert luffy.count("+0.000 [") == 2 and luffy.count("p = 1.000, Holm over 2: 1.000; not supported") == 2


def test_the_plotted_curve_is_a_trailing_mean_that_keeps_the_first_steps():
    assert baselines_report.trailing_mean([1.0, 0.0, 0.5, 0.5, 0.0], 2) == [1.0, 0.5, 0.25, 0.5, 0.25]
    assert baselines_report.trailing_mean([1.0, 0.0], 1) == [1.0, 0.0]


def fake_train(calls: list[str], cut: dict[str, int] | None = None, resumes: list | None = None):
    """collapse.train without training: a run folder with metrics rows and a checkpoint (policy/config.json)
    every trainer.save_every steps and at the end, the last one kept, as the trainer keeps them with
    trainer.keep_last_n=1; a run resumed from a checkpoint goes on after its step. `cut`: run folder name ->
    the step at which that run stops with an error (once), as a killed process would."""
    cut = dict(cut or {})

    def train(overrides: list[str], resume: str | None = None) -> Path:
        values = dict(o.split("=", 1) for o in overrides)
        out, steps = Path(values["output_dir"]), int(values["trainer.max_steps"])
        every = int(values.get("trainer.save_every", 0))
        calls.append(out.name)
        if resumes is not None:
            resumes.append(resume)
        first = int(Path(resume).name.split("_")[1]) + 1 if resume else 1
        rerolls = {"mentor/reroll_tokens": 50.0} if values.get("method") == "mentor" else {}
        out.mkdir(parents=True, exist_ok=True)
        for s in range(first, steps + 1):
            if cut.get(out.name) == s:
                del cut[out.name]
                raise RuntimeError(f"cut at step {s}")
            with (out / "metrics.jsonl").open("a") as f:
                f.write(json.dumps(row(s, length=10.0, **rerolls)) + "\n")
            if s == steps or (every and s % every == 0):
                for old in (out / "checkpoints").glob("step_*"):
                    shutil.rmtree(old)
                (out / "checkpoints" / f"step_{s:06d}" / "policy").mkdir(parents=True)
                (out / "checkpoints" / f"step_{s:06d}" / "policy" / "config.json").write_text("{}")
        return out
    return train


def test_a_run_merges_every_arm_of_every_seed_and_a_rerun_with_reuse_trains_nothing(tmp_path, monkeypatch):
    calls: list[str] = []
    monkeypatch.setattr(collapse, "train", fake_train(calls))
    monkeypatch.setattr(collapse, "heldout_accuracy", lambda *a: {"pass@1": 0.25})
    results = tmp_path / "baselines.json"
    argv = ["--out", str(tmp_path / "run"), "--results", str(results), "--seeds", "2", "--sft-steps", "0",
            "--post-steps", "3", "--arms", "vanilla,mentor,luffy"]
    collapse.main(argv)
    assert calls == ["warmup", "vanilla", "mentor", "luffy"] * 2
    arms = json.loads(results.read_text())["arms"]
    assert {arm: sorted(e["seeds"]) for arm, e in arms.items()} == {a: ["0", "1"] for a in ("vanilla", "mentor", "luffy")}
    assert arms["mentor"]["seeds"]["1"]["gen_tokens_per_step"] == 4 * G * 10.0 + 50.0
    assert arms["mentor"]["seeds"]["1"]["commit"] == arm_results.source_commit()  # the code that ran, in a checkout
    setup = json.loads(results.read_text())["setup"]  # the experiment, not this invocation's folders
    assert setup["post_steps"] == 3 and not setup.keys() & {"out", "results", "arms", "seeds"}
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["ratios"]["all_fail_luffy_over_vanilla"] == 1.0 and "mentor" in summary
    results.unlink()
    collapse.main([*argv, "--reuse"])
    assert len(calls) == 8 and sorted(json.loads(results.read_text())["arms"]["luffy"]["seeds"]) == ["0", "1"]


def test_an_arm_cut_short_goes_on_from_its_last_checkpoint_and_drops_its_checkpoints_once_summarised(
        tmp_path, monkeypatch):
    calls, resumes = [], []
    monkeypatch.setattr(collapse, "train", fake_train(calls, cut={"mentor": 6}, resumes=resumes))
    monkeypatch.setattr(collapse, "heldout_accuracy", lambda *a: {"pass@1": 0.25})
    argv = ["--out", str(tmp_path / "run"), "--results", str(tmp_path / "baselines.json"), "--sft-steps", "0",
            "--post-steps", "7", "--save-every", "2", "--arms", "vanilla,mentor"]
    with pytest.raises(RuntimeError, match="cut at step 6"):
        collapse.main(argv)
    seed0 = tmp_path / "run" / "seed0"
    # vanilla finished: summarised, its checkpoints dropped; mentor was cut after its step-4 checkpoint
    assert (seed0 / "vanilla" / "arm_summary.json").exists() and not (seed0 / "vanilla" / "checkpoints").exists()
    assert [c.name for c in (seed0 / "mentor" / "checkpoints").iterdir()] == ["step_000004"]
    collapse.main([*argv, "--reuse"])
    # the rerun trains only the cut arm, from its checkpoint: steps 5-7, not 1-7
    assert calls == ["warmup", "vanilla", "mentor", "mentor"]
    assert resumes[-1] == str(seed0 / "mentor" / "checkpoints" / "step_000004")
    mentor = json.loads((seed0 / "mentor" / "arm_summary.json").read_text())
    assert len(mentor["curve"]) == 7 and not (seed0 / "mentor" / "checkpoints").exists()
    # its wall time counts the steps before the cut (timing_s/step of step s is 2 s here)
    assert mentor["wall_s"] >= 2.0 * (1 + 2 + 3 + 4)
    assert sorted(json.loads((tmp_path / "baselines.json").read_text())["arms"]["mentor"]["seeds"]) == ["0"]


def test_checkpoints_are_kept_on_request_and_a_fresh_arm_starts_from_an_empty_folder(tmp_path, monkeypatch):
    calls, resumes = [], []
    monkeypatch.setattr(collapse, "train", fake_train(calls, resumes=resumes))
    monkeypatch.setattr(collapse, "heldout_accuracy", lambda *a: {"pass@1": 0.25})

    def run(steps: int, *flags: str) -> None:  # a results file per --post-steps: they are other experiments
        collapse.main(["--out", str(tmp_path / "run"), "--results", str(tmp_path / f"results{steps}.json"),
                       "--sft-steps", "0", "--post-steps", str(steps), "--arms", "vanilla", *flags])

    run(3, "--keep-checkpoints")
    arm = tmp_path / "run" / "seed0" / "vanilla"
    assert [c.name for c in (arm / "checkpoints").iterdir()] == ["step_000003"]
    run(5, "--reuse")  # more steps: extended from the kept checkpoint, which is then dropped
    assert resumes[-1] == str(arm / "checkpoints" / "step_000003") and not (arm / "checkpoints").exists()
    assert len(json.loads((arm / "arm_summary.json").read_text())["curve"]) == 5
    (tmp_path / "results5.json").unlink()
    run(5)  # without --reuse the arm's folder starts empty: no rows of the earlier runs in its metrics
    assert resumes[-1] is None
    assert [r["step"] for r in map(json.loads, (arm / "metrics.jsonl").read_text().splitlines())] == [1, 2, 3, 4, 5]
