"""The policy's forward over a micro-batch: hidden states of the completion-predicting positions only.

Two halves, so that the micro-batch loop never waits on the device:
- on the host, `decoder_inputs` builds everything a micro-batch needs (token ids, positions, the
  gather index of the completion-predicting rows, targets, the attention layout's lengths) as CPU
  tensors, and `DecoderInputs.to` moves them in one non-blocking copy per dtype from pinned memory;
- on the device, `run_decoder` runs the decoder and gathers [N, H] (no padding rows) for the LM
  head and the loss, reading nothing back (the layouts of mentor_fast/attention.py replace
  transformers' mask building, which syncs).

Three forms (`Form`), the same numbers (tests/test_packing.py, tests/test_update.py):
- ROWS: full rows (prompt + completion), right-padded; causal attention alone is exact for them;
- PACKED: the rows end to end in one row, no padding (trainer.packing): position ids restart at
  each sequence and attention stays within it (a varlen flash kernel where one runs, else a
  block-diagonal mask);
- SHARED: a group's G rows share one prompt, so each distinct prompt of a micro-batch runs through
  the decoder once and the G completions attend to its keys/values (gradients flow back through
  them), instead of G copies of the prompt forward and backward (trainer.shared_prompt_forward).
`hidden_rows_ref` is the plain transformers forward over padded rows with its own mask: the
specification the forms are tested against.
Shape letters: U distinct prompts, S sequences, P prompt width, C completion width, W row width,
T packed length, N completion tokens, H hidden.
"""

from __future__ import annotations

import contextlib
import dataclasses
from dataclasses import dataclass

import torch
from transformers.cache_utils import DynamicCache

from mentor_fast.algo.batch import TrainBatch
from mentor_fast.attention import (
    AttentionKind,
    AttentionLayout,
    block_causal_mask,
    prefix_causal_mask,
    update_attention,
)
from mentor_fast.compat import StrEnum


class Form(StrEnum):
    ROWS = "rows"
    PACKED = "packed"
    SHARED = "shared"


@dataclass
class MicroBatch:
    hidden: torch.Tensor  # [N, H] completion-predicting hidden states
    targets: torch.Tensor  # [N]
    seq_index: torch.Tensor  # [N] position of each token's sequence within the micro-batch list
    seqs: list[int]  # batch indices of the sequences, in order


@dataclass
class DecoderInputs:
    """One micro-batch's decoder inputs. ids/positions: ROWS [S, W], PACKED [1, T], SHARED the
    completions [S, C]; gather: [N] rows of the flattened decoder output that predict the targets."""

    form: Form
    seqs: list[int]
    ids: torch.Tensor
    positions: torch.Tensor
    gather: torch.Tensor  # [N]
    targets: torch.Tensor  # [N]
    seq_index: torch.Tensor  # [N]
    seq_of: torch.Tensor | None = None  # PACKED: [T] sequence of each position
    cu_seqlens: torch.Tensor | None = None  # PACKED: [S + 1] int32
    max_len: int = 0  # PACKED: the longest sequence
    prompt_ids: torch.Tensor | None = None  # SHARED: [U, P] each distinct prompt once, right-padded
    expand: torch.Tensor | None = None  # SHARED: [S] prompt row of each completion row
    prompt_lens: torch.Tensor | None = None  # SHARED: [S]

    def to(self, device: torch.device) -> DecoderInputs:
        names = [f.name for f in dataclasses.fields(self) if isinstance(getattr(self, f.name), torch.Tensor)]
        moved = to_device([getattr(self, n) for n in names], device)
        return dataclasses.replace(self, **dict(zip(names, moved)))


def to_device(tensors: list[torch.Tensor], device: torch.device) -> list[torch.Tensor]:
    """Host tensors on `device`, with one copy per dtype, pinned and non-blocking on CUDA: the host
    goes on while the copy is queued (a pageable copy would wait for the device to drain)."""
    if device.type == "cpu":
        return list(tensors)
    out = list(tensors)
    by_dtype: dict[torch.dtype, list[int]] = {}
    for i, t in enumerate(tensors):
        by_dtype.setdefault(t.dtype, []).append(i)
    for idx in by_dtype.values():
        flat = torch.cat([tensors[i].reshape(-1) for i in idx])
        flat = flat.pin_memory() if device.type == "cuda" else flat
        parts = flat.to(device, non_blocking=True).split([tensors[i].numel() for i in idx])
        for i, part in zip(idx, parts):
            out[i] = part.view(tensors[i].shape)
    return out


