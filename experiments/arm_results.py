"""One arm's results per seed, for experiments/collapse.py: the summary of its post-jump metrics
(arm_summary), the results file every finished arm merges into (merge_result), and the machine's
load while it trains (LoadSampler).

The results file: {"setup": {...}, "arms": {ARM: {"seeds": {"SEED": arm_summary}}}}, read by
experiments/baselines_report.py.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from mentor_fast.checkpoint import list_checkpoints
from mentor_fast.metrics import read_metrics


def generated_tokens(row: dict, group: int) -> float:
    """Every token an arm decoded in one step: the initial rollouts, dynamic sampling's extra rounds
    and the method's re-rolls (MENTOR's and Scaf's, cut ones included). LUFFY's expert tokens were
    written, not decoded, and are not counted."""
    initial = row.get("response_length/mean", 0.0) * row["groups/count"] * group
    return initial + row.get("dynamic_sampling/extra_tokens", 0.0) + row.get("mentor/reroll_tokens", 0.0)


def post_jump_rows(rows: list[dict], steps: int) -> list[dict]:
    """Steps 1..steps of an arm's metrics.jsonl, the last row of each: a run restarted in the same
    folder appends to the file."""
    by_step = {r["step"]: r for r in rows if r["step"] <= steps}
    return [by_step[s] for s in sorted(by_step)]


def arm_summary(rows: list[dict], heldout_acc: float, wall_s: float, group: int,
                load: dict | None = None) -> dict:
    """The arm's numbers for one seed from its post-jump metrics rows. The first four are the
    comparison's; `curve` (all-fail fraction) and `gen_tokens_curve` are per step, for the plot
    against the step and against cumulative generated tokens (the equal-token comparison)."""
    mean = lambda key: statistics.mean(r.get(key, 0.0) for r in rows)
    total = lambda key: sum(r.get(key, 0.0) for r in rows)
    gen = [generated_tokens(r, group) for r in rows]
    rerolled = total("mentor/rerolls") > 0
    return {
        "post_jump_all_fail_frac": mean("groups/all_fail_frac"),
        "heldout_acc_no_hint": heldout_acc,
        "gen_tokens_per_step": statistics.mean(gen),
        "s_per_step": mean("timing_s/step"),
        "expert_tokens_per_step": mean("luffy/expert_tokens"),
        # metrics written before mentor/reroll_tokens existed: the re-rolls are missing from gen
        "reroll_tokens_missing": rerolled and not any("mentor/reroll_tokens" in r for r in rows),
        "post_jump_acc": mean("acc"),
        "post_jump_signal_yield": mean("signal_yield"),
        # groups the method took (MENTOR and Scaf: triggered; LUFFY: selected) and those it gave a
        # signal (rescued; LUFFY: a passing expert trace inserted)
        "triggered_total": total("mentor/triggered") + total("luffy/selected"),
        "rescued_total": total("mentor/rescued") + total("luffy/inserted"),
        "rerolls_total": total("mentor/rerolls"),
        "rerolls_cut_total": total("mentor/rerolls_cut"),
        "prompts_total": total("groups/count"),
        "prompts_skipped_total": total("mentor/prompts_skipped"),
        "groups_trained_total": sum(r["batch/sequences"] / group for r in rows),
        # groups with a signal: dynamic sampling's kept ones, else the initial groups neither all
        # failed nor all passed (binary rewards; a method's rescues are in rescued_total)
        "signal_groups_total": sum(r.get("dynamic_sampling/groups_kept", r["groups/count"] * (
            1.0 - r["groups/all_fail_frac"] - r["groups/all_pass_frac"])) for r in rows),
        "mean_gen_s": mean("timing_s/gen"),
        "mean_update_s": mean("timing_s/update"),
        "wall_s": wall_s,
        **(load or {"load_mean": None, "load_max": None}),
        "curve": [r["groups/all_fail_frac"] for r in rows],
        "gen_tokens_curve": gen,
    }


def is_current(summary: dict) -> bool:
    """False for an arm_summary.json written before the fields of arm_summary."""
    return "gen_tokens_per_step" in summary


def heldout_pass1(path: Path) -> float:
    """Sampled pass@1 from an evaluation's per-problem records (heldout.jsonl): the mean over
    problems of correct / n, as mentor_fast/evaluate.py computes it."""
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return statistics.mean(r["correct"] / r["n"] for r in records)


def refresh_summary(arm_dir: Path, earlier: dict, steps: int, group: int) -> dict:
    """An older arm_summary.json recomputed from the arm's metrics.jsonl and heldout.jsonl (else its
    stored held-out accuracy); its wall time is kept, its machine load is unknown."""
    rows = post_jump_rows(read_metrics(arm_dir / "metrics.jsonl"), steps)
    heldout = arm_dir / "heldout.jsonl"
    acc = heldout_pass1(heldout) if heldout.exists() else earlier["heldout_acc_no_hint"]
    return arm_summary(rows, acc, earlier["wall_s"], group)


def resume_point(arm_dir: Path, steps: int) -> Path | None:
    """The arm's last checkpoint of a step in 1..steps, to go on from (None: start afresh)."""
    usable = [c for c in list_checkpoints(arm_dir / "checkpoints") if int(c.name.split("_")[1]) <= steps]
    return usable[-1] if usable else None


