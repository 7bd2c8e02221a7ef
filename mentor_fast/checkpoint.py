"""Checkpoints, one folder per step:

    step_XXXXXX/policy/            the policy as an HF safetensors folder (with its tokenizer); with
                                   model.lora, its adapter as peft saves it (PeftModel.from_pretrained)
    step_XXXXXX/optim/             AdamW's state through torch.distributed.checkpoint, sharded as
                                   the ranks held it, keyed by parameter name
    step_XXXXXX/trainer_state.pt   schedule, position, policy version, the method's shared state
    step_XXXXXX/ranks/rank_R.pt    each rank's own: RNG states, the update's generator, its hints
                                   in flight

A run resumes on any number of ranks: the weights load whole and are sharded again, and
torch.distributed.checkpoint reshards the optimizer state. Writes are atomic: everything goes
into a temporary folder, every file is fsynced, then rank 0 renames the folder into place after
every rank has written. A checkpoint interrupted mid-write is never visible under its final name,
so resume never reads half a file.
"""

from __future__ import annotations

import os
import random
import re
import shutil
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch

from mentor_fast.dist import Dist

_NAME = re.compile(r"^step_(\d{6,})$")


class CheckpointError(RuntimeError):
    pass


def _fsync_tree(root: Path) -> None:
    for dirpath, _, files in os.walk(root):
        for f in files:
            with open(os.path.join(dirpath, f), "rb") as fh:
                os.fsync(fh.fileno())
        fd = os.open(dirpath, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def rng_state() -> dict[str, Any]:
    return {"torch": torch.get_rng_state(), "python": random.getstate(), "numpy": np.random.get_state()}


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])


def list_checkpoints(root: Path) -> list[Path]:
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if (m := _NAME.match(p.name)) and p.is_dir()]
    return [p for _, p in sorted(found)]


def save_checkpoint(root: Path, step: int, *, policy, optimizer, tokenizer, state: dict[str, Any],
                    rank_state: dict[str, Any], keep_last_n: int, dist: Dist) -> Path:
    """Write root/step_XXXXXX atomically (every rank calls it); keep the newest `keep_last_n`."""
    from torch.distributed.checkpoint import save as dcp_save
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        get_optimizer_state_dict,
    )

    final = root / f"step_{step:06d}"
    tmp = root / f".tmp-step_{step:06d}"
    if dist.is_main:
        root.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
    dist.barrier()
    try:
        with warnings.catch_warnings():  # one process: DCP warns that it saves without a process group
            warnings.simplefilter("ignore", UserWarning)
            dcp_save({"optim": get_optimizer_state_dict(policy, optimizer)}, checkpoint_id=str(tmp / "optim"),
                     no_dist=not dist.enabled)
        # the whole policy on rank 0's CPU, tensor by tensor (every rank joins the gathers)
        full = get_model_state_dict(policy.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        (tmp / "ranks").mkdir(parents=True, exist_ok=True)
        torch.save({**rank_state, "rng": rng_state()}, tmp / "ranks" / f"rank_{dist.rank}.pt")
        if dist.is_main:
            if getattr(policy.model.config, "tie_word_embeddings", False):
                full.pop("lm_head.weight", None)  # the embedding is the head
            policy.model.save_pretrained(tmp / "policy", state_dict=full, safe_serialization=True)
            tokenizer.save_pretrained(tmp / "policy")
            torch.save({**state, "step": step, "world_size": dist.world_size}, tmp / "trainer_state.pt")
        del full
        dist.barrier()  # every rank has written its part
        if dist.is_main:
            _fsync_tree(tmp)
            if final.exists():
                shutil.rmtree(final)
            os.replace(tmp, final)
            for old in list_checkpoints(root)[:-keep_last_n] if keep_last_n > 0 else []:
                shutil.rmtree(old, ignore_errors=True)
    finally:
        dist.barrier()
        if dist.is_main:
            shutil.rmtree(tmp, ignore_errors=True)
    return final


def load_optimizer(ckpt: Path, policy, optimizer, dist: Dist) -> None:
    """AdamW's state from `ckpt` into `optimizer`, resharded to this run's ranks."""
    from torch.distributed.checkpoint import load as dcp_load
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict, set_optimizer_state_dict

    if not (ckpt / "optim").is_dir():
        raise CheckpointError(f"{ckpt} has no optim/ folder: it is not a complete checkpoint")
    state = {"optim": get_optimizer_state_dict(policy, optimizer)}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        dcp_load(state, checkpoint_id=str(ckpt / "optim"), no_dist=not dist.enabled)
    set_optimizer_state_dict(policy, optimizer, state["optim"])


def load_rank_state(ckpt: Path, rank: int) -> dict[str, Any]:
    """Rank `rank`'s saved state (RNGs, the update's generator, the method's hints in flight)."""
    path = ckpt / "ranks" / f"rank_{rank}.pt"
    if not path.is_file():
        raise CheckpointError(f"{ckpt} has no {path.relative_to(ckpt)}: it is not a complete checkpoint")
    return _load(path)


def saved_ranks(ckpt: Path) -> list[dict[str, Any]]:
    """Every rank's saved state, in rank order (empty for a checkpoint without ranks/)."""
    paths = sorted((ckpt / "ranks").glob("rank_*.pt"), key=lambda p: int(p.stem.split("_")[1]))
    return [_load(p) for p in paths]


def latest_checkpoint(root: Path) -> Path | None:
    found = list_checkpoints(root)
    return found[-1] if found else None


def load_trainer_state(ckpt: Path) -> dict[str, Any]:
    path = ckpt / "trainer_state.pt"
    policy = ckpt / "policy"
    if not path.is_file() or not ((policy / "config.json").is_file() or (policy / "adapter_config.json").is_file()):
        raise CheckpointError(f"{ckpt} is not a complete checkpoint (missing trainer_state.pt or policy/)")
    return _load(path)


def _load(path: Path) -> dict[str, Any]:
    # weights_only=False: the state holds Python RNG tuples and numpy arrays we wrote ourselves
    try:
        return torch.load(path, weights_only=False)
    except (ModuleNotFoundError, AttributeError) as e:
        # a checkpoint written before method state was plain data pickled the method's classes by
        # their module path, which a later version may have moved
        ckpt = path.parent.parent if path.parent.name == "ranks" else path.parent
        raise CheckpointError(
            f"{path}: holds Python objects this version cannot rebuild ({e}); an older mentor_fast wrote "
            f"it. Resume it with the version that wrote it, or start a new run from its weights: "
            f"model.path={ckpt / 'policy'}") from e