@dataclass(frozen=True)
class ForwardSettings:
    """How the policy's forward runs over a micro-batch, decided once by its updater (update.py)
    and passed whole to every level below it."""

    pad_id: int = 0  # the tokenizer's: fills rows to their width
    autocast_bf16: bool = False  # the decoder under bf16 autocast (model.autocast_bf16)
    packed: bool = False  # micro-batches as one packed row (trainer.packing)
    varlen: bool = False  # packed rows take the variable-length kernel (attention.varlen_available)
    share_prompts: bool = False  # each distinct prompt once (trainer.shared_prompt_forward)

    def form(self, batch: TrainBatch, seqs: list[int]) -> Form:
        """Packed rows when packing is on; else the shared-prompt forward when some sequences of
        `seqs` share a prompt (and it is on); else full rows."""
        if self.packed:
            return Form.PACKED
        if self.share_prompts and len({batch.prompt_index[i] for i in seqs}) < len(seqs):
            return Form.SHARED
        return Form.ROWS

    def inputs(self, batch: TrainBatch, seqs: list[int]) -> DecoderInputs:
        """The micro-batch's decoder inputs in its form, on the host."""
        return decoder_inputs(batch, seqs, self.pad_id, self.form(batch, seqs))


def autocast(enabled: bool, device: torch.device):
    """bf16 autocast of the decoder (model.autocast_bf16: fp32 master weights, bf16 compute)."""
    if enabled:
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


# ---------------------------------------------------------------- host: building the inputs

def decoder_inputs(batch: TrainBatch, seqs: list[int], pad_id: int, form: Form) -> DecoderInputs:
    return _BUILDERS[form](batch, seqs, pad_id)


def _rows(batch: TrainBatch, seqs: list[int], pad_id: int) -> DecoderInputs:
    rows = [batch.input_ids[i] for i in seqs]
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    gather, seq_index = [], []
    plens, clens = batch.prompt_lens[seqs].tolist(), batch.completion_lens[seqs].tolist()
    for j, (r, p, c) in enumerate(zip(rows, plens, clens)):
        ids[j, : len(r)] = torch.tensor(r)
        gather.extend(range(j * width + p - 1, j * width + p + c - 1))  # position t predicts token t+1
        seq_index.extend([j] * c)
    gather_t = torch.tensor(gather, dtype=torch.long)
    return DecoderInputs(Form.ROWS, seqs, ids, torch.arange(width).expand(len(rows), width).contiguous(), gather_t,
                         ids.reshape(-1)[gather_t + 1], torch.tensor(seq_index, dtype=torch.long))


def _packed(batch: TrainBatch, seqs: list[int], pad_id: int) -> DecoderInputs:
    rows = [batch.input_ids[i] for i in seqs]
    ids = torch.tensor([t for r in rows for t in r], dtype=torch.long)
    lens = torch.tensor([len(r) for r in rows], dtype=torch.long)
    gather, seq_index, start = [], [], 0
    plens, clens = batch.prompt_lens[seqs].tolist(), batch.completion_lens[seqs].tolist()
    for j, (r, p, c) in enumerate(zip(rows, plens, clens)):
        gather.extend(range(start + p - 1, start + p + c - 1))
        seq_index.extend([j] * c)
        start += len(r)
    gather_t = torch.tensor(gather, dtype=torch.long)
    cu = torch.zeros(len(rows) + 1, dtype=torch.int32)
    cu[1:] = lens.cumsum(0)
    return DecoderInputs(Form.PACKED, seqs, ids[None], torch.cat([torch.arange(n) for n in lens.tolist()])[None],
                         gather_t, ids[gather_t + 1], torch.tensor(seq_index, dtype=torch.long),
                         seq_of=torch.repeat_interleave(torch.arange(len(rows)), lens), cu_seqlens=cu,
                         max_len=int(lens.max()))