def earlier_wall(rows: list[dict], ckpt: Path) -> float:
    """Seconds the steps up to a resumed checkpoint took in the runs before (their timing_s/step; the
    start-up of those runs is not in it)."""
    upto = int(ckpt.name.split("_")[1])
    return sum(r.get("timing_s/step", 0.0) for r in rows if r["step"] <= upto)


def source_commit() -> str | None:
    """The commit of the code that runs ("+dirty" when tracked files differ from it), so each seed in a
    results file says which code produced it; None outside a git checkout."""
    here = str(Path(__file__).resolve().parent)

    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", here, *args], capture_output=True, text=True, check=True,
                              timeout=30).stdout.strip()

    try:
        rev = git("rev-parse", "--short=12", "HEAD")
        dirty = git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.SubprocessError):
        return None
    return rev + ("+dirty" if dirty else "")


def merge_result(path: Path, setup: dict, arm: str, seed: int, entry: dict) -> None:
    """Adds one arm's seed to the results file, written to a temporary file and renamed over it, so
    that the file is whole after every write and a run cut short keeps every arm it finished."""
    results = json.loads(path.read_text()) if path.exists() else {"setup": setup, "arms": {}}
    results["setup"] = setup
    results["arms"].setdefault(arm, {"seeds": {}})["seeds"][str(seed)] = entry
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(results, indent=1))
    os.replace(tmp, path)


def write_summary(setup: dict, per_arm: dict[str, list[dict]], pre_rows: list[dict], walls: dict,
                  out: Path) -> dict:
    """DIR/summary.json (per arm: the means over seeds and each seed's summary; the ratios of each arm
    to vanilla when vanilla ran) and DIR/collapse.png."""
    summary: dict = {"setup": setup, "wall_s": walls}
    for arm, seeds in per_arm.items():
        # the numbers every seed has (not flags, lists or None: an arm picked up by --reuse has no
        # machine load)
        keys = [k for k, v in seeds[0].items() if type(v) in (int, float)
                and all(type(s.get(k)) in (int, float) for s in seeds)]
        summary[arm] = {k: statistics.mean(s[k] for s in seeds) for k in keys} | {"per_seed": seeds}
    if "vanilla" in per_arm:
        v = summary["vanilla"]
        ratio = lambda a, b: a / b if b else None
        summary["ratios"] = {}
        for arm in [a for a in per_arm if a != "vanilla"]:
            summary["ratios"][f"all_fail_{arm}_over_vanilla"] = ratio(
                summary[arm]["post_jump_all_fail_frac"], v["post_jump_all_fail_frac"])
            summary["ratios"][f"step_time_{arm}_over_vanilla"] = ratio(summary[arm]["s_per_step"], v["s_per_step"])
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    plot(per_arm, pre_rows, out / "collapse.png")
    return summary


def plot(per_arm: dict[str, list[dict]], pre_rows: list[dict], out_png: Path) -> None:
    """The initial-rollout all-fail fraction against the step: the shared warm-up, then every seed
    of every arm."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    k = len(pre_rows)
    ax.plot(range(1, k + 1), [r["groups/all_fail_frac"] for r in pre_rows], color="gray", marker="o",
            label="warm-up (shared)")
    colors = plt.get_cmap("tab10")
    for i, (arm, seeds) in enumerate(per_arm.items()):
        for s, per_seed in enumerate(seeds):
            curve = per_seed["curve"]
            ax.plot(range(k + 1, k + 1 + len(curve)), curve, color=colors(i), marker=".", alpha=0.8,
                    label=arm if s == 0 else None)
    ax.axvline(k + 0.5, ls="--", color="k", lw=1)
    ax.set_xlabel("step")
    ax.set_ylabel("all-fail fraction (initial rollouts)")
    ax.set_ylim(-0.05, 1.05)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out_png, dpi=110)
    plt.close(fig)


@contextmanager
def machine_load(every_s: float = 30.0) -> Iterator[dict]:
    """The 1-minute load average, sampled every `every_s` seconds in a daemon thread while the block
    runs; the dict it yields gets load_mean and load_max when the block ends. On the 2-core machine a
    quiet run reads about 2: more means something else ran, and the step times are not clean."""
    samples: list[float] = []
    stop = threading.Event()

    def sample() -> None:
        while True:
            samples.append(os.getloadavg()[0])
            if stop.wait(every_s):
                return

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    load: dict = {"load_mean": None, "load_max": None}
    try:
        yield load
    finally:
        stop.set()
        thread.join()  # the thread samples once before it first waits: samples is never empty
        load.update(load_mean=statistics.mean(samples), load_max=max(samples))
