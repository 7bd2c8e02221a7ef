"""Checkpoints: the policy as an HF safetensors folder (with its tokenizer), plus optimizer,
scheduler, RNG states, data position and mentor state. Writes are atomic: everything goes into a
temporary folder, every file is fsynced, then the folder is renamed into place. A checkpoint
interrupted mid-write is never visible under its final name, so resume never reads half a file."""

from __future__ import annotations

import os
import random
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

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


def save_checkpoint(root: Path, step: int, model, tokenizer, state: dict[str, Any], keep_last_n: int) -> Path:
    """Write root/step_XXXXXX atomically; keep the newest `keep_last_n`."""
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step_{step:06d}"
    tmp = root / f".tmp-step_{step:06d}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        model.save_pretrained(tmp / "policy", safe_serialization=True)
        tokenizer.save_pretrained(tmp / "policy")
        torch.save({**state, "step": step, "rng": rng_state()}, tmp / "trainer_state.pt")
        _fsync_tree(tmp)
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    for old in list_checkpoints(root)[:-keep_last_n] if keep_last_n > 0 else []:
        shutil.rmtree(old, ignore_errors=True)
    return final


def latest_checkpoint(root: Path) -> Path | None:
    found = list_checkpoints(root)
    return found[-1] if found else None


def load_trainer_state(ckpt: Path) -> dict[str, Any]:
    path = ckpt / "trainer_state.pt"
    if not path.is_file() or not (ckpt / "policy" / "config.json").is_file():
        raise CheckpointError(f"{ckpt} is not a complete checkpoint (missing trainer_state.pt or policy/)")
    # weights_only=False: the state holds Python RNG tuples and numpy arrays we wrote ourselves
    return torch.load(path, weights_only=False)
