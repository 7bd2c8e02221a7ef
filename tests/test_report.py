"""report.png and `mentor-fast report`: the unhinted all-fail curve, its trailing mean (restarted at
the jump, weighted by each step's group count), and a baseline run drawn beside a MENTOR run. The
runs are metrics.jsonl and config.yaml files written here, as the trainer writes them."""

from __future__ import annotations

import json

import pytest
import yaml

from mentor_fast.cli import main
from mentor_fast.metrics import all_fail_curve, read_run, trailing_mean


def _run(folder, fracs, counts=None, mentor=False, jump_step=3):
    folder.mkdir()
    rows = []
    for i, frac in enumerate(fracs):
        row = {"step": i + 1, "groups/all_fail_frac": frac, "groups/count": (counts or [4] * len(fracs))[i],
               "acc": 1 - frac, "reward/mean": 1 - frac}
        if mentor and i >= 1:
            row.update({"mentor/triggered": 2.0, "mentor/rescued": 1.0, "mentor/hinted_step": i,
                        "groups/all_fail_frac_after_mentor": frac / 2})
        rows.append(row)
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = {"method": "auto", "mentor": {"enable": mentor}, "data": {"jump_step": jump_step}}
    (folder / "config.yaml").write_text(yaml.safe_dump(cfg))
    return folder


def test_the_trailing_mean_weighs_each_step_by_its_group_count_and_never_looks_ahead():
    assert trailing_mean([1.0, 0.0, 0.5], [4, 4, 4], 2) == [1.0, 0.5, 0.25]
    # a step with 2 groups counts half as much as one with 4
    assert trailing_mean([1.0, 0.0], [2, 4], 2) == pytest.approx([1.0, 1 / 3])
    assert trailing_mean([1.0, 0.0], [4, 4], 1) == [1.0, 0.0]


def test_the_smoothed_curve_restarts_at_the_jump(tmp_path):
    _, rows, jump = read_run(_run(tmp_path / "m", [0.0, 0.0, 1.0, 1.0, 0.5, 0.0], mentor=True))
    steps, raw, smooth = all_fail_curve(rows, jump, window=4)
    assert steps == [1, 2, 3, 4, 5, 6] and raw == [0.0, 0.0, 1.0, 1.0, 0.5, 0.0]
    # step 3 is the first jumped step: its mean holds no easy step; step 6 averages steps 3-6
    assert smooth == [0.0, 0.0, 1.0, 1.0, pytest.approx(2.5 / 3), 0.625]


def test_report_draws_a_baseline_beside_the_run_and_prints_both_curves(tmp_path, capsys):
    mentor = _run(tmp_path / "train", [0.0, 0.25, 1.0, 1.0, 0.5, 0.0], counts=[4, 4, 4, 3, 3, 4], mentor=True)
    vanilla = _run(tmp_path / "vanilla", [0.0, 0.25, 1.0, 1.0, 1.0, 0.75])
    assert read_run(mentor)[0] == "MENTOR" and read_run(vanilla)[0] == "vanilla GRPO"
    assert main(["report", str(mentor), "--baseline", str(vanilla)]) == 0
    assert (mentor / "report.png").stat().st_size > 20_000
    lines = capsys.readouterr().out.splitlines()
    assert "MENTOR all-fail" in lines[0] and "vanilla GRPO all-fail" in lines[0]
    step6 = next(line for line in lines if line.split()[:1] == ["6"]).split()
    # MENTOR: raw 0.00, mean of steps 3-6 weighted 4,3,3,4 = (4 + 3 + 1.5 + 0) / 14; vanilla: 0.75, 0.94
    assert step6 == ["6", "0.00", f"{8.5 / 14:.2f}", "0.75", "0.94"]


def test_a_step_logged_twice_keeps_its_last_row(tmp_path):
    run = _run(tmp_path / "resumed", [0.0, 1.0, 1.0, 0.5])
    with (run / "metrics.jsonl").open("a") as f:  # a resumed run logs steps 3-4 again
        f.write(json.dumps({"step": 3, "groups/all_fail_frac": 0.75}) + "\n")
        f.write(json.dumps({"step": 4, "groups/all_fail_frac": 0.25}) + "\n")
    _, rows, _ = read_run(run)
    assert [(r["step"], r["groups/all_fail_frac"]) for r in rows] == [(1, 0.0), (2, 1.0), (3, 0.75), (4, 0.25)]


def test_report_names_a_folder_that_is_not_a_run(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["report", str(tmp_path / "nowhere")])
    assert "nowhere/metrics.jsonl: not found" in capsys.readouterr().err
