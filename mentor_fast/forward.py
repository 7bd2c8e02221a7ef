"""The policy's forward over a micro-batch: hidden states of the completion-predicting positions only.

The decoder runs over prompt + completion, then the hidden states that predict completion tokens
are gathered into [N, H] (no padding rows) for the LM head and the loss. Two ways, the same numbers:
- `hidden_rows`: full rows (prompt + completion, right-padded), the plain path;
- `hidden_packed`: the same rows end to end in one row, no padding (trainer.packing): the position
  ids restart at each sequence, so attention stays within it: flash-attn's varlen kernel under
  attn_implementation=flash_attention_2, a block-diagonal mask with SDPA or eager (transformers
  reads the sequence boundaries off the position ids);
- `hidden_shared`: a group's G rows share one prompt, so each distinct prompt of a micro-batch runs
  through the decoder once and the G completions attend to its keys/values (gradients flow back
  through them), instead of G copies of the prompt forward and backward (trainer.shared_prompt_forward).
Shape letters: U distinct prompts, S sequences, P prompt width, C completion width, H hidden.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
from transformers.cache_utils import DynamicCache

from mentor_fast.algo.batch import TrainBatch


@dataclass
class MicroBatch:
    hidden: torch.Tensor  # [N, H] completion-predicting hidden states
    targets: torch.Tensor  # [N]
    seq_index: torch.Tensor  # [N] position of each token's sequence within the micro-batch list
    seqs: list[int]  # batch indices of the sequences, in order


def autocast(enabled: bool, device: torch.device):
    """bf16 autocast of the decoder (model.autocast_bf16: fp32 master weights, bf16 compute)."""
    if enabled:
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def completion_hidden(model: torch.nn.Module, batch: TrainBatch, seqs: list[int], pad_id: int, *,
                      share_prompts: bool, autocast_bf16: bool = False, packed: bool = False) -> MicroBatch:
    """The shared-prompt forward when some sequences of `seqs` share a prompt, else full rows
    (packed into one row when `packed`)."""
    if share_prompts and len({batch.prompt_index[i] for i in seqs}) < len(seqs):
        return hidden_shared(model, batch, seqs, pad_id, autocast_bf16)
    if packed:
        return hidden_packed(model, batch, seqs, autocast_bf16)
    return hidden_rows(model, batch, seqs, pad_id, autocast_bf16)


def hidden_shared(model: torch.nn.Module, batch: TrainBatch, seqs: list[int], pad_id: int,
                  autocast_bf16: bool = False) -> MicroBatch:
    """Each distinct prompt once ([U, P], right-padded), then the completions ([S, C]) on top of
    their prompt's keys/values, repeated per row. Right padding keeps every query row with at
    least one visible key (a fully masked sdpa row is NaN, and 0 * NaN poisons the weight
    gradients); the mask hides the pads and the positions continue from each prompt's length."""
    device = next(model.parameters()).device
    uniq = list(dict.fromkeys(batch.prompt_index[i] for i in seqs))
    first = {u: next(i for i in seqs if batch.prompt_index[i] == u) for u in uniq}
    plens = [int(batch.prompt_lens[first[u]]) for u in uniq]
    clens = [int(batch.completion_lens[i]) for i in seqs]
    p_width, c_width = max(plens), max(max(clens) - 1, 1)  # the last completion token is never an input
    p_ids = torch.full((len(uniq), p_width), pad_id, dtype=torch.long)
    p_mask = torch.zeros((len(uniq), p_width), dtype=torch.long)
    for r, (u, p) in enumerate(zip(uniq, plens)):
        p_ids[r, :p] = torch.tensor(batch.input_ids[first[u]][:p])
        p_mask[r, :p] = 1
    row_of = {u: r for r, u in enumerate(uniq)}
    expand = torch.tensor([row_of[batch.prompt_index[i]] for i in seqs])  # [S] -> prompt row
    c_ids = torch.full((len(seqs), c_width), pad_id, dtype=torch.long)
    c_mask = torch.zeros((len(seqs), c_width), dtype=torch.long)
    targets, flat_idx, seq_index = [], [], []
    prompt_part = len(uniq) * p_width  # flat hidden = [prompt rows U*P | completion rows S*C]
    for j, (i, c) in enumerate(zip(seqs, clens)):
        p = int(batch.prompt_lens[i])
        comp = batch.input_ids[i][p:]
        c_ids[j, : c - 1] = torch.tensor(comp[: c - 1], dtype=torch.long)
        c_mask[j, : c - 1] = 1
        targets.extend(comp)
        # token 0 is predicted by the prompt's last position, token k by completion input k-1
        flat_idx.append(int(expand[j]) * p_width + p - 1)
        flat_idx.extend(prompt_part + j * c_width + k for k in range(c - 1))
        seq_index.extend([j] * c)
    p_ids, p_mask, c_ids, c_mask, expand = (t.to(device) for t in (p_ids, p_mask, c_ids, c_mask, expand))
    decoder = model.get_decoder()
    cache = DynamicCache(config=model.config)
    with autocast(autocast_bf16, device):
        h_prompt = decoder(input_ids=p_ids, attention_mask=p_mask, past_key_values=cache,
                           use_cache=True).last_hidden_state  # [U, P, H]
        cache.batch_select_indices(expand)  # differentiable: gradients reach the prompt pass
        p_len = torch.tensor([int(batch.prompt_lens[i]) for i in seqs], device=device)
        positions = p_len[:, None] + torch.arange(c_width, device=device)  # [S, C]
        h_comp = decoder(input_ids=c_ids, attention_mask=torch.cat([p_mask[expand], c_mask], 1),
                         position_ids=positions, past_key_values=cache, use_cache=True).last_hidden_state
    hidden = torch.cat([h_prompt.reshape(-1, h_prompt.shape[-1]), h_comp.reshape(-1, h_comp.shape[-1])])
    idx = torch.tensor(flat_idx, dtype=torch.long, device=device)
    return MicroBatch(hidden[idx], torch.tensor(targets, dtype=torch.long, device=device),
                      torch.tensor(seq_index, device=device), seqs)