def _shared(batch: TrainBatch, seqs: list[int], pad_id: int) -> DecoderInputs:
    """Each distinct prompt once ([U, P], right-padded), then the completions ([S, C]) on top of their
    prompt's keys/values, repeated per row; the completions' positions continue from each prompt's
    length. Flat decoder output: [prompt rows U * P | completion rows S * C]."""
    uniq = list(dict.fromkeys(batch.prompt_index[i] for i in seqs))
    first = {u: next(i for i in seqs if batch.prompt_index[i] == u) for u in uniq}
    seq_plens, clens = batch.prompt_lens[seqs].tolist(), batch.completion_lens[seqs].tolist()
    plens = [seq_plens[seqs.index(first[u])] for u in uniq]
    p_width, c_width = max(plens), max(max(clens) - 1, 1)  # the last completion token is never an input
    p_ids = torch.full((len(uniq), p_width), pad_id, dtype=torch.long)
    for r, (u, p) in enumerate(zip(uniq, plens)):
        p_ids[r, :p] = torch.tensor(batch.input_ids[first[u]][:p])
    row_of = {u: r for r, u in enumerate(uniq)}
    expand = torch.tensor([row_of[batch.prompt_index[i]] for i in seqs], dtype=torch.long)  # [S] -> prompt row
    c_ids = torch.full((len(seqs), c_width), pad_id, dtype=torch.long)
    targets, gather, seq_index = [], [], []
    prompt_part = len(uniq) * p_width
    for j, (i, p, c) in enumerate(zip(seqs, seq_plens, clens)):
        comp = batch.input_ids[i][p:]
        c_ids[j, : c - 1] = torch.tensor(comp[: c - 1], dtype=torch.long)
        targets.extend(comp)
        # token 0 is predicted by the prompt's last position, token k by completion input k-1
        gather.append(row_of[batch.prompt_index[i]] * p_width + p - 1)
        gather.extend(prompt_part + j * c_width + k for k in range(c - 1))
        seq_index.extend([j] * c)
    p_len = torch.tensor(seq_plens, dtype=torch.long)
    return DecoderInputs(Form.SHARED, seqs, c_ids, p_len[:, None] + torch.arange(c_width), torch.tensor(gather),
                         torch.tensor(targets, dtype=torch.long), torch.tensor(seq_index, dtype=torch.long),
                         prompt_ids=p_ids, expand=expand, prompt_lens=p_len)


_BUILDERS = {Form.ROWS: _rows, Form.PACKED: _packed, Form.SHARED: _shared}


# ---------------------------------------------------------------- device: running the decoder

def run_decoder(model: torch.nn.Module, x: DecoderInputs,
                settings: ForwardSettings = ForwardSettings()) -> MicroBatch:
    """The micro-batch's completion hidden states from inputs already on the model's device, under
    the settings' autocast; packed rows take the variable-length kernel where `settings.varlen`,
    else a block mask."""
    decoder = model.get_decoder()
    with update_attention(model), autocast(settings.autocast_bf16, x.ids.device):
        if x.form is Form.SHARED:
            hidden = _run_shared(decoder, x)
        else:
            if x.form is Form.ROWS:
                layout = AttentionLayout(AttentionKind.CAUSAL)
            elif settings.varlen:
                layout = AttentionLayout(AttentionKind.VARLEN, cu_seqlens=x.cu_seqlens, max_len=x.max_len)
            else:
                layout = AttentionLayout(AttentionKind.MASK, mask=block_causal_mask(x.seq_of))
            hidden = decoder(input_ids=x.ids, position_ids=x.positions, layout=layout).last_hidden_state
            hidden = hidden.reshape(-1, hidden.shape[-1])
    return MicroBatch(hidden[x.gather], x.targets, x.seq_index, x.seqs)


def _run_shared(decoder: torch.nn.Module, x: DecoderInputs) -> torch.Tensor:
    cache = DynamicCache(config=decoder.config)
    p_width = x.prompt_ids.shape[1]
    p_pos = torch.arange(p_width, device=x.ids.device).expand_as(x.prompt_ids)
    h_prompt = decoder(input_ids=x.prompt_ids, position_ids=p_pos, past_key_values=cache, use_cache=True,
                       layout=AttentionLayout(AttentionKind.CAUSAL)).last_hidden_state  # [U, P, H]
    cache.batch_select_indices(x.expand)  # differentiable: gradients reach the prompt pass
    mask = prefix_causal_mask(x.prompt_lens, p_width, x.ids.shape[1])
    h_comp = decoder(input_ids=x.ids, position_ids=x.positions, past_key_values=cache, use_cache=True,
                     layout=AttentionLayout(AttentionKind.MASK, mask=mask)).last_hidden_state  # [S, C, H]
    return torch.cat([h_prompt.reshape(-1, h_prompt.shape[-1]), h_comp.reshape(-1, h_comp.shape[-1])])


def hidden_rows_ref(model: torch.nn.Module, batch: TrainBatch, seqs: list[int], pad_id: int,
                    autocast_bf16: bool = False) -> MicroBatch:
    """The specification: full right-padded rows through the decoder as transformers runs them (its
    own attention mask), the completion-predicting rows gathered."""
    device = next(model.parameters()).device
    x = _rows(batch, seqs, pad_id)
    mask = torch.zeros_like(x.ids)
    for j, i in enumerate(seqs):
        mask[j, : len(batch.input_ids[i])] = 1
    with autocast(autocast_bf16, device):
        hidden = model.get_decoder()(input_ids=x.ids.to(device), attention_mask=mask.to(device)).last_hidden_state
    hidden = hidden.reshape(-1, hidden.shape[-1])
    return MicroBatch(hidden[x.gather.to(device)], x.targets.to(device), x.seq_index.to(device), seqs)


