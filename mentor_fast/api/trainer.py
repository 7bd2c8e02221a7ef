"""GRPOTrainer in TRL's shape: `GRPOTrainer(model, reward_funcs, args=GRPOConfig(...),
train_dataset=ds).train()` runs mentor_fast's Trainer on the RunConfig the CLI would build.

What is handed over in Python becomes config where it can, so the run folder's config.yaml says
what ran: a model path is model.path, a dataset path is data.path, an importable reward function
is its "module:function" spec. The rest travels beside the config: a PreTrainedModel is saved once
into OUTPUT_DIR/initial_policy (its path becomes model.path), a datasets.Dataset or a list of dicts
becomes data.source=dataset's rows, and a reward function that cannot be imported by name (a
lambda, a closure, one defined in the script itself) is registered in mentor_fast.api.rewards for
this process. Under torchrun every rank runs the script, so every rank does the same.
"""

from __future__ import annotations

import importlib
import os
import re
import sys
import time
import types
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mentor_fast.api.config import GRPOConfig, Values, _peft
from mentor_fast.config import ConfigError, RunConfig

REWARDS_MODULE = "mentor_fast.api.rewards"  # reward functions that have no importable name


@dataclass
class TrainResult:
    """Where the run is: its folder, the last step trained (a checkpoint of it is in
    OUTPUT_DIR/checkpoints) and that step's metrics row (empty when no step ran)."""

    output_dir: Path
    global_step: int
    metrics: dict[str, float] = field(default_factory=dict)


def _import_name(fn: Callable) -> str | None:
    """"module:qualname" when importing it gives back `fn` (never __main__: the CLI could not)."""
    module, name = getattr(fn, "__module__", None), getattr(fn, "__qualname__", "")
    if not module or module == "__main__" or not name.isidentifier():
        return None
    try:
        found = getattr(importlib.import_module(module), name, None)
    except ImportError:
        return None
    return f"{module}:{name}" if found is fn else None


def _rewards_module() -> types.ModuleType:
    if REWARDS_MODULE not in sys.modules:
        module = types.ModuleType(REWARDS_MODULE, "Reward functions handed to GRPOTrainer without an importable name.")
        sys.modules[REWARDS_MODULE] = module
    return sys.modules[REWARDS_MODULE]


def reward_specs(reward_funcs: Any) -> list[str]:
    """reward.functions entries for TRL-style reward functions (`fn(completions, **columns)`)."""
    funcs = reward_funcs if isinstance(reward_funcs, (list, tuple)) else [reward_funcs]
    specs = []
    for i, fn in enumerate(funcs):
        if isinstance(fn, str) or not callable(fn):
            raise ConfigError(f"reward_funcs[{i}]: {fn!r} is not a function; TRL's reward models (a model id or "
                              "a PreTrainedModel) are not supported, only fn(completions, **columns) -> list[float | None]")
        spec = _import_name(fn)
        if spec is None:
            base = re.sub(r"\W", "_", getattr(fn, "__name__", "") or type(fn).__name__).strip("_") or "reward"
            module = _rewards_module()
            name = base if getattr(module, base, fn) is fn else f"{base}_{i}"
            setattr(module, name, fn)
            spec = f"{REWARDS_MODULE}:{name}"
        specs.append(spec)
    return specs


def _save_model(model: Any, tokenizer: Any, folder: Path) -> Path:
    """The PreTrainedModel (and its tokenizer) as an HF folder, written by local rank 0; the other
    ranks wait for it."""
    done = folder / "SAVED"
    if os.environ.get("LOCAL_RANK", "0") == "0":
        if tokenizer is None:
            source = getattr(model, "name_or_path", "")
            if not source or not Path(source).is_dir():
                raise ConfigError("GRPOTrainer: a PreTrainedModel needs processing_class= (its tokenizer) when "
                                  "model.name_or_path is not a local folder")
            from mentor_fast.models import load_tokenizer

            tokenizer = load_tokenizer(Path(source))
        folder.mkdir(parents=True, exist_ok=True)
        done.unlink(missing_ok=True)
        model.save_pretrained(folder, safe_serialization=True)
        tokenizer.save_pretrained(folder)
        done.touch()
    else:
        deadline = time.monotonic() + 600
        while not done.exists():
            if time.monotonic() > deadline:
                raise ConfigError(f"GRPOTrainer: local rank 0 did not save the model into {folder}")
            time.sleep(0.5)
    return folder


class GRPOTrainer:
    """`GRPOTrainer(model, reward_funcs, args, train_dataset).train()` (TRL's shape).

    model: what model.path takes (a local HF folder, a built-in model name) or a PreTrainedModel.
    reward_funcs: TRL-style functions; the reward is their weighted sum (args' reward_weights), as
        in TRL. The built-in verifier (the task's) still decides correctness, which MENTOR and the
        acc metrics read; it adds verifier_weight x its 0/1 to the reward (default 0 when reward_funcs
        are given, 1 when not).
    train_dataset: a datasets.Dataset or IterableDataset (read once; finite), a list of dicts, or a
        path (parquet, JSON, JSONL, an Arrow folder); None: the data the config names.
    """

    def __init__(self, model: Any, reward_funcs: Any = None, args: GRPOConfig | None = None,
                 train_dataset: Any = None, eval_dataset: Any = None, processing_class: Any = None,
                 peft_config: Any = None, verifier_weight: float | None = None):
        if eval_dataset is not None:
            raise ConfigError("GRPOTrainer: eval_dataset is not supported; evaluation draws held-out problems from "
                              "the training data (trainer.eval_every, data.eval_size)")
        self.args = args or GRPOConfig()
        extra: Values = {}
        self.rows = None
        if isinstance(train_dataset, (str, Path)):
            extra |= {"data.source": "file", "data.path": str(train_dataset)}
        elif train_dataset is not None:
            from mentor_fast.data import dataset_rows

            self.rows = dataset_rows(train_dataset)
            extra["data.source"] = "dataset"
        if peft_config is not None:
            extra |= _peft(peft_config, {})
        if reward_funcs:
            specs = reward_specs(reward_funcs)
            weights = self.args.trl.get("reward_weights") or [1.0] * len(specs)
            if len(weights) != len(specs):
                raise ConfigError(f"GRPOConfig.reward_weights has {len(weights)} entries for {len(specs)} reward_funcs")
            extra["reward.functions"] = specs
            if "reward.weights" not in self.args.ours:
                extra["reward.weights"] = [0.0 if verifier_weight is None else verifier_weight, *weights]
        elif verifier_weight is not None:
            extra["reward.weights"] = [verifier_weight]
        if isinstance(model, (str, Path)):
            extra["model.path"] = str(model)
            self.cfg: RunConfig = self.args.run_config(extra)
        else:
            self.cfg = self.args.run_config(extra)  # a bad setting fails before the model is written
            self.cfg.model.path = str(_save_model(model, processing_class, Path(self.cfg.output_dir) / "initial_policy"))

    def train(self, resume_from_checkpoint: bool | str | None = None) -> TrainResult:
        """Runs to args.max_steps; resume_from_checkpoint=True takes the latest checkpoint in the run
        folder, a path that checkpoint."""
        from mentor_fast.trainer import Trainer

        resume = "auto" if resume_from_checkpoint is True else resume_from_checkpoint or None
        trainer = Trainer(self.cfg, resume=resume, rows=self.rows)
        start = trainer.start_step
        out = trainer.fit()
        step = max(start, self.cfg.trainer.max_steps)
        return TrainResult(output_dir=out, global_step=step, metrics=trainer.last_metrics)
