"""A step's metrics and their sinks: the initial groups' and the batch's metrics from exact sums over
ranks (group_metrics, batch_metrics), how the other per-rank metrics are reduced, and the sinks:
metrics.jsonl (always), TensorBoard, W&B (when installed and asked for), a rich progress bar, and
report.png at the end of a run."""

from __future__ import annotations

import json
import math
import resource
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from mentor_fast.compat import StrEnum

if TYPE_CHECKING:
    from mentor_fast.algo.batch import TrainBatch
    from mentor_fast.dist import Dist
    from mentor_fast.types import Group


def peak_rss_gb() -> float:
    """This process's peak resident memory (Linux reports ru_maxrss in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def peak_mem_gb() -> float:
    if torch.cuda.is_available():
        return torch.cuda.max_memory_allocated() / 2**30
    return peak_rss_gb()


def to_scalars(metrics: dict[str, Any]) -> dict[str, float]:
    """Tensors are reduced once per step, here, never inside the micro-batch loop."""
    out = {}
    for k, v in metrics.items():
        if isinstance(v, torch.Tensor):
            v = v.detach().float().item()
        if isinstance(v, (int, float)):  # bool included
            out[k] = float(v)
    return out


class Reduce(StrEnum):
    """How a per-rank metric becomes the run's (reduce_metrics)."""

    SUM = "sum"  # counts
    MAX = "max"  # times and lags: the slowest rank's
    MIN = "min"
    SHARED = "shared"  # the same on every rank already (a global plan): rank 0's
    MEAN = "mean"  # per-rollout means and rates: every rank holds the same number of prompts


@dataclass(frozen=True)
class Reduction:
    """A metric's reduction over ranks; a method declares its own (Method.metrics)."""

    how: Reduce = Reduce.SUM
    weight: str = ""  # MEAN weighted by this metric of each rank (e.g. a group count)
    timing: bool = False  # depends on wall-clock time or the machine, not on the computation


_MAX_PREFIXES = ("timing_s/", "perf/", "off_policy/")
_MAX_SUFFIXES = ("_max", "_mb")  # sizes are per rank (each rank syncs its own engine): the largest
_MEAN_SUFFIXES = ("/mean", "_frac", "_rate")
_SHARED = {"trainer/skipped_step"}


def _rule(key: str) -> Reduction:
    """The trainer's own metrics: counts summed unless the name says otherwise."""
    if key in _SHARED:
        return Reduction(Reduce.SHARED)
    if key.startswith(_MAX_PREFIXES) or key.endswith(_MAX_SUFFIXES):
        return Reduction(Reduce.MAX)
    if key.endswith(_MEAN_SUFFIXES):
        return Reduction(Reduce.MEAN)
    return Reduction(Reduce.SUM)


def reduce_metrics(dist, metrics: dict[str, float], declared: Mapping[str, Reduction] | None = None
                   ) -> dict[str, float]:
    """Every rank's metrics -> the run's: a metric `declared` names (the method's) as declared, the
    others by their names: counts summed, times, lags and sizes the largest rank's, per-rollout means and
    rates averaged over the ranks that report them (each rank holds the same number of prompts).
    Every rank calls it; with one rank it is the identity. (The trainer computes the initial
    groups' and the batch's metrics from exact sums instead: group_metrics, batch_metrics.)"""
    if not dist.enabled:
        return metrics
    declared = declared or {}
    parts = dist.gather(metrics)
    keys = list(dict.fromkeys(k for part in parts for k in part))
    out = {}
    for k in keys:
        values = [part.get(k) for part in parts]
        present = [v for v in values if v is not None]
        rule = declared.get(k) or _rule(k)
        if rule.how == Reduce.SHARED:
            out[k] = present[0]
        elif rule.how == Reduce.MAX:
            out[k] = max(present)
        elif rule.how == Reduce.MIN:
            out[k] = min(present)
        elif rule.how == Reduce.MEAN and rule.weight:
            w = [part.get(rule.weight, 0.0) for part in parts]
            total = sum(w)
            out[k] = sum(v * c for v, c in zip(values, w) if v is not None) / total if total else 0.0
        elif rule.how == Reduce.MEAN:
            out[k] = sum(present) / len(present)
        else:
            out[k] = sum(present)
    return out


