"""The policy update: micro-batches of completion hidden states, the GRPO loss, backward, optimizer.

The loss is `mentor_fast.kernels.grpo_loss` either way: `loss.impl=fused` runs the chunked kernels
(no [N, V] logits, the logits gradient formed in the forward pass), `loss.impl=reference` the plain
torch reference on materialised logits (the vanilla baseline). Both compute the same objective,
kernels/objective.py. The update is blind to the method that built the batch: what a method wants
done differently to a sequence arrives as data on its rollout (`weighting`, `extra_terms`,
`behaviour_prompt_ids`; see algo/weights.py and algo/terms.py).

Across ranks (mentor_fast/dist.py, sharding.py) each rank updates on its own groups and the
gradients are summed. The normaliser is global: a sequence's weight is computed from the whole
step's lengths, over every rank, so the sum of the ranks' gradients is the one-device gradient.
Every forward under FSDP2 is a collective, so every rank makes the same number of passes of each
kind: a rank with fewer micro-batches (or none: all its groups have zero advantage) makes empty
ones. The metrics are reduced over ranks before they are reported.

On a GPU the loop is launch-bound, so it never waits on the device: each micro-batch's inputs are
built on the host and queued (its decoder inputs: forward.py; its per-token vectors, pi_old and the
mismatch correction's: update_inputs.py), the metrics stay device tensors until the trainer reads
them after the update (update_metrics.py), the grad norm too; the optimizer step is fused or
foreach (optim.py). What
a micro-batch is made of: packed rows, shared prompts or padded rows (trainer.packing,
shared_prompt_forward), with gradient checkpointing where the activations would not fit
(model.gradient_checkpointing=auto).

Two exact savings (both on by default, both off-switchable in TrainerConfig):
- shared prompts: each distinct prompt of a micro-batch runs through the decoder once (forward.py);
- zero-advantage sequences (all-fail and all-pass groups) are skipped when beta = 0, there is no
  entropy bonus and they carry no extra term: every term of their loss is A * (...) = 0, so their
  gradient is exactly 0. They keep their place in the aggregation's normaliser, so the update does
  not change.
"""

from __future__ import annotations

import dataclasses
import time
import warnings
from dataclasses import dataclass
from typing import Literal

import torch

from mentor_fast.algo.batch import (
    TrainBatch,
    plan_micro_batches,
    plan_packed_micro_batches,
    plan_shared_micro_batches,
    split_mini_batches,
)
from mentor_fast.algo.terms import TermContext, apply_extra_terms
from mentor_fast.algo.weights import token_policy_weights
from mentor_fast.attention import update_attention, varlen_available
from mentor_fast.config import OptimConfig, TrainerConfig
from mentor_fast.dist import Dist
from mentor_fast.forward import DecoderInputs, ForwardSettings, MicroBatch, run_decoder
from mentor_fast.kernels import AGGREGATIONS, GRPOOptions, grpo_loss, sequence_weights, token_logprobs
from mentor_fast.models import checkpointing_needed, enable_checkpointing
from mentor_fast.optim import build_optimizer, pending_state_bytes  # noqa: F401 - build_optimizer: the trainer's import path
from mentor_fast.sharding import PolicyModule, accumulate, global_grad_norm, head_weight
from mentor_fast.update_inputs import (
    TokenVectors,
    mismatch_sampler_logprobs,
    moved,
    old_logprobs,
    token_weights,
)
from mentor_fast.update_metrics import UpdateTotals, micro_metrics, skipped_update_metrics, update_metrics


def _hidden_and_head(model, x: DecoderInputs, settings: ForwardSettings):
    """Run inside the policy's forward: the micro-batch's hidden states and the (gathered) head."""
    return run_decoder(model, x, settings), head_weight(model)


def _idle_pass(model, pad_id):
    """One token through the whole policy, for a rank that has nothing to compute in a pass."""
    ids = torch.full((1, 1), pad_id, dtype=torch.long, device=next(model.parameters()).device)
    return model.get_decoder()(input_ids=ids).last_hidden_state, head_weight(model)


@dataclass
class PreparedBatch:
    """One rollout batch as an update sees it before its first pass."""

    batch: TrainBatch
    in_loss: torch.Tensor  # [S] bool: in the policy loss (see `PolicyUpdater.in_loss`)
    loss_lens: torch.Tensor  # [S] completion tokens in the loss
    computed: list[int]  # ascending: the sequences that get a forward/backward
    old_logp: dict[int, torch.Tensor] | None  # pi_old where the update recomputed it
    stale: torch.Tensor  # [S] bool: sampled by an older policy version (async re-rolls)
    sync_each: bool  # extra terms backpropagate on their own: ranks sync gradients every pass


