"""`mentor-fast train | sft | eval | bench | report | serve | prepare-model`."""

from __future__ import annotations

import argparse
import os
import sys
import traceback

from mentor_fast.config import ConfigError, load_config


def _train(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="mentor-fast train", description="Run GRPO (+ MENTOR) training.")
    p.add_argument("--config", action="append", default=[], help="YAML file(s); later files win")
    p.add_argument("--resume", nargs="?", const="auto", default=None,
                   help="resume from the latest checkpoint in output_dir, or from the given checkpoint folder")
    p.add_argument("--dry-run", action="store_true", help="validate and print the resolved config, then exit")
    p.add_argument("--nproc", type=int, default=0, metavar="N",
                   help="train on N ranks of this node: runs `torchrun --standalone --nproc-per-node N -m "
                        "mentor_fast train ...` (one process per device; on the CPU, gloo and one thread each)")
    p.add_argument("overrides", nargs="*", help="key.sub=value overrides, applied last")
    args = p.parse_args(argv)
    cfg = load_config(args.config, args.overrides)  # a bad key fails here, before any rank starts
    if args.nproc > 1 and "WORLD_SIZE" not in os.environ:
        return _torchrun(args.nproc, _without_nproc(argv), cfg.output_dir)
    if args.dry_run:
        import yaml

        from mentor_fast.config import to_dict

        print(yaml.safe_dump(to_dict(cfg), sort_keys=False))
        return 0
    from mentor_fast.trainer import Trainer

    out = Trainer(cfg, resume=args.resume).fit()
    if os.environ.get("RANK", "0") == "0":
        print(f"run folder: {out}")
    return 0


def _without_nproc(argv: list[str]) -> list[str]:
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a == "--nproc":
            skip = True
        elif not a.startswith("--nproc="):
            out.append(a)
    return out


def _torchrun(nproc: int, argv: list[str], output_dir: str) -> int:
    """The same command on `nproc` local ranks; torchrun stops every rank when one fails, and its
    summary names the rank that failed first. This adds the step each rank was in."""
    import subprocess
    from pathlib import Path

    marks = Path(output_dir) / "ranks"
    for old in marks.glob("rank_*.step"):
        old.unlink()
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
           "-m", "mentor_fast", "train", *argv]
    code = subprocess.run(cmd, check=False).returncode
    if code != 0:
        steps = {int(p.stem.split("_")[1]): p.read_text().strip() for p in marks.glob("rank_*.step")}
        where = ", ".join(f"rank {r} at step {steps[r]}" for r in sorted(steps)) or "before the first step"
        print(f"error: the {nproc}-rank run stopped (torchrun exit {code}): {where}; torchrun's summary "
              "above names the rank that failed first", file=sys.stderr)
    return code


def _prepare_model(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="mentor-fast prepare-model",
                                description="Dequantize the embedded SmolLM2-135M-Instruct once into the cache.")
    p.add_argument("--force", action="store_true")
    args = p.parse_args(argv)
    from mentor_fast.models import prepare_smollm2

    print(prepare_smollm2(force=args.force))
    return 0


def _sft(argv: list[str]) -> int:
    from mentor_fast.sft import main

    return main(argv) or 0


def _eval(argv: list[str]) -> int:
    from mentor_fast.evaluate import main

    return main(argv) or 0


def _bench(argv: list[str]) -> int:
    from mentor_fast.bench import main

    return main(argv) or 0


def _report(argv: list[str]) -> int:
    from pathlib import Path

    from mentor_fast.metrics import all_fail_table, read_run, write_report

    p = argparse.ArgumentParser(prog="mentor-fast report",
                                description="Redraw a run's report.png, optionally beside a baseline run, and print "
                                            "the unhinted all-fail fraction per step.")
    p.add_argument("run", help="a run folder (metrics.jsonl, config.yaml)")
    p.add_argument("--baseline", default=None, help="another run folder to draw beside it, e.g. vanilla GRPO")
    p.add_argument("--out", default=None, help="the PNG to write (default: RUN/report.png)")
    p.add_argument("--window", type=int, default=4, help="steps in the trailing mean of the all-fail fraction")
    args = p.parse_args(argv)
    runs = [Path(r) for r in (args.run, args.baseline) if r is not None]
    for run in runs:
        if not (run / "metrics.jsonl").is_file():
            p.error(f"{run / 'metrics.jsonl'}: not found (is {run} a run folder?)")
    out = Path(args.out) if args.out else runs[0] / "report.png"
    write_report(runs[0] / "metrics.jsonl", out, title=" beside ".join(str(run) for run in runs),
                 baseline=runs[1] if len(runs) > 1 else None, window=args.window)
    print(all_fail_table([read_run(run) for run in runs], args.window))
    print(f"report: {out}")
    return 0


def _serve(argv: list[str]) -> int:
    from mentor_fast.rollout.server import serve_main

    return serve_main(argv)


COMMANDS = {"train": _train, "sft": _sft, "eval": _eval, "bench": _bench, "report": _report, "serve": _serve,
            "prepare-model": _prepare_model}
HELP = """usage: mentor-fast COMMAND [options]   (mentor-fast COMMAND --help for its options)

A single-node GRPO trainer with fused kernels and MENTOR (hints for groups whose rollouts all fail).

commands:
  train          GRPO (+ MENTOR) training: mentor-fast train --config FILE.yaml [key.sub=value ...]
                 on N ranks: mentor-fast train --nproc N ... (or torchrun ... -m mentor_fast train ...)
  sft            a supervised warm-up on the data's worked solutions (the demo's first stage)
  eval           sampled pass@k of a policy on held-out problems, optionally with a mentor hint
  bench          end-to-end step time of trainer variants (and TRL's), alternated, in fresh processes
  report         redraw a run's report.png beside a baseline run; print the all-fail fraction per step
  serve          a vLLM rollout engine in a process of its own, for rollout.vllm_mode=server
  prepare-model  dequantize the embedded SmolLM2-135M-Instruct once into the cache

configuration keys: docs/config.md
"""


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in ("-h", "--help", "help"):
        print(HELP, end="")
        return 0
    if not argv or argv[0] not in COMMANDS:
        print(HELP, end="", file=sys.stderr)
        if argv:
            print(f"error: unknown command {argv[0]!r}", file=sys.stderr)
        return 2
    from mentor_fast.dist import RankFailure

    try:
        return COMMANDS[argv[0]](argv[1:])
    except _user_errors() as e:  # bad input or a failed engine: one clear line, no traceback
        print(f"error: {e}", file=sys.stderr)
        return 2
    except RankFailure as e:  # one rank of several: what failed there (a user error: no traceback), then where
        if e.__cause__ is not None and not isinstance(e.__cause__, _user_errors()):
            traceback.print_exception(e.__cause__)
        print(f"error: {e}", file=sys.stderr)
        return 1


def _user_errors() -> tuple[type[Exception], ...]:
    from mentor_fast.checkpoint import CheckpointError
    from mentor_fast.data import DataError
    from mentor_fast.models import ModelError
    from mentor_fast.rewards.sandbox import SandboxError
    from mentor_fast.rollout.base import EngineError

    return (ConfigError, DataError, ModelError, CheckpointError, EngineError, SandboxError)


if __name__ == "__main__":
    sys.exit(main())
