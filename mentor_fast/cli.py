"""`mentor-fast train | eval | bench | prepare-model`."""

from __future__ import annotations

import argparse
import sys

from mentor_fast.config import ConfigError, load_config


def _train(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="mentor-fast train", description="Run GRPO (+ MENTOR) training.")
    p.add_argument("--config", action="append", default=[], help="YAML file(s); later files win")
    p.add_argument("--resume", nargs="?", const="auto", default=None,
                   help="resume from the latest checkpoint in output_dir, or from the given checkpoint folder")
    p.add_argument("--dry-run", action="store_true", help="validate and print the resolved config, then exit")
    p.add_argument("overrides", nargs="*", help="key.sub=value overrides, applied last")
    args = p.parse_args(argv)
    cfg = load_config(args.config, args.overrides)
    if args.dry_run:
        import yaml

        from mentor_fast.config import to_dict

        print(yaml.safe_dump(to_dict(cfg), sort_keys=False))
        return 0
    from mentor_fast.trainer import Trainer

    out = Trainer(cfg, resume=args.resume).fit()
    print(f"run folder: {out}")
    return 0


def _prepare_model(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="mentor-fast prepare-model",
                                description="Dequantize the embedded SmolLM2-135M-Instruct once into the cache.")
    p.add_argument("--force", action="store_true")
    args = p.parse_args(argv)
    from mentor_fast.models import prepare_smollm2

    print(prepare_smollm2(force=args.force))
    return 0


def _eval(argv: list[str]) -> int:
    from mentor_fast.evaluate import main

    return main(argv) or 0


def _bench(argv: list[str]) -> int:
    from mentor_fast.bench import main

    return main(argv) or 0


COMMANDS = {"train": _train, "eval": _eval, "bench": _bench, "prepare-model": _prepare_model}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in COMMANDS:
        print(f"usage: mentor-fast {{{'|'.join(COMMANDS)}}} [options]  (mentor-fast CMD --help)", file=sys.stderr)
        return 2
    try:
        return COMMANDS[argv[0]](argv[1:])
    except _user_errors() as e:  # bad input or a failed engine: one clear line, no traceback
        print(f"error: {e}", file=sys.stderr)
        return 2


def _user_errors() -> tuple[type[Exception], ...]:
    from mentor_fast.checkpoint import CheckpointError
    from mentor_fast.data import DataError
    from mentor_fast.models import ModelError
    from mentor_fast.rollout.base import EngineError

    return (ConfigError, DataError, ModelError, CheckpointError, EngineError)


if __name__ == "__main__":
    sys.exit(main())
