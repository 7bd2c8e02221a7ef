#!/usr/bin/env python
"""The arms of a collapse experiment side by side, from its results file (experiments/collapse.py
--results): a markdown table on stdout and, with --plot, a figure.

    .venv/bin/python experiments/baselines_report.py experiments/results/baselines_math.json --plot math.png

The table, per arm over its seeds: the mean of the four numbers and their spread (min-max for two
seeds, the standard deviation for three or more), the all-fail fraction as a ratio to vanilla's
(over the seeds both ran) and so the step time (seeds run on different machines compare through it),
the number of seeds, and the mean machine load while the arm trained
(about 2 on a quiet 2-core machine; more, and its step times are not clean), and the commit of the code
each seed ran ("-" for seeds run before it was recorded); --max-load L takes the step times only from the
seeds on which the arm and vanilla trained at a mean load of at most L. With --per-seed, a second table gives every
arm and seed on its own row; with --intervals, a third gives each arm's mean with its 95% bootstrap
interval and MENTOR's paired difference to each baseline (same seeds) with its interval, the seeds on
which it is positive and the exact sign-flip test's p-value, Holm-adjusted over the baselines; a
difference is called supported only over 6 or more seeds, with the interval off 0 and the adjusted
p < 0.05. The figure: the all-fail fraction of the initial rollouts, mean over seeds, against the
post-jump step and against the cumulative generated tokens (arms compared at equal generation).
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
from pathlib import Path

# key, column, decimals
METRICS = (
    ("post_jump_all_fail_frac", "all-fail frac", 3),
    ("heldout_acc_no_hint", "held-out acc, no hint", 3),
    ("gen_tokens_per_step", "generated tokens / step", 0),
    ("s_per_step", "s / step", 1),
)


def spread(values: list[float], decimals: int) -> str:
    """`mean`, `mean (min-max)` for two values, `mean ± std` for three or more."""
    f = lambda x: f"{x:.{decimals}f}"
    mean = statistics.mean(values)
    if len(values) >= 3:
        return f"{f(mean)} ± {f(statistics.stdev(values))}"
    if len(values) == 2:
        return f"{f(mean)} ({f(min(values))}-{f(max(values))})"
    return f(mean)


def vs_vanilla(arms: dict, arm: str, key: str = "post_jump_all_fail_frac",
               seeds: list[str] | None = None) -> float | None:
    """The arm's mean of `key` over vanilla's, on the seeds both ran, of `seeds` if given (None: no such
    seed, or vanilla's mean is 0). Seeds run on different machines compare through this ratio, not
    through raw times."""
    vanilla = arms.get("vanilla", {"seeds": {}})["seeds"]
    mine = arms[arm]["seeds"]
    common = [s for s in (mine if seeds is None else seeds) if s in vanilla]
    if not common:
        return None
    v = statistics.mean(vanilla[s][key] for s in common)
    return statistics.mean(mine[s][key] for s in common) / v if v else None


def ratio_cell(ratio: float | None) -> str:
    return "-" if ratio is None else f"{ratio:.2f}x"


def quiet(row: dict, max_load: float | None) -> bool:
    """Whether an arm-seed's step time is clean: the machine's mean load while it trained at most
    `max_load` (None: every row counts)."""
    return max_load is None or (row.get("load_mean") is not None and row["load_mean"] <= max_load)


def quiet_seeds(arms: dict, arm: str, max_load: float | None) -> list[str]:
    """The seeds on which the arm and vanilla both trained on a quiet machine (all of the arm's seeds
    without a limit)."""
    vanilla = arms.get("vanilla", {"seeds": {}})["seeds"]
    return [k for k, row in arms[arm]["seeds"].items()
            if quiet(row, max_load) and (max_load is None or (k in vanilla and quiet(vanilla[k], max_load)))]


def table(results: dict, max_load: float | None = None) -> str:
    """Per arm, the means and spreads over its seeds. With `max_load`, the step time and its ratio to
    vanilla's are taken only over the seeds on which the arm and vanilla both ran at most that load,
    and the column says how many of the arm's seeds that is."""
    arms = results["arms"]
    timed = "s / step" if max_load is None else f"s / step, load <= {max_load:g} (seeds)"
    head = ["arm", "seeds", *(name for _, name, _ in METRICS[:-1]), timed, "all-fail / vanilla",
            "s / step / vanilla", "load", "code"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    incomplete = False
    for arm, entry in arms.items():
        seeds = list(entry["seeds"].values())
        loads = [s["load_mean"] for s in seeds if s.get("load_mean") is not None]
        clean = quiet_seeds(arms, arm, max_load)
        steps = [entry["seeds"][k]["s_per_step"] for k in clean]
        step_cell = spread(steps, METRICS[-1][2]) if steps else "-"
        if max_load is not None:
            step_cell += f" ({len(steps)})"
        name = arm
        if any(s.get("reroll_tokens_missing") for s in seeds):
            name, incomplete = arm + " *", True
        cells = [name, str(len(seeds)), *(spread([s[key] for s in seeds], d) for key, _, d in METRICS[:-1]),
                 step_cell, ratio_cell(vs_vanilla(arms, arm)),
                 ratio_cell(vs_vanilla(arms, arm, "s_per_step", clean) if clean else None),
                 f"{statistics.mean(loads):.1f}" if loads else "-",
                 commits(seeds)]
        lines.append("| " + " | ".join(cells) + " |")
    if incomplete:
        lines.append("\n\\* metrics written before mentor/reroll_tokens: its re-roll tokens are not counted")
    return "\n".join(lines)


def commits(seeds: list[dict]) -> str:
    """The distinct commits the seeds ran at, in seed order ("-" where none was recorded)."""
    return ", ".join(dict.fromkeys((s.get("commit") or "-")[:7] for s in seeds))


def per_seed_table(results: dict) -> str:
    head = ["arm", "seed", *(name for _, name, _ in METRICS), "s / step / vanilla", "load", "code"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for arm, entry in results["arms"].items():
        for seed, s in sorted(entry["seeds"].items(), key=lambda kv: int(kv[0])):
            load = s.get("load_mean")
            cells = [arm, seed, *(f"{s[key]:.{d}f}" for key, _, d in METRICS),
                     ratio_cell(vs_vanilla(results["arms"], arm, "s_per_step", [seed])),
                     "-" if load is None else f"{load:.1f}", commits([s])]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def bootstrap_ci(values: list[float], *, level: float = 0.95, draws: int = 10_000, seed: int = 0) -> tuple[float, float]:
    """The percentile bootstrap interval of the mean of `values` (seeds drawn with replacement; a fixed
    generator, so the report is the same each time it is made)."""
    import numpy as np

    x = np.asarray(values, dtype=float)
    if len(x) < 2:
        return float("nan"), float("nan")
    means = x[np.random.default_rng(seed).integers(0, len(x), (draws, len(x)))].mean(1)
    tail = (1 - level) / 2 * 100
    return float(np.percentile(means, tail)), float(np.percentile(means, 100 - tail))


INTERVAL_METRICS = METRICS[:2]  # the efficacy numbers (all-fail, held-out); the rest are costs
MIN_SEEDS_TO_RANK = 6  # the sign-flip test's smallest p is 2 / 2^n: under 6 seeds it cannot reach 0.05


def sign_flip_p(diffs: list[float]) -> float:
    """The exact two-sided p-value of the paired sign-flip (permutation) test of a zero mean difference:
    under "the arms are the same", each seed's difference is as likely negated, so the p-value is the
    share of the 2^n sign patterns whose mean is at least as far from 0 as the observed one. Exact for
    any n (all patterns enumerated up to 2^16, a fixed-seed sample of 200,000 beyond) and free of the
    normal approximation that a t-interval over 8 seeds would lean on."""
    import numpy as np

    x = np.asarray(diffs, dtype=float)
    if len(x) == 0:
        return float("nan")
    if len(x) <= 16:
        signs = 1 - 2 * ((np.arange(2 ** len(x))[:, None] >> np.arange(len(x))) & 1)
    else:
        signs = np.random.default_rng(0).choice([-1, 1], size=(200_000, len(x)))
    observed = abs(x.mean())
    return float((np.abs((signs * x).mean(1)) >= observed - 1e-12).mean())


def holm(pvalues: dict[str, float]) -> dict[str, float]:
    """Holm's step-down adjustment of a family of p-values (MENTOR against each baseline on one metric):
    the smallest times m, the next times m - 1, ..., each at least the one before; a family-wise error
    of 5% when each adjusted p is read against 0.05."""
    order = sorted(pvalues, key=pvalues.get)
    out, running = {}, 0.0
    for i, name in enumerate(order):
        running = max(running, min(1.0, (len(order) - i) * pvalues[name]))
        out[name] = running
    return out


def paired_verdict(diffs: list[float], lo: float, hi: float, p: float, p_family: float, family: int) -> str:
    """What the data say of a paired difference: "supported" needs enough seeds, a 95% bootstrap
    interval that excludes 0, and the exact sign-flip test at p < 0.05 after Holm's adjustment over the
    `family` baselines compared on the metric. The checks guard each other: the percentile bootstrap is
    too narrow over few seeds (over 2 it is their min-max), the test alone says nothing of the size,
    and four comparisons at 5% each would find a difference by chance one time in six."""
    ahead = sum(d > 0 for d in diffs)
    if len(diffs) < MIN_SEEDS_TO_RANK:
        return f"{ahead} of {len(diffs)} seeds > 0; too few seeds to rank"
    verdict = "supported" if (lo > 0 or hi < 0) and p_family < 0.05 else "not supported"
    held = f", Holm over {family}: {p_family:.3f}" if family > 1 else ""
    return f"{ahead} of {len(diffs)} seeds > 0, sign-flip p = {p:.3f}{held}; {verdict}"


def paired_diffs(results: dict, ref: str, key: str) -> dict[str, list[float]]:
    """Per arm but `ref`, `ref` minus it on the seeds both ran, in seed order (arms sharing fewer than
    two seeds with `ref` left out)."""
    arms = results["arms"]
    if ref not in arms:
        return {}
    out = {}
    for arm, entry in arms.items():
        common = sorted(set(entry["seeds"]) & set(arms[ref]["seeds"]), key=int)
        if arm != ref and len(common) >= 2:
            out[arm] = [arms[ref]["seeds"][k][key] - entry["seeds"][k][key] for k in common]
    return out


def intervals_table(results: dict, ref: str = "mentor") -> str:
    """Per arm and efficacy metric, the mean over seeds with its 95% bootstrap interval; per baseline,
    `ref` minus it on the seeds both ran (paired, so a seed's shared start cancels) with its interval,
    on how many seeds it is positive, the exact sign-flip p-value (Holm-adjusted over the baselines
    ranked on that metric), and whether the data support a difference (`paired_verdict`)."""
    arms = results["arms"]
    cells_of: dict[tuple[str, str], str] = {}
    for key, _, d in INTERVAL_METRICS:
        diffs = paired_diffs(results, ref, key)
        p = {arm: sign_flip_p(x) for arm, x in diffs.items() if len(x) >= MIN_SEEDS_TO_RANK}
        p_family = holm(p)
        for arm, x in diffs.items():
            lo, hi = bootstrap_ci(x)
            verdict = paired_verdict(x, lo, hi, p.get(arm, 1.0), p_family.get(arm, 1.0), len(p))
            cells_of[arm, key] = f"{statistics.mean(x):+.{d}f} [{lo:+.{d}f}, {hi:+.{d}f}] ({verdict})"
    head = ["arm", "seeds"] + [f"{name}: mean [95% CI]" for _, name, _ in INTERVAL_METRICS]
    head += [f"{ref} - arm, {name} [95% CI]" for _, name, _ in INTERVAL_METRICS]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for arm, entry in arms.items():
        seeds = entry["seeds"]
        cells = [arm, str(len(seeds))]
        for key, _, d in INTERVAL_METRICS:
            vals = [s[key] for s in seeds.values()]
            lo, hi = bootstrap_ci(vals)
            cells.append(f"{statistics.mean(vals):.{d}f} [{lo:.{d}f}, {hi:.{d}f}]")
        cells += [cells_of.get((arm, key), "-") for key, _, _ in INTERVAL_METRICS]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def describe(results: dict) -> str:
    setup = results["setup"]
    machine = setup.get("machine", {})
    return (f"task {setup.get('task')}, jump to level {setup.get('jump_level')}, {setup.get('post_steps')} "
            f"post-jump steps; {machine.get('cpu', 'cpu unknown')}, torch {machine.get('torch', '?')}")


def mean_curve(curves: list[list[float]]) -> list[float]:
    """Step by step mean over seeds, as long as the shortest curve."""
    return [statistics.mean(values) for values in zip(*curves)]


def trailing_mean(curve: list[float], window: int) -> list[float]:
    """Each step's mean over itself and the window - 1 steps before it (fewer at the start): one step's
    all-fail fraction over 4 groups moves in quarters, and the arms' lines cross at every step."""
    return [statistics.mean(curve[max(0, i + 1 - window):i + 1]) for i in range(len(curve))]


def plot(results: dict, out_png: Path, window: int = 1) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (by_step, by_tokens) = plt.subplots(1, 2, figsize=(12, 4.2), sharey=True)
    for arm, entry in results["arms"].items():
        seeds = list(entry["seeds"].values())
        fail = trailing_mean(mean_curve([s["curve"] for s in seeds]), window)
        tokens = list(itertools.accumulate(mean_curve([s["gen_tokens_curve"] for s in seeds])))
        by_step.plot(range(1, len(fail) + 1), fail, marker=".", label=f"{arm} ({len(seeds)})")
        by_tokens.plot(tokens, fail, marker=".", label=f"{arm} ({len(seeds)})")
    by_step.set_xlabel("post-jump step")
    over = f", trailing mean of {window} steps" if window > 1 else ""
    by_step.set_ylabel(f"all-fail fraction (initial rollouts)\nmean over seeds{over}")
    by_tokens.set_xlabel("generated tokens, cumulative (mean over seeds), log scale")
    by_tokens.set_xscale("log")  # dynamic sampling decodes several times what the others do
    for ax in (by_step, by_tokens):
        ax.set_ylim(-0.05, 1.05)
        ax.grid(alpha=0.3)
    by_step.legend(fontsize=8, title="arm (seeds)", title_fontsize=8)
    fig.suptitle(describe(results), fontsize=9)
    fig.tight_layout()
    fig.savefig(out_png, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("results", type=Path, help="a results file of experiments/collapse.py")
    p.add_argument("--plot", type=Path, default=None, metavar="OUT.png")
    p.add_argument("--per-seed", action="store_true", help="also a table with one row per arm and seed")
    p.add_argument("--intervals", action="store_true",
                   help="also each arm's mean with its 95%% bootstrap interval, and MENTOR's paired difference "
                        "to each baseline with its interval")
    p.add_argument("--max-load", type=float, default=None, metavar="L",
                   help="step times only from arm-seeds (and their vanilla) trained at a mean load of at most L "
                        "(about 2 is a quiet 2-core machine)")
    p.add_argument("--smooth", type=int, default=4, metavar="K",
                   help="plot each step's all-fail fraction as the mean of the last K steps (1: raw)")
    args = p.parse_args(argv)
    results = json.loads(args.results.read_text())
    print(f"{args.results}: {describe(results)}\n")
    print(table(results, args.max_load))
    if args.per_seed:
        print("\n" + per_seed_table(results))
    if args.intervals:
        print("\n" + intervals_table(results))
    if args.plot is not None:
        plot(results, args.plot, args.smooth)


if __name__ == "__main__":
    main()