def hidden_rows(model: torch.nn.Module, batch: TrainBatch, seqs: list[int], pad_id: int,
                autocast_bf16: bool = False) -> MicroBatch:
    """Full rows (prompt + completion, right-padded) through the decoder."""
    device = next(model.parameters()).device
    rows = [batch.input_ids[i] for i in seqs]
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    row_idx, col_idx, seq_index = [], [], []
    for j, (i, r) in enumerate(zip(seqs, rows)):
        ids[j, : len(r)] = torch.tensor(r)
        mask[j, : len(r)] = 1
        p, c = int(batch.prompt_lens[i]), int(batch.completion_lens[i])
        # the hidden state at position t predicts token t+1
        row_idx.extend([j] * c)
        col_idx.extend(range(p - 1, p + c - 1))
        seq_index.extend([j] * c)
    ids, mask = ids.to(device), mask.to(device)
    with autocast(autocast_bf16, device):
        hidden = model.get_decoder()(input_ids=ids, attention_mask=mask).last_hidden_state  # [b, T, H]
    rr = torch.tensor(row_idx, dtype=torch.long, device=device)
    cc = torch.tensor(col_idx, dtype=torch.long, device=device)
    return MicroBatch(hidden[rr, cc], ids[rr, cc + 1], torch.tensor(seq_index, device=device), seqs)


def hidden_packed(model: torch.nn.Module, batch: TrainBatch, seqs: list[int],
                  autocast_bf16: bool = False) -> MicroBatch:
    """The rows of `seqs` end to end as one [1, T] row, T = their summed lengths (no pad tokens)."""
    device = next(model.parameters()).device
    rows = [batch.input_ids[i] for i in seqs]
    ids = torch.tensor([t for r in rows for t in r], dtype=torch.long)
    positions = torch.cat([torch.arange(len(r)) for r in rows])
    flat_idx, seq_index, start = [], [], 0
    for j, (i, r) in enumerate(zip(seqs, rows)):
        p, c = int(batch.prompt_lens[i]), int(batch.completion_lens[i])
        flat_idx.extend(range(start + p - 1, start + p + c - 1))  # position t predicts token t+1
        seq_index.extend([j] * c)
        start += len(r)
    ids, positions = ids.to(device), positions.to(device)
    with autocast(autocast_bf16, device):
        hidden = model.get_decoder()(input_ids=ids[None], position_ids=positions[None]).last_hidden_state[0]
    idx = torch.tensor(flat_idx, dtype=torch.long, device=device)
    return MicroBatch(hidden[idx], ids[idx + 1], torch.tensor(seq_index, device=device), seqs)
