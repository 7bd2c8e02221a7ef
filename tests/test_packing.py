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
from mentor_fast.attention import varlen_available
from mentor_fast.config import AdvantageConfig
from mentor_fast.forward import Form, ForwardSettings, decoder_inputs, hidden_rows_ref, run_decoder
from mentor_fast.models import load_policy


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_packed_rows_give_the_padded_rows_hidden_states_and_gradients(tiny_model_path, attn):
    batch = build_train_batch(make_groups([[1, 0, 0, 1], [0, 1, 1], [1, 0]]), AdvantageConfig())
    model = load_policy(tiny_model_path, attn_implementation=attn)
    seqs = list(range(batch.num_seqs))
    assert len({len(r) for r in batch.input_ids}) > 1  # ragged: padding would be needed
    probe = torch.randn(int(batch.completion_lens.sum()), model.config.hidden_size)
    results = []
    for forward in (lambda: hidden_rows_ref(model, batch, seqs, PAD),
                    lambda: run_decoder(model, decoder_inputs(batch, seqs, PAD, Form.PACKED))):
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


def test_auto_packs_only_where_a_varlen_kernel_runs(tiny_model_path):
    """trainer.packing=auto: on the CPU (no varlen kernel) padded rows with the shared-prompt forward;
    packing=true packs anyway, with a block-diagonal mask, and takes precedence over shared prompts."""
    assert not varlen_available(torch.device("cpu"), torch.bfloat16)
    auto = make_updater(tiny_model_path, "fused", bf16=True)
    fwd = auto.forward_settings
    assert auto.trainer_cfg.packing == "auto" and not fwd.packed and not fwd.varlen and fwd.share_prompts
    packed = make_updater(tiny_model_path, "fused", packing=True)
    assert packed.forward_settings.packed and not packed.forward_settings.share_prompts


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_varlen_packed_rows_are_within_the_rule_of_padded_rows_on_a_gpu(tiny_model_path):
    """The variable-length kernel (flash-attn's or torch's) on packed rows against SDPA on padded
    rows, both under bf16 autocast on CUDA: each held to 2x the padded rows' error against the fp32
    padded forward (max and mean), for the hidden states and every gradient."""
    from mentor_fast.kernels.testing import assert_close_rule

    assert varlen_available(torch.device("cuda"), torch.bfloat16), "no varlen kernel: torch < 2.10 without flash-attn"
    batch = build_train_batch(make_groups([[1, 0, 0, 1], [0, 1, 1], [1, 0]]), AdvantageConfig())
    model = load_policy(tiny_model_path).cuda().train()
    seqs = list(range(batch.num_seqs))
    probe = torch.randn(int(batch.completion_lens.sum()), model.config.hidden_size, device="cuda")
    runs = {}
    for name, form, bf16 in (("fp32", Form.ROWS, False), ("rows", Form.ROWS, True), ("varlen", Form.PACKED, True)):
        model.zero_grad(set_to_none=True)
        x = decoder_inputs(batch, seqs, PAD, form).to(torch.device("cuda"))
        mb = run_decoder(model, x, ForwardSettings(PAD, autocast_bf16=bf16, varlen=True))
        (mb.hidden.float() * probe).sum().backward()
        runs[name] = (mb.hidden.detach().float(), {n: p.grad.clone() for n, p in model.named_parameters()})
    (h32, g32), (h_rows, g_rows), (h_var, g_var) = runs["fp32"], runs["rows"], runs["varlen"]
    assert_close_rule("hidden", h_var, h32.double(), h_rows, atol=1e-3 * float(h32.abs().max()))
    for n in g32:
        assert_close_rule(n, g_var[n], g32[n].double(), g_rows[n], atol=1e-3 * float(g32[n].abs().max()) + 1e-12)