class PolicyUpdater:
    """Runs PPO epochs x mini-batches x micro-batches over one TrainBatch.

    model: the policy, or its `PolicyModule` (sharded across the ranks of `dist`). loss: the run's
    loss settings with the sampling temperature, the head's compute dtype and the maximum completion
    length (`GRPOOptions.of(cfg.loss, ...)`); a bf16 compute dtype also runs the decoder under bf16
    autocast. pad_id: the tokenizer's; ref_model: the frozen KL reference (beta > 0)."""

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        scheduler,
        loss: GRPOOptions,
        trainer_cfg: TrainerConfig,
        optim_cfg: OptimConfig,
        *,
        pad_id: int,
        ref_model: torch.nn.Module | None = None,
        seed: int = 0,
        dist: Dist | None = None,
        checkpointing: Literal["auto"] | bool = False,
    ):
        self.policy = model if isinstance(model, PolicyModule) else PolicyModule(model)
        self.model, self.optimizer, self.scheduler = self.policy.model, optimizer, scheduler
        self.dist = dist or Dist()
        self.options, self.trainer_cfg, self.optim_cfg = loss, trainer_cfg, optim_cfg
        self.aggregation = AGGREGATIONS[loss.aggregation]
        self.pad_id = pad_id
        self.ref_model = ref_model
        self.generator = torch.Generator().manual_seed(seed)
        self.backend = loss.impl.backend
        self.device = next(self.model.parameters()).device
        # packed rows take a variable-length kernel where one runs; elsewhere (auto) full rows,
        # since a block-diagonal mask costs the square of the pack. bf16 compute with fp32 master
        # weights: the head's GEMMs take bf16 operands too (cast from the master weight once per
        # call), accumulate in fp32 and keep fp32 logits chunks.
        varlen = varlen_available(self.device, loss.compute_dtype)
        self.forward_settings = ForwardSettings(
            pad_id=pad_id, autocast_bf16=loss.compute_dtype == torch.bfloat16, varlen=varlen,
            packed=trainer_cfg.packing is True or (trainer_cfg.packing == "auto" and varlen))
        self.checkpointing = checkpointing
        if checkpointing is True:
            enable_checkpointing(self.model)
        self._set_share_prompts()
        self.skip_zero_advantage = (trainer_cfg.skip_zero_advantage and loss.beta == 0 and loss.entropy_coef == 0
                                    and not self.aggregation.per_micro_batch)

    # ---------------------------------------------------------------- forward pieces
    def _set_share_prompts(self) -> None:
        # The prompt keys/values are passed between two decoder calls, which HF's gradient
        # checkpointing does not allow (it drops the cache): full rows there. Packed rows are one
        # decoder call with no padding, against the shared forward's two.
        share = (self.trainer_cfg.shared_prompt_forward and not self.forward_settings.packed
                 and not getattr(self.model, "is_gradient_checkpointing", False))
        self.forward_settings = dataclasses.replace(self.forward_settings, share_prompts=share)

    def _decide_checkpointing(self) -> None:
        """model.gradient_checkpointing=auto, at the first update: on only where a micro-batch's
        activations would not fit in the memory left."""
        if self.checkpointing == "auto":
            if checkpointing_needed(self.model, self.trainer_cfg.micro_batch_tokens, self.options.compute_dtype,
                                    pending_state_bytes(self.optimizer)):
                enable_checkpointing(self.model)
            self.checkpointing = getattr(self.model, "is_gradient_checkpointing", False)
            self._set_share_prompts()

    def set_checkpointing(self, on: bool) -> None:
        """The model's activation checkpointing on or off, and the forward that follows it (for
        benchmarks whose variants share one model; `auto` still decides at the first update)."""
        enable_checkpointing(self.model) if on else self.model.gradient_checkpointing_disable()
        self._set_share_prompts()

    def micro_batches(self, batch: TrainBatch, seqs: list[int]) -> list[list[int]]:
        """The micro-batches (sequence indices) the update runs `seqs` in, within micro_batch_tokens."""
        budget = self.trainer_cfg.micro_batch_tokens
        if self.forward_settings.packed:
            return plan_packed_micro_batches([len(x) for x in batch.input_ids], seqs, budget)
        if self.forward_settings.share_prompts:
            return plan_shared_micro_batches(batch.prompt_index, batch.prompt_lens.tolist(),
                                             batch.completion_lens.tolist(), seqs, budget)
        return plan_micro_batches([len(x) for x in batch.input_ids], seqs, budget)

    def _hidden(self, model: torch.nn.Module | None, x: DecoderInputs) -> tuple[MicroBatch, torch.Tensor]:
        """(micro-batch hidden states, LM head weight) of the policy (model None) or the reference."""
        if model is None:
            return self.policy(_hidden_and_head, x, self.forward_settings)
        return _hidden_and_head(model, x, self.forward_settings)

    def _idle(self, grad: bool) -> None:
        """An empty pass: the collectives of a forward (and backward) with a zero contribution."""
        with torch.set_grad_enabled(grad):
            hidden, weight = self.policy(_idle_pass, self.pad_id)
            if grad:
                ((hidden.sum() + weight.sum()) * 0.0).backward()

    def _most(self, n: int) -> int:
        """The most passes any rank makes where this rank makes n."""
        return int(self.dist.max([n])[0]) if self.dist.enabled else n

    @torch.no_grad()
    def logprobs(self, model: torch.nn.Module | None, batch: TrainBatch, seqs: list[int]) -> dict[int, torch.Tensor]:
        """No-grad per-sequence completion log-probs in each sequence's own context, of the policy
        (model None; every rank joins, see `_idle`) or of a reference model (local). One copy to the
        host for the whole pass."""
        plans = self.micro_batches(batch, seqs)
        passes = self._most(len(plans)) if model is None else len(plans)  # agreed before any pass
        parts = [self._token_logprobs(model, self.forward_settings.inputs(batch, plan).to(self.device))
                 for plan in plans]
        for _ in range(passes - len(plans)):
            self._idle(grad=False)
        if not parts:
            return {}
        order = [i for plan in plans for i in plan]
        flat = torch.cat(parts).float().cpu()
        return dict(zip(order, flat.split(batch.completion_lens[order].tolist())))

    def _token_logprobs(self, model: torch.nn.Module | None, x: DecoderInputs) -> torch.Tensor:
        """[N] log-probs of the micro-batch's completion tokens, sequence by sequence, on the device."""
        mb, weight = self._hidden(model, x)
        with torch.autocast(mb.hidden.device.type, enabled=False):
            return token_logprobs(mb.hidden, weight, mb.targets, temperature=self.options.temperature,
                                  backend=self.backend, compute_dtype=self.options.compute_dtype)

    # ---------------------------------------------------------------- the update
    def update(self, batch: TrainBatch, policy_version: int) -> dict[str, torch.Tensor]:
        """One rollout batch -> ppo_epochs x mini_batches optimizer steps on the policy at `policy_version`
        (a rollout sampled by an older one is stale). Returns metric tensors. pi_old and the mismatch
        correction: mentor_fast/update_inputs.py."""
        if not self.optim_cfg.step_without_signal and not self.dist.any(not self.signal_free(batch)):
            return self._skip_step()
        t0 = time.perf_counter()
        self._decide_checkpointing()
        prepared = self._prepare(batch, policy_version)
        old_s = time.perf_counter() - t0
        totals = UpdateTotals()
        context = TermContext(self.model, self.options.temperature, forward=self.policy, idle=self._idle,
                              count=self._most if self.dist.enabled else None)
        for _epoch in range(self.trainer_cfg.ppo_epochs):
            for mini in self._mini_batches(batch.num_seqs):
                self._train_mini_batch(prepared, mini, context, totals)
        return self._metrics(prepared, totals, old_s)

    def _skip_step(self) -> dict[str, torch.Tensor]:
        """No signal anywhere in the batch: no optimizer step; the schedule follows trainer steps,
        taken or not."""
        with warnings.catch_warnings():  # torch's "scheduler before optimizer" warning: skipping is the intent
            warnings.filterwarnings("ignore", message=r"Detected call of `lr_scheduler\.step\(\)` before")
            self.scheduler.step()
        return skipped_update_metrics(self.scheduler.get_last_lr()[0])

    def _prepare(self, batch: TrainBatch, policy_version: int) -> PreparedBatch:
        """pi_old, where the sampler's log-probs will not do: with one optimizer step per batch it is
        the sampler's (on the HF engine in fp32 it equals the trainer's to ~1e-5, see
        `rollout/logp_mismatch`), so no forward is spent on it; with several it is recomputed here
        (timing_s/old_logprob), and a sequence trained in another context than it was sampled in
        always gets it recomputed in its training context."""
        in_loss = self.in_loss(batch)
        computed = self.trainable(batch)
        old_logp = None
        if self.trainer_cfg.ppo_epochs > 1 or self.trainer_cfg.mini_batches > 1:
            old_logp = self.logprobs(None, batch, computed)
        to_move = [i for i in computed if moved(batch.rollouts[i]) and (old_logp is None or i not in old_logp)]
        if self.dist.any(bool(to_move)):
            old_logp = {**(old_logp or {}), **self.logprobs(None, batch, to_move)}
        return PreparedBatch(batch, in_loss, batch.completion_lens * in_loss, computed, old_logp,
                             stale=batch.policy_versions < policy_version,
                             sync_each=self.dist.any(any(r.extra_terms for r in batch.rollouts)))

    def _mini_batches(self, num_seqs: int) -> list[list[int]]:
        """This epoch's mini-batches, padded with empty ones to the most any rank has."""
        minis = split_mini_batches(num_seqs, self.trainer_cfg.mini_batches, self.generator)
        return minis + [[] for _ in range(self._most(len(minis)) - len(minis))]

    def _train_mini_batch(self, prepared: PreparedBatch, mini: list[int], context: TermContext,
                          totals: UpdateTotals) -> None:
        """The mini-batch's micro-batches (forward, loss, backward), its extra terms, one optimizer step."""
        # the weights see the whole mini-batch over every rank, skipped sequences included
        lens = prepared.loss_lens[mini]
        seq_w = self._global_weights(lens) * prepared.in_loss[mini]
        weight_of = {i: float(w) for i, w in zip(mini, seq_w)}
        computed = set(prepared.computed)
        plans = self.micro_batches(prepared.batch, [i for i in mini if i in computed])
        passes = self._most(len(plans))
        num_micro = int(self.dist.sum([len(plans)])[0]) if self.dist.enabled else len(plans)
        for k in range(passes):
            self._set_sync(prepared.sync_each or k == passes - 1)
            if k < len(plans):
                totals.add_micro(self._micro_step(prepared, plans[k], weight_of, num_micro))
            else:
                self._idle(grad=True)
        norm = float(self.dist.sum([float(lens.sum())])[0])
        totals.add_terms(apply_extra_terms(context, prepared.batch, mini, norm))
        totals.grad_norms.append(self._optimizer_step())

    def _metrics(self, prepared: PreparedBatch, totals: UpdateTotals, old_s: float) -> dict[str, torch.Tensor]:
        batch = prepared.batch
        total = float(batch.completion_lens.sum())
        skipped = total - float(batch.completion_lens[prepared.computed].sum()) if prepared.computed else total
        out = update_metrics(self.dist, totals, self.scheduler.get_last_lr()[0], skipped, total)
        if self.options.mask_truncated:
            masked, seqs = (float(x) for x in self.dist.sum([float((~prepared.in_loss).sum()),
                                                               float(batch.num_seqs)]))
            out["update/masked_truncated_frac"] = torch.tensor(masked / seqs if seqs else 0.0)
        out["timing_s/old_logprob"] = old_s
        return out

    # ---------------------------------------------------------------- across ranks
    def _global_weights(self, lens: torch.Tensor) -> torch.Tensor:
        """This rank's sequence weights, computed over the mini-batch's lengths on every rank."""
        agg, max_len = self.options.aggregation, self.options.max_completion_len
        if not self.dist.enabled:
            return sequence_weights(lens, agg, max_len)
        every = self.dist.gather(lens.tolist())
        start = sum(len(x) for x in every[: self.dist.rank])
        all_lens = torch.tensor([n for x in every for n in x], dtype=lens.dtype)
        return sequence_weights(all_lens, agg, max_len)[start : start + len(lens)]

    def _set_sync(self, sync: bool) -> None:
        """Reduce-scatter gradients on this backward (FSDP2), or keep accumulating them locally."""
        if self.dist.enabled:
            accumulate(self.policy, last=sync)

    # ---------------------------------------------------------------- which sequences
    def signal_free(self, batch: TrainBatch) -> bool:
        """True when the batch's gradient is exactly 0: every advantage is 0 and no term (KL, entropy
        bonus, an extra term) acts without one."""
        cfg = self.options
        return (cfg.beta == 0 and cfg.entropy_coef == 0 and not bool(batch.advantages.ne(0).any())
                and not any(r.extra_terms for r in batch.rollouts))

    def in_loss(self, batch: TrainBatch) -> torch.Tensor:
        """[S] bool: the sequences whose tokens are in the policy loss (all but, with
        loss.mask_truncated, the completions cut at the length limit)."""
        if not self.options.mask_truncated:
            return torch.ones(batch.num_seqs, dtype=torch.bool)
        return torch.tensor([not r.truncated for r in batch.rollouts], dtype=torch.bool)

    def trainable(self, batch: TrainBatch) -> list[int]:
        """The sequences whose forward/backward can change the update (see the module docstring)."""
        if not self.skip_zero_advantage:
            return list(range(batch.num_seqs))
        in_loss = self.in_loss(batch)
        return [i for i in range(batch.num_seqs) if float(batch.advantages[i]) != 0.0 and in_loss[i]]

    # ---------------------------------------------------------------- one micro-batch
    def _micro_step(self, prepared: PreparedBatch, seqs: list[int], weight_of: dict[int, float],
                    num_micro: int) -> dict[str, torch.Tensor]:
        """One micro-batch: the host builds its inputs and queues them to the device, then `_run`."""
        x = self.forward_settings.inputs(prepared.batch, seqs).to(self.device)
        return self._run(x, self._token_vectors(prepared, seqs, weight_of, num_micro).to(self.device))

    def _run(self, x: DecoderInputs, t: TokenVectors) -> dict[str, torch.Tensor]:
        """Forward, loss and backward of staged inputs; reads nothing back from the device."""
        with update_attention(self.model):  # the backward's recompute (checkpointing) runs it too
            mb, weight = self._hidden(None, x)
            ref = None
            if self.options.beta > 0:  # the frozen reference (not sharded) reads the same inputs
                with torch.no_grad():
                    ref = self._token_logprobs(self.ref_model, x).float()
            # fp32 logits inside the op, whatever the operands: bf16 logits put a 3-6% error into the
            # ratio (docs/kernels.md#numerics)
            with torch.autocast(self.device.type, enabled=False):
                out = grpo_loss(mb.hidden, weight, mb.targets, t.old, t.advantages, t.weights, ref_logp=ref,
                                is_weights=t.policy_weights, sampler_logp=t.mismatch_sampler,
                                seq_ids=mb.seq_index, num_seqs=len(mb.seqs), options=self.options,
                                backend=self.backend)
            out.loss.backward()
        return micro_metrics(out, t.weights, t.sampler, with_ref=ref is not None, corrects=self.options.is_cap > 0)

    def _token_vectors(self, prepared: PreparedBatch, seqs: list[int], weight_of: dict[int, float],
                       num_micro: int) -> TokenVectors:
        """The micro-batch's per-token host vectors (mentor_fast/update_inputs.py)."""
        batch = prepared.batch
        w = token_weights(batch, seqs, self.options, weight_of, prepared.in_loss, num_micro)
        adv = torch.repeat_interleave(batch.advantages[seqs], batch.completion_lens[seqs])
        sampler = torch.cat([batch.sampler_logprobs(i) for i in seqs])
        old = old_logprobs(batch, seqs, prepared.old_logp, prepared.stale)
        is_w = self._policy_weights(batch, seqs, old, sampler)
        mismatch = mismatch_sampler_logprobs(batch, seqs, old, sampler)
        vectors = [v.to(torch.float32) for v in (w, adv, sampler, old, mismatch)]
        return TokenVectors(*vectors, policy_weights=None if is_w is None else is_w.to(torch.float32))

    def _policy_weights(self, batch: TrainBatch, plan: list[int], old: torch.Tensor,
                        sampler: torch.Tensor) -> torch.Tensor | None:
        """A method's per-token weights on the policy term, sequence by sequence from its rollout's
        `weighting` (1 for the others); None when no sequence of the micro-batch has one."""
        specs = [batch.rollouts[i].weighting for i in plan]
        if all(s is None for s in specs):
            return None
        lens = batch.completion_lens[plan].tolist()
        parts = []
        for spec, o, s in zip(specs, old.split(lens), sampler.split(lens)):
            parts.append(torch.ones_like(o) if spec is None else token_policy_weights(spec.kind, spec.param, o, s))
        return torch.cat(parts)

    def _optimizer_step(self) -> torch.Tensor:
        """Clip and step; the norm stays on the device (the metrics are read once, after the update)."""
        for p in self.model.parameters():  # a skipped (all-zero) batch still steps AdamW's moments
            if p.requires_grad and p.grad is None:
                p.grad = torch.zeros_like(p)
        params = [p for p in self.model.parameters() if p.grad is not None]
        norm = global_grad_norm(params, self.optim_cfg.grad_clip)  # over every rank's shards, foreach
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return norm