class MetricsLogger:
    def __init__(self, out_dir: Path, tensorboard: bool, wandb: bool, config: dict, progress_total: int,
                 progress: bool, start_step: int = 0):
        self.path = out_dir / "metrics.jsonl"
        self._file = self.path.open("a")
        self._tb = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(log_dir=str(out_dir / "tensorboard"))
        self._wandb = None
        if wandb:
            try:
                import wandb as wandb_mod
            except ImportError as e:
                raise ImportError("trainer.wandb=true needs the wandb package: pip install wandb") from e
            self._wandb = wandb_mod.init(project="mentor-fast", dir=str(out_dir), config=config)
        self._progress = None
        if progress and sys.stderr.isatty():
            from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

            self._progress = Progress(
                TextColumn("[bold]train"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn(), TextColumn("{task.fields[info]}"),
            )
            self._progress.start()
            self._task = self._progress.add_task("train", total=progress_total, completed=start_step, info="")

    def log(self, step: int, row: dict[str, float]) -> None:
        row = {"step": step, **{k: v for k, v in row.items() if not math.isnan(v)}}
        self._file.write(json.dumps(row) + "\n")
        self._file.flush()
        if self._tb is not None:
            for k, v in row.items():
                if k != "step":
                    self._tb.add_scalar(k, v, step)
            self._tb.flush()
        if self._wandb is not None:
            self._wandb.log(row, step=step)
        info = (f"reward {row.get('reward/mean', float('nan')):.3f}  acc {row.get('acc', float('nan')):.3f}  "
                f"all-fail {row.get('groups/all_fail_frac', float('nan')):.2f}  "
                f"{row.get('timing_s/step', float('nan')):.1f}s/step")
        if self._progress is not None:
            self._progress.update(self._task, completed=step, info=info)
        else:
            print(f"step {step}: {info}", file=sys.stderr, flush=True)

    def close(self) -> None:
        self._file.close()
        if self._tb is not None:
            self._tb.close()
        if self._wandb is not None:
            self._wandb.finish()
        if self._progress is not None:
            self._progress.stop()


def read_metrics(path: Path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def trailing_mean(values: list[float], weights: list[float], window: int) -> list[float]:
    """Each point's mean over itself and the window - 1 points before it, weighted (by each step's
    group count: a step that skipped prompts for re-rolls weighs less). Trailing, so a point never
    sees later steps."""
    out = []
    for i in range(len(values)):
        v, w = values[max(0, i - window + 1):i + 1], weights[max(0, i - window + 1):i + 1]
        out.append(sum(x * c for x, c in zip(v, w)) / sum(w) if sum(w) else sum(v) / len(v))
    return out


def read_run(run: Path) -> tuple[str, list[dict], int]:
    """A run folder's label (its method), metrics rows and jump step (-1: none), from its metrics.jsonl
    and the resolved config.yaml beside it. A step logged twice (a resumed run trains again the steps
    after its checkpoint) keeps its last row."""
    import yaml

    rows = sorted({r["step"]: r for r in read_metrics(run / "metrics.jsonl")}.values(), key=lambda r: r["step"])
    cfg_path = run / "config.yaml"
    cfg = yaml.safe_load(cfg_path.read_text()) if cfg_path.exists() else {}
    method = str(cfg.get("method", "auto"))
    if method == "auto":
        method = "mentor" if cfg.get("mentor", {}).get("enable") or any("mentor/triggered" in r for r in rows) else "grpo"
    label = {"mentor": "MENTOR", "grpo": "vanilla GRPO"}.get(method, method)
    return label, rows, int(cfg.get("data", {}).get("jump_step", -1))


def all_fail_curve(rows: list[dict], jump_step: int, window: int) -> tuple[list[int], list[float], list[float]]:
    """Steps, the initial (unhinted) rollouts' all-fail fraction, and its trailing mean over `window`
    steps, restarted at the jump so that easy steps do not dilute the first jumped ones."""
    pts = [(r["step"], r["groups/all_fail_frac"], r.get("groups/count", 1.0)) for r in rows
           if "groups/all_fail_frac" in r]
    steps = [s for s, _, _ in pts]
    raw = [f for _, f, _ in pts]
    cut = next((i for i, s in enumerate(steps) if 0 <= jump_step <= s), len(steps))
    smooth = []
    for lo, hi in ((0, cut), (cut, len(steps))):
        smooth += trailing_mean(raw[lo:hi], [c for _, _, c in pts[lo:hi]], window)
    return steps, raw, smooth


def all_fail_table(runs: list[tuple[str, list[dict], int]], window: int) -> str:
    """Per step, each run's unhinted all-fail fraction and its trailing mean, as text."""
    curves = []
    for _, rows, jump in runs:
        steps, raw, smooth = all_fail_curve(rows, jump, window)
        curves.append({s: (r, m) for s, r, m in zip(steps, raw, smooth)})
    head = "step" + "".join(f"  {label + ' all-fail':>22} {f'{window}-step mean':>12}" for label, _, _ in runs)
    lines = [head]
    for step in sorted({s for c in curves for s in c}):
        cells = [c.get(step) for c in curves]
        lines.append(f"{step:>4}" + "".join(f"  {v[0]:>22.2f} {v[1]:>12.2f}" if v else f"  {'-':>22} {'-':>12}"
                                             for v in cells))
    return "\n".join(lines)


def write_report(metrics_path: Path, out_png: Path, title: str = "", baseline: Path | None = None,
                 window: int = 4) -> None:
    """Reward and accuracy, the all-fail fraction of the initial rollouts (raw and its trailing mean
    over `window` steps), and with MENTOR the same groups after its re-rolls were assembled, and its
    triggered and rescued groups per step. `baseline`, another run's folder (e.g. vanilla GRPO from
    the same seed), is drawn beside it. The mentor's results are drawn at the step whose groups they
    helped (`mentor/hinted_step`: with async MENTOR, step t's failures are re-rolled and reported at
    step t+1)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    label, rows, jump = read_run(Path(metrics_path).parent)
    other = read_run(baseline) if baseline is not None else None
    mentor = [r for r in rows if "mentor/triggered" in r]
    fig, axes = plt.subplots(1, 3 if mentor else 2, figsize=(15 if mentor else 10, 4.2))
    series = lambda rs, key: [(r["step"], r[key]) for r in rs if key in r]
    ax = axes[0]
    for key, name in (("reward/mean", "reward"), ("acc", "accuracy")):
        if pts := series(rows, key):
            ax.plot(*zip(*pts), marker="o", ms=3, label=f"{label} {name}" if other else name)
    if other and (pts := series(other[1], "acc")):
        ax.plot(*zip(*pts), marker="o", ms=3, color="black", ls="--", label=f"{other[0]} accuracy")
    if pts := series(rows, "eval/pass@1"):
        ax.plot(*zip(*pts), marker="s", ms=4, label="held-out pass@1")
    ax.set_title("reward (initial rollouts)")
    _draw_all_fail(axes[1], (label, rows, jump), other, mentor, window)
    if mentor:
        ax = axes[2]
        steps = [r.get("mentor/hinted_step", r["step"]) for r in mentor]
        ax.bar(steps, [r["mentor/triggered"] for r in mentor], color="lightgray", label="triggered")
        ax.bar(steps, [r.get("mentor/rescued", 0.0) for r in mentor], color="tab:green", label="rescued")
        ax.set_title(f"MENTOR: {sum(r.get('mentor/rescued', 0.0) for r in mentor):.0f} of "
                     f"{sum(r['mentor/triggered'] for r in mentor):.0f} groups rescued")
    for ax in axes:
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        if jump >= 0:
            ax.axvline(jump - 0.5, color="gray", ls=":", lw=1)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(out_png, dpi=110)
    plt.close(fig)


def _draw_all_fail(ax, run, other, mentor: list[dict], window: int) -> None:
    """The unhinted all-fail fraction of the run (and of `other`), raw and as a trailing mean; with
    MENTOR, the same groups after its re-rolls."""
    for (label, rows, jump), color in ((run, "tab:red"), *(((other, "black"),) if other else ())):
        steps, raw, smooth = all_fail_curve(rows, jump, window)
        if steps:
            ax.plot(steps, raw, marker="o", ms=3, lw=0.8, alpha=0.4, color=color)
            ax.plot(steps, smooth, lw=2.2, color=color, label=f"{label}, unhinted ({window}-step mean)")
    after = [(r.get("mentor/hinted_step", r["step"]), r["groups/all_fail_frac_after_mentor"])
             for r in mentor if "groups/all_fail_frac_after_mentor" in r]
    if after:
        ax.plot(*zip(*after), ls="", marker="x", ms=4, color="tab:blue", label="after MENTOR's re-rolls")
    if run[2] >= 0:
        ax.text(run[2] - 0.3, 1.0, "jump", fontsize=7, color="gray", ha="right", va="top")
    ax.set_ylim(-0.05, 1.05)
    ax.set_title("groups whose rollouts all fail")


def group_metrics(groups: list[Group], dist: Dist | None = None) -> dict[str, float]:
    """Metrics of the initial (unhinted) rollouts, over every rank's groups."""
    rollouts = [r for g in groups for r in g.rollouts]
    rewards = [r.reward for r in rollouts]
    lens = [len(r.completion_ids) for r in rollouts]
    sums = [len(groups), len(rollouts), sum(rewards), sum(x * x for x in rewards), sum(r.correct for r in rollouts),
            sum(g.all_fail for g in groups), sum(g.all_pass for g in groups), sum(lens),
            sum(r.truncated for r in rollouts)]
    if dist is not None and dist.enabled:
        sums = dist.sum(sums).tolist()
        longest = float(dist.max([max(lens, default=0)])[0])
    else:
        longest = float(max(lens, default=0))
    n_groups, n, reward, reward_sq, correct, all_fail, all_pass, length, truncated = sums
    if not n:
        return {"groups/count": float(n_groups)}
    mean = reward / n
    return {
        "reward/mean": mean,
        "reward/std": max(0.0, reward_sq / n - mean * mean) ** 0.5,
        "acc": correct / n,
        "groups/count": n_groups,
        "groups/all_fail_frac": all_fail / n_groups,
        "groups/all_pass_frac": all_pass / n_groups,
        "response_length/mean": length / n,
        "response_length/max": longest,
        "response_length/clip_frac": truncated / n,
    }


def batch_metrics(batch: TrainBatch, dist: Dist | None = None) -> dict[str, float]:
    """signal_yield: the share of generated tokens whose advantage is non-zero (i.e. that teach)."""
    lens = batch.completion_lens.double()
    sums = [float(lens.sum()), float((lens * (batch.advantages != 0).double()).sum()), float(batch.num_seqs)]
    if dist is not None and dist.enabled:
        sums = dist.sum(sums).tolist()
    total, useful, seqs = sums
    return {"signal_yield": useful / total if total else 0.0, "batch/tokens": total, "batch/sequences": seqs}
