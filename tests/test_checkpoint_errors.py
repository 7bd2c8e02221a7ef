"""Reading a checkpoint that this version cannot rebuild stops with an error naming the file and the way
out, not an unpickling traceback. The unreadable state is made here on purpose: an object pickled from a
module that exists while it is saved and is gone when it is loaded, as a class moved by a later version."""

from __future__ import annotations

import sys
import types

import pytest
import torch

from mentor_fast.checkpoint import CheckpointError, load_rank_state, load_trainer_state


class _Moved:
    pass


def _save_with_a_class_that_then_moves(path):
    module = types.ModuleType("mentor_fast_moved_module")
    _Moved.__module__ = module.__name__
    module._Moved = _Moved
    sys.modules[module.__name__] = module
    try:
        torch.save({"method": _Moved()}, path)
    finally:
        del sys.modules[module.__name__]


def test_a_rank_state_with_a_moved_class_names_the_file_and_the_way_out(tmp_path):
    ckpt = tmp_path / "step_000004"
    (ckpt / "ranks").mkdir(parents=True)
    _save_with_a_class_that_then_moves(ckpt / "ranks" / "rank_0.pt")
    with pytest.raises(CheckpointError) as e:
        load_rank_state(ckpt, 0)
    msg = str(e.value)
    assert str(ckpt / "ranks" / "rank_0.pt") in msg and "mentor_fast_moved_module" in msg
    assert f"model.path={ckpt / 'policy'}" in msg


def test_a_trainer_state_with_a_moved_class_names_the_file(tmp_path):
    ckpt = tmp_path / "step_000002"
    (ckpt / "policy").mkdir(parents=True)
    (ckpt / "policy" / "config.json").write_text("{}")
    _save_with_a_class_that_then_moves(ckpt / "trainer_state.pt")
    with pytest.raises(CheckpointError, match="trainer_state.pt: holds Python objects"):
        load_trainer_state(ckpt)
    torch.save({"step": 2}, ckpt / "trainer_state.pt")  # plain data reads as it was written
    assert load_trainer_state(ckpt) == {"step": 2}
