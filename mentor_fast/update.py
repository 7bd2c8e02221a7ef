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
built on the host and queued (forward.py), the metrics stay device tensors until the trainer reads
them after the update, the grad norm too; the optimizer step is fused or foreach (optim.py). What
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

import time
import warnings
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
from mentor_fast.forward import DecoderInputs, MicroBatch, choose_form, decoder_inputs, run_decoder, to_device
from mentor_fast.kernels import AGGREGATIONS, GRPOOptions, grpo_loss, sequence_weights, token_logprobs
from mentor_fast.models import checkpointing_needed, enable_checkpointing
from mentor_fast.optim import build_optimizer, pending_state_bytes  # noqa: F401 - build_optimizer: the trainer's import path
from mentor_fast.sharding import PolicyModule, accumulate, global_grad_norm, head_weight


def _hidden_and_head(model, x: DecoderInputs, autocast_bf16: bool, varlen: bool):
    """Run inside the policy's forward: the micro-batch's hidden states and the (gathered) head."""
    return run_decoder(model, x, autocast_bf16=autocast_bf16, varlen=varlen), head_weight(model)


def _idle_pass(model, pad_id):
    """One token through the whole policy, for a rank that has nothing to compute in a pass."""
    ids = torch.full((1, 1), pad_id, dtype=torch.long, device=next(model.parameters()).device)
    return model.get_decoder()(input_ids=ids).last_hidden_state, head_weight(model)


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
        # bf16 compute with fp32 master weights: the head's GEMMs take bf16 operands too (cast from
        # the master weight once per call), accumulate in fp32 and keep fp32 logits chunks.
        self.autocast_bf16 = loss.compute_dtype == torch.bfloat16
        self.ref_model = ref_model
        self.generator = torch.Generator().manual_seed(seed)
        self.backend = loss.impl.backend
        self.device = next(self.model.parameters()).device
        # packed rows take a variable-length kernel where one runs; elsewhere (auto) full rows,
        # since a block-diagonal mask costs the square of the pack
        self.varlen = varlen_available(self.device, loss.compute_dtype)
        self.packed = trainer_cfg.packing is True or (trainer_cfg.packing == "auto" and self.varlen)
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
        self.share_prompts = (self.trainer_cfg.shared_prompt_forward and not self.packed
                              and not getattr(self.model, "is_gradient_checkpointing", False))

    def _decide_checkpointing(self) -> None:
        """model.gradient_checkpointing=auto, at the first update: on only where a micro-batch's
        activations would not fit in the memory left."""
        if self.checkpointing == "auto":
            if checkpointing_needed(self.model, self.trainer_cfg.micro_batch_tokens, self.options.compute_dtype,
                                    pending_state_bytes(self.optimizer)):
                enable_checkpointing(self.model)
            self.checkpointing = getattr(self.model, "is_gradient_checkpointing", False)
            self._set_share_prompts()

    def _plan(self, batch: TrainBatch, seqs: list[int]) -> list[list[int]]:
        budget = self.trainer_cfg.micro_batch_tokens
        if self.packed:
            return plan_packed_micro_batches([len(x) for x in batch.input_ids], seqs, budget)
        if self.share_prompts:
            return plan_shared_micro_batches(batch.prompt_index, batch.prompt_lens.tolist(),
                                             batch.completion_lens.tolist(), seqs, budget)
        return plan_micro_batches([len(x) for x in batch.input_ids], seqs, budget)

    def _inputs(self, batch: TrainBatch, seqs: list[int]) -> DecoderInputs:
        """The micro-batch's decoder inputs, built on the host and queued to the device."""
        form = choose_form(batch, seqs, share_prompts=self.share_prompts, packed=self.packed)
        return decoder_inputs(batch, seqs, self.pad_id, form).to(self.device)

    def _hidden(self, model: torch.nn.Module | None, x: DecoderInputs) -> tuple[MicroBatch, torch.Tensor]:
        """(micro-batch hidden states, LM head weight) of the policy (model None) or the reference."""
        args = (x, self.autocast_bf16, self.varlen)
        return self.policy(_hidden_and_head, *args) if model is None else _hidden_and_head(model, *args)

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
        plans = self._plan(batch, seqs)
        passes = self._most(len(plans)) if model is None else len(plans)  # agreed before any pass
        parts = [self._token_logprobs(model, self._inputs(batch, plan)) for plan in plans]
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
    def update(self, batch: TrainBatch, current_version: int) -> dict[str, torch.Tensor]:
        """One rollout batch -> ppo_epochs x mini_batches optimizer steps. Returns metric tensors.

        pi_old: with one optimizer step per batch it is the sampler's log-prob of each token (the
        behaviour policy; on the HF engine in fp32 it equals the trainer's to ~1e-5, see
        `rollout/logp_mismatch`), so no separate forward is spent on it; with several, it is
        recomputed once here (timing_s/old_logprob). Rollouts sampled by an older policy version
        (async re-rolls) always use their sampler log-probs. A rollout trained in another context
        than it was sampled in (`behaviour_prompt_ids`) always gets pi_old recomputed in its
        training context.
        """
        dist = self.dist
        if not self.optim_cfg.step_without_signal and not dist.any(not self.signal_free(batch)):
            with warnings.catch_warnings():  # torch's "scheduler before optimizer" warning: skipping is the intent
                warnings.filterwarnings("ignore", message=r"Detected call of `lr_scheduler\.step\(\)` before")
                self.scheduler.step()  # the schedule follows trainer steps, taken or not
            return {"loss": torch.zeros(()), "grad_norm": torch.zeros(()),
                    "lr": torch.tensor(self.scheduler.get_last_lr()[0]), "timing_s/old_logprob": 0.0,
                    "update/skipped_token_frac": torch.tensor(1.0), "update/optimizer_skipped": torch.tensor(1.0)}
        t0 = time.perf_counter()
        self._decide_checkpointing()
        in_loss = self.in_loss(batch)
        loss_lens = batch.completion_lens * in_loss
        computed = set(self.trainable(batch))
        old_logp = None
        if self.trainer_cfg.ppo_epochs > 1 or self.trainer_cfg.mini_batches > 1:
            old_logp = self.logprobs(None, batch, sorted(computed))
        moved = [i for i in sorted(computed) if _moved(batch, i) and (old_logp is None or i not in old_logp)]
        if dist.any(bool(moved)):
            old_logp = {**(old_logp or {}), **self.logprobs(None, batch, moved)}
        old_s = time.perf_counter() - t0
        sums: dict[str, torch.Tensor] = {}
        terms: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        grad_norms = []
        stale = batch.policy_versions < current_version
        context = TermContext(self.model, self.options.temperature, forward=self.policy, idle=self._idle,
                              count=self._most if dist.enabled else None)
        # extra terms backpropagate on their own; without them, ranks sync gradients once per step
        sync_each = dist.any(any(r.extra_terms for r in batch.rollouts))
        for _epoch in range(self.trainer_cfg.ppo_epochs):
            minis = split_mini_batches(batch.num_seqs, self.trainer_cfg.mini_batches, self.generator)
            minis += [[] for _ in range(self._most(len(minis)) - len(minis))]  # the same steps on every rank
            for mini in minis:
                # the weights see the whole mini-batch over every rank, skipped sequences included
                lens = loss_lens[mini]
                seq_w = self._global_weights(lens) * in_loss[mini]
                weight_of = {i: float(w) for i, w in zip(mini, seq_w)}
                plans = self._plan(batch, [i for i in mini if i in computed])
                passes = self._most(len(plans))
                num_micro = int(dist.sum([len(plans)])[0]) if dist.enabled else len(plans)
                for k in range(passes):
                    self._set_sync(sync_each or k == passes - 1)
                    if k < len(plans):
                        _accumulate(sums, self._micro_step(batch, plans[k], weight_of, old_logp, stale, num_micro,
                                                           in_loss))
                    else:
                        self._idle(grad=True)
                norm = float(dist.sum([float(lens.sum())])[0])
                for name, (s, c) in apply_extra_terms(context, batch, mini, norm).items():
                    prev = terms.get(name)
                    terms[name] = (s, c) if prev is None else (prev[0] + s, prev[1] + c)
                grad_norms.append(self._optimizer_step())
        total = float(batch.completion_lens.sum())
        skipped = total - float(batch.completion_lens[sorted(computed)].sum()) if computed else total
        sums = self._reduce(sums)
        sums.setdefault("loss", torch.zeros(()))
        tokens = sums.pop("tokens", torch.zeros(())).clamp_min(1.0)
        loss = sums.pop("loss") / len(grad_norms)  # the objective of each optimizer step, averaged
        out = {k: (v if k.endswith("_max") else v / tokens) for k, v in sums.items()}
        for name, (s, c) in self._reduce_terms(terms).items():
            out[name] = s / c.clamp_min(1.0)  # per token of the term
        skipped, total = (float(x) for x in dist.sum([skipped, total]))
        out["loss"] = loss
        out["grad_norm"] = torch.stack(grad_norms).mean()
        out["lr"] = torch.tensor(self.scheduler.get_last_lr()[0])
        out["update/skipped_token_frac"] = torch.tensor(skipped / total if total else 0.0)
        out["update/optimizer_skipped"] = torch.tensor(0.0)
        if self.options.mask_truncated:
            masked, seqs = (float(x) for x in dist.sum([float((~in_loss).sum()), float(batch.num_seqs)]))
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

    def _reduce(self, sums: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Token-weighted sums add up over ranks; `*_max` entries take the maximum."""
        if not self.dist.enabled:
            return sums
        merged: dict[str, torch.Tensor] = {}
        for part in self.dist.gather({k: v.detach().double().cpu() for k, v in sums.items()}):
            _accumulate(merged, part)
        return {k: v.float() for k, v in merged.items()}

    def _reduce_terms(self, terms):
        if not self.dist.enabled:
            return terms
        merged: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        for part in self.dist.gather({k: (s.double().cpu(), c.double().cpu()) for k, (s, c) in terms.items()}):
            for k, (s, c) in part.items():
                prev = merged.get(k)
                merged[k] = (s, c) if prev is None else (prev[0] + s, prev[1] + c)
        return {k: (s.float(), c.float()) for k, (s, c) in merged.items()}

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

    def _micro_step(self, batch, plan, weight_of, old_logp, stale, num_micro, in_loss):
        """One micro-batch: the host builds its inputs and queues them to the device, then `_run`."""
        x = self._inputs(batch, plan)
        tokens_in = self._token_inputs(batch, plan, weight_of, old_logp, stale, num_micro, in_loss)
        return self._run(x, *to_device(tokens_in, self.device))

    def _run(self, x: DecoderInputs, w, adv, sampler, old, corrected, is_w=None) -> dict[str, torch.Tensor]:
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
                out = grpo_loss(mb.hidden, weight, mb.targets, old, adv, w, ref_logp=ref, is_weights=is_w,
                                sampler_logp=corrected, seq_ids=mb.seq_index, num_seqs=len(mb.seqs),
                                options=self.options, backend=self.backend)
            out.loss.backward()
        return self._micro_metrics(out, w, sampler, ref is not None)

    def _token_inputs(self, batch, plan, weight_of, old_logp, stale, num_micro, in_loss) -> list[torch.Tensor]:
        """[N] fp32 host vectors of the micro-batch's tokens: w, adv, sampler, old, corrected[, is_w]."""
        lens = batch.completion_lens[plan]
        if self.aggregation.per_micro_batch:  # e.g. TRL's bnpo: this micro-batch's own normaliser
            kept = in_loss[plan]
            seq_w = sequence_weights(lens * kept, self.options.aggregation,
                                     self.options.max_completion_len) * kept / num_micro
        else:
            seq_w = torch.tensor([weight_of[i] for i in plan], dtype=torch.float64)
        w = torch.repeat_interleave(seq_w, lens)
        adv = torch.repeat_interleave(batch.advantages[plan], lens)
        sampler = torch.cat([batch.sampler_logprobs(i) for i in plan])
        # The behaviour policy is what sampled the tokens: without a recomputed old pass (one
        # optimizer step per batch) and for stale async re-rolls, pi_old is the sampler's log-prob.
        old = torch.cat([
            old_logp[i] if old_logp is not None and i in old_logp and (not stale[i] or _moved(batch, i))
            else batch.sampler_logprobs(i)
            for i in plan
        ])
        is_w = self._policy_weights(batch, plan, old, sampler)
        # The mismatch correction (loss.is_mode) reads the sampler's log-probs; a sequence that a
        # method weighs itself takes none (its sampler side is pi_old: a ratio of exactly 1).
        corrected = torch.cat([old_i if batch.rollouts[i].weighting is not None else s_i for i, old_i, s_i in
                               zip(plan, old.split(lens.tolist()), sampler.split(lens.tolist()))])
        vectors = [w, adv, sampler, old, corrected] + ([is_w] if is_w is not None else [])
        return [v.to(torch.float32) for v in vectors]

    def _micro_metrics(self, out, w: torch.Tensor, sampler: torch.Tensor, with_ref: bool) -> dict[str, torch.Tensor]:
        """Token-weighted sums of the kernels' means (means over active tokens, NaN for none). Which
        metrics exist is known without looking at a value, so nothing here waits for the device."""
        active = (w != 0).float()
        tokens = active.sum()
        m = {"tokens": tokens, "loss": out.loss.detach()}
        corrects = self.options.is_cap > 0
        computed = {"kl_mean": with_ref, "entropy_mean": out.entropy is not None,
                    "is_weight_mean": corrects, "is_masked_frac": corrects}
        for name, key in [("clip_frac_low", "clip_frac_low"), ("clip_frac_high", "clip_frac_high"),
                          ("ratio_mean", "ratio_mean"), ("entropy_mean", "entropy"), ("kl_mean", "kl"),
                          ("is_weight_mean", "is/weight_mean"), ("is_masked_frac", "is/masked_frac")]:
            if computed.get(name, True):
                m[key] = torch.nan_to_num(getattr(out, name), nan=0.0) * tokens
        if "clip_frac_low" in m:
            m["clip_frac"] = m["clip_frac_low"] + m["clip_frac_high"]
        m["ratio_max"] = out.ratio_max
        m["rollout/logp_mismatch"] = ((out.logp - sampler).abs() * active).sum()
        return m

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


def _moved(batch: TrainBatch, i: int) -> bool:
    """Trained in another context than the one it was sampled in (e.g. a transfer re-roll)."""
    return batch.rollouts[i].behaviour_prompt_ids is not None


def _accumulate(sums: dict[str, torch.Tensor], metrics: dict[str, torch.Tensor]) -> None:
    """Token-weighted sums add up across micro-batches; `*_max` entries keep the maximum."""
    for k, v in metrics.items():
        if k not in sums:
            sums[k] = v
        elif k.endswith("_max"):
            sums[k] = torch.maximum(sums[k], v)
        else:
            sums[k] = sums[k] + v
