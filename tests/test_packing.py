"""Packed sequences (trainer.packing): a micro-batch's rows end to end in one row, no padding, the
position ids restarting at each sequence. Against the padded rows on the tiny Llama: the same hidden
states and gradients to fp32 summation noise (1e-5, as tests/test_update.py), for SDPA (a
block-diagonal mask built from the position ids) and eager. Attention leaking across a sequence
boundary, or a position that does not restart, moves them at the 1e-1 level."""

from __future__ import annotations

import pytest
import torch
from helpers import PAD, assert_grads_close, grads_of_update, make_groups, make_updater

from mentor_fast.algo.batch import build_train_batch, plan_packed_micro_batches
from mentor_fast.config import AdvantageConfig
from mentor_fast.forward import hidden_packed, hidden_rows
from mentor_fast.models import load_policy


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_packed_rows_give_the_padded_rows_hidden_states_and_gradients(tiny_model_path, attn):
    batch = build_train_batch(make_groups([[1, 0, 0, 1], [0, 1, 1], [1, 0]]), AdvantageConfig())
    model = load_policy(tiny_model_path, attn_implementation=attn)
    seqs = list(range(batch.num_seqs))
    assert len({len(r) for r in batch.input_ids}) > 1  # ragged: padding would be needed
    probe = torch.randn(int(batch.completion_lens.sum()), model.config.hidden_size)
    results = []
    for forward in (lambda: hidden_rows(model, batch, seqs, PAD), lambda: hidden_packed(model, batch, seqs)):
        model.zero_grad(set_to_none=True)
        mb = forward()
        (mb.hidden * probe).sum().backward()
        results.append((mb, {n: p.grad.clone() for n, p in model.named_parameters()}))
    (rows, g_rows), (packed, g_packed) = results
    assert torch.equal(rows.targets, packed.targets) and torch.equal(rows.seq_index, packed.seq_index)
    torch.testing.assert_close(packed.hidden, rows.hidden, atol=1e-5, rtol=1e-5)
    assert_grads_close(g_packed, g_rows, rel=1e-5)


def test_update_with_packing_equals_padded_rows(tiny_model_path):
    batch = build_train_batch(make_groups([[1, 0, 0, 1], [0, 1, 1], [1, 0]]), AdvantageConfig())
    g_rows, m_rows = grads_of_update(make_updater(tiny_model_path, "fused", shared_prompt_forward=False,
                                               micro_batch_tokens=40), batch)
    g_packed, m_packed = grads_of_update(make_updater(tiny_model_path, "fused", shared_prompt_forward=False,
                                                   packing=True, micro_batch_tokens=40), batch)
    assert_grads_close(g_packed, g_rows, rel=1e-5)
    assert float(m_packed["loss"]) == pytest.approx(float(m_rows["loss"]), rel=1e-5, abs=1e-7)


def test_packed_plan_fills_each_micro_batch_up_to_the_budget():
    lengths = [30, 10, 25, 5, 20, 50]
    plans = plan_packed_micro_batches(lengths, list(range(6)), 40)
    assert sorted(i for p in plans for i in p) == list(range(6))
    assert all(sum(lengths[i] for i in p) <= 40 for p in plans if len(p) > 1)
    assert [5] in plans  # longer than the budget: alone
    assert len(plans) == 4  # 140 tokens over 40-token micro-batches, one of them the 50
