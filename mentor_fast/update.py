"""The policy update: forward over packed completion tokens, the GRPO loss, backward, optimizer.

Only completion positions reach the LM head: the decoder runs over prompt + completion, then the
hidden states that predict completion tokens are gathered into [N, H] (no padding rows) and handed
to the loss, either the plain-torch reference (materialised [N, V] logits, the vanilla baseline)
or the fused kernels (never builds [N, V]).

Two exact savings (both on by default, both off-switchable in TrainerConfig):
- shared prompts: a group's G rows share one prompt, so each distinct prompt of a micro-batch runs
  through the decoder once and the G completions attend to its keys/values (gradients flow back
  through them), instead of G copies of the prompt forward and backward;
- zero-advantage sequences (all-fail and all-pass groups) are skipped when beta = 0 and there is
  no entropy bonus: every term of their loss is A * (...) = 0, so their gradient is exactly 0.
  They keep their place in the aggregation's normaliser, so the update does not change.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass

import torch
from transformers.cache_utils import DynamicCache

from mentor_fast.algo.batch import (
    TrainBatch,
    plan_micro_batches,
    plan_shared_micro_batches,
    split_mini_batches,
)
from mentor_fast.algo.loss import logp_and_entropy_ref, policy_loss, sequence_token_weights
from mentor_fast.config import LossConfig, OptimConfig, TrainerConfig


@dataclass
class MicroBatch:
    hidden: torch.Tensor  # [N, H] completion-predicting hidden states
    targets: torch.Tensor  # [N]
    seq_index: torch.Tensor  # [N] position of each token's sequence within the micro-batch list
    seqs: list[int]  # batch indices of the sequences, in order


def build_optimizer(model: torch.nn.Module, cfg: OptimConfig, max_steps: int):
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=cfg.lr, betas=tuple(cfg.betas), weight_decay=cfg.weight_decay)

    def factor(step: int) -> float:
        if cfg.warmup_steps and step < cfg.warmup_steps:
            return (step + 1) / cfg.warmup_steps
        if cfg.schedule == "constant":
            return 1.0
        span = max(1, max_steps - cfg.warmup_steps)
        progress = min(1.0, (step - cfg.warmup_steps) / span)
        if cfg.schedule == "linear":
            return 1.0 - progress
        return 0.5 * (1.0 + math.cos(math.pi * progress))

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
    return optimizer, scheduler


class PolicyUpdater:
    """Runs PPO epochs x mini-batches x micro-batches over one TrainBatch."""

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        scheduler,
        loss_cfg: LossConfig,
        trainer_cfg: TrainerConfig,
        optim_cfg: OptimConfig,
        *,
        temperature: float,
        max_new_tokens: int,
        pad_id: int,
        autocast_bf16: bool = False,
        ref_model: torch.nn.Module | None = None,
        seed: int = 0,
        transfer_is_cap: float = 1.0,
        shaping_gamma: float | None = None,
        distill_coef: float = 0.0,
    ):
        self.model, self.optimizer, self.scheduler = model, optimizer, scheduler
        self.transfer_is_cap = transfer_is_cap
        self.shaping_gamma = shaping_gamma  # set: moved re-rolls get the shaping weight, not IS
        self.distill_coef = distill_coef  # > 0: distil the hinted policy into the bare prompt (_distill)
        self.loss_cfg, self.trainer_cfg, self.optim_cfg = loss_cfg, trainer_cfg, optim_cfg
        self.temperature, self.max_new_tokens, self.pad_id = temperature, max_new_tokens, pad_id
        self.autocast_bf16 = autocast_bf16
        self.ref_model = ref_model
        self.generator = torch.Generator().manual_seed(seed)
        # The prompt keys/values are passed between two decoder calls, which HF's gradient
        # checkpointing does not allow (it drops the cache): fall back to full rows there.
        self.share_prompts = trainer_cfg.shared_prompt_forward and not getattr(
            model, "is_gradient_checkpointing", False)
        self.skip_zero_advantage = (trainer_cfg.skip_zero_advantage and loss_cfg.beta == 0
                                    and loss_cfg.entropy_coef == 0 and loss_cfg.aggregation != "token_mean_micro")
        self._fused = None
        if loss_cfg.impl == "fused":
            from mentor_fast.kernels import grpo_loss  # the kernels package has no heavy imports

            self._fused = grpo_loss

    # ---------------------------------------------------------------- forward pieces
    def _autocast(self):
        if self.autocast_bf16:
            return torch.autocast("cpu" if not torch.cuda.is_available() else "cuda", dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def _plan(self, batch: TrainBatch, seqs: list[int]) -> list[list[int]]:
        budget = self.trainer_cfg.micro_batch_tokens
        if self.share_prompts:
            return plan_shared_micro_batches(batch.prompt_index, batch.prompt_lens.tolist(),
                                             batch.completion_lens.tolist(), seqs, budget)
        return plan_micro_batches([len(x) for x in batch.input_ids], seqs, budget)

    def _hidden(self, model: torch.nn.Module, batch: TrainBatch, seqs: list[int]) -> MicroBatch:
        if self.share_prompts and len({batch.prompt_index[i] for i in seqs}) < len(seqs):
            return self._hidden_shared(model, batch, seqs)
        return self._hidden_rows(model, batch, seqs)

    def _hidden_shared(self, model: torch.nn.Module, batch: TrainBatch, seqs: list[int]) -> MicroBatch:
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
        p_ids = torch.full((len(uniq), p_width), self.pad_id, dtype=torch.long)
        p_mask = torch.zeros((len(uniq), p_width), dtype=torch.long)
        for r, (u, p) in enumerate(zip(uniq, plens)):
            p_ids[r, :p] = torch.tensor(batch.input_ids[first[u]][:p])
            p_mask[r, :p] = 1
        row_of = {u: r for r, u in enumerate(uniq)}
        expand = torch.tensor([row_of[batch.prompt_index[i]] for i in seqs])  # [S] -> prompt row
        c_ids = torch.full((len(seqs), c_width), self.pad_id, dtype=torch.long)
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
        with self._autocast():
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

    def _hidden_rows(self, model: torch.nn.Module, batch: TrainBatch, seqs: list[int]) -> MicroBatch:
        """Full rows (prompt + completion, right-padded) through the decoder."""
        device = next(model.parameters()).device
        rows = [batch.input_ids[i] for i in seqs]
        width = max(len(r) for r in rows)
        ids = torch.full((len(rows), width), self.pad_id, dtype=torch.long)
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
        with self._autocast():
            hidden = model.get_decoder()(input_ids=ids, attention_mask=mask).last_hidden_state  # [b, T, H]
        rr = torch.tensor(row_idx, dtype=torch.long, device=device)
        cc = torch.tensor(col_idx, dtype=torch.long, device=device)
        return MicroBatch(hidden[rr, cc], ids[rr, cc + 1], torch.tensor(seq_index, device=device), seqs)

    def _logp(self, model: torch.nn.Module, mb: MicroBatch, with_entropy: bool):
        weight = model.get_output_embeddings().weight
        # fp32 logits: bf16 logits put a 3-6% error into the ratio (research/kernels.md)
        with torch.autocast(mb.hidden.device.type, enabled=False):
            return logp_and_entropy_ref(
                mb.hidden.float(), weight.float(), mb.targets, self.temperature, with_entropy,
                entropy_grad=self.loss_cfg.entropy_coef > 0,
            )

    @torch.no_grad()
    def logprobs(self, model: torch.nn.Module, batch: TrainBatch, seqs: list[int]) -> dict[int, torch.Tensor]:
        """No-grad per-sequence completion log-probs in each sequence's own context."""
        out = {}
        for plan in self._plan(batch, seqs):
            mb = self._hidden(model, batch, plan)
            if self._fused is not None:
                from mentor_fast.kernels import token_logprobs

                weight = model.get_output_embeddings().weight
                logp = token_logprobs(mb.hidden, weight, mb.targets, temperature=self.temperature)
            else:
                logp, _ = self._logp(model, mb, with_entropy=False)
            for j, i in enumerate(plan):
                out[i] = logp[mb.seq_index == j].float().cpu()
        return out

    # ---------------------------------------------------------------- the update
    def update(self, batch: TrainBatch, old_logp: dict[int, torch.Tensor] | None, current_version: int):
        """One rollout batch -> ppo_epochs x mini_batches optimizer steps. Returns metric tensors.

        old_logp: recomputed log-probs per sequence (needed with several optimizer steps per batch).
        None: pi_old is the sampler's log-prob of each token (the behaviour policy; on the HF engine in
        fp32 it equals the trainer's to ~1e-5, see `rollout/logp_mismatch`), so no separate forward
        is spent on it. Rollouts sampled by an older policy version (async mentor re-rolls) always
        use their sampler log-probs. Transfer re-rolls (trained in another context than they were
        sampled in) always get pi_old recomputed in their training context, here if need be.
        """
        cfg = self.loss_cfg
        if not self.optim_cfg.step_without_signal and self.signal_free(batch):
            self.scheduler.step()  # the schedule follows trainer steps, taken or not
            return {"loss": torch.zeros(()), "grad_norm": torch.zeros(()),
                    "lr": torch.tensor(self.scheduler.get_last_lr()[0]),
                    "update/skipped_token_frac": torch.tensor(1.0), "update/optimizer_skipped": torch.tensor(1.0)}
        sums: dict[str, torch.Tensor] = {}
        grad_norms = []
        stale = batch.policy_versions < current_version
        computed = set(self.trainable(batch))
        moved = [i for i in sorted(computed) if _moved(batch, i) and (old_logp is None or i not in old_logp)]
        if moved:
            old_logp = {**(old_logp or {}), **self.logprobs(self.model, batch, moved)}
        for _epoch in range(self.trainer_cfg.ppo_epochs):
            for mini in split_mini_batches(batch.num_seqs, self.trainer_cfg.mini_batches, self.generator):
                # the weights see the whole mini-batch, skipped sequences included
                seq_w = sequence_token_weights(batch.completion_lens[mini], cfg.aggregation, self.max_new_tokens)
                weight_of = {i: float(w) for i, w in zip(mini, seq_w)}
                plans = self._plan(batch, [i for i in mini if i in computed])
                for plan in plans:
                    _accumulate(sums, self._micro_step(batch, plan, weight_of, old_logp, stale, len(plans)))
                if self.distill_coef > 0:
                    _accumulate(sums, self._distill(batch, mini))
                grad_norms.append(self._optimizer_step())
        total = float(batch.completion_lens.sum())
        skipped = total - float(batch.completion_lens[sorted(computed)].sum()) if computed else total
        sums.setdefault("loss", torch.zeros(()))
        distill = (sums.pop("mentor/distill_kl_sum", None), sums.pop("mentor/distill_tokens_sum", None))
        tokens = sums.pop("tokens", torch.zeros(())).clamp_min(1.0)
        loss = sums.pop("loss") / len(grad_norms)  # the objective of each optimizer step, averaged
        out = {k: (v if k.endswith("_max") else v / tokens) for k, v in sums.items()}
        out["loss"] = loss
        out["grad_norm"] = torch.stack(grad_norms).mean()
        out["lr"] = torch.tensor(self.scheduler.get_last_lr()[0])
        out["update/skipped_token_frac"] = torch.tensor(skipped / total if total else 0.0)
        out["update/optimizer_skipped"] = torch.tensor(0.0)
        if distill[0] is not None:  # mean KL per distilled position, over the epochs
            out["mentor/distill_kl"] = distill[0] / distill[1].clamp_min(1.0)
        return out

    def _distill(self, batch: TrainBatch, mini: list[int]) -> dict[str, torch.Tensor]:
        """mentor.distill_coef: for each mentor re-roll y in the mini-batch, the bare prompt q is
        pulled toward the hinted policy on y's prefixes, lambda sum_t KL(pi(.|q+h, y<t) || pi(.|q, y<t))
        over the whole vocabulary, the teacher (q + h) detached, divided by the mini-batch's
        completion tokens like the policy loss (research/algorithm.md 2.9, mode D).

        Forward KL (teacher first), where the memo writes the student first: its logits gradient is
        lambda (p_student - p_teacher), which lifts a token the hint made likely even when the bare
        prompt gives it 1e-4 (the case README's run G measures). The reverse KL's gradient on such
        a token is proportional to its own tiny mass. A re-roll of loss_mode=group has no bare
        prompt in its group, so it is skipped."""
        bare_of = {int(g): r.prompt_ids for g, r in zip(batch.group_index, batch.rollouts) if r.origin == "initial"}
        pairs = []
        for i in mini:
            r = batch.rollouts[i]
            bare = bare_of.get(int(batch.group_index[i]))
            hinted = r.behaviour_prompt_ids or r.prompt_ids
            if r.origin == "mentor" and bare is not None and bare != hinted:
                pairs.append((bare, hinted, list(r.completion_ids)))
        if not pairs:
            return {}
        norm = float(batch.completion_lens[mini].sum())
        device = next(self.model.parameters()).device
        total = torch.zeros(())
        for bare, hinted, completion in pairs:
            logp = {}
            for name, prompt in (("teacher", hinted), ("student", bare)):
                with torch.set_grad_enabled(name == "student"):
                    ids = torch.tensor([prompt + completion], device=device)
                    logits = self.model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float()
                    logp[name] = torch.log_softmax(logits / self.temperature, -1)
            kl = (logp["teacher"].exp() * (logp["teacher"] - logp["student"])).sum()
            (self.distill_coef * kl / norm).backward()
            total = total + kl.detach().cpu()
        return {"mentor/distill_kl_sum": total, "mentor/distill_tokens_sum": torch.tensor(
            float(sum(len(c) for _, _, c in pairs)))}

    def signal_free(self, batch: TrainBatch) -> bool:
        """True when the batch's gradient is exactly 0: every advantage is 0 and no term (KL, entropy
        bonus) acts without one."""
        cfg = self.loss_cfg
        return cfg.beta == 0 and cfg.entropy_coef == 0 and not bool(batch.advantages.ne(0).any())

    def trainable(self, batch: TrainBatch) -> list[int]:
        """The sequences whose forward/backward can change the update (see the module docstring)."""
        if not self.skip_zero_advantage:
            return list(range(batch.num_seqs))
        return [i for i in range(batch.num_seqs) if float(batch.advantages[i]) != 0.0]

    def _micro_step(self, batch, plan, weight_of, old_logp, stale, num_micro):
        cfg = self.loss_cfg
        mb = self._hidden(self.model, batch, plan)
        device = mb.hidden.device
        lens = batch.completion_lens[plan]
        w = torch.repeat_interleave(torch.tensor([weight_of[i] for i in plan], dtype=torch.float64), lens)
        if cfg.aggregation == "token_mean_micro":  # bnpo: normalise inside the micro-batch
            w = torch.full_like(w, 1.0 / max(1, int(lens.sum())) / num_micro)
        adv = torch.repeat_interleave(batch.advantages[plan], lens)
        sampler = torch.cat([batch.sampler_logprobs(i) for i in plan])
        # The behaviour policy is what sampled the tokens: without a recomputed old pass (one
        # optimizer step per batch) and for stale async re-rolls, pi_old is the sampler's log-prob.
        old = torch.cat([
            old_logp[i] if old_logp is not None and i in old_logp and (not stale[i] or _moved(batch, i))
            else batch.sampler_logprobs(i)
            for i in plan
        ])
        is_w = self._is_weights(batch, plan, old, sampler)
        ref = None
        if cfg.beta > 0:
            ref_all = self.logprobs(self.ref_model, batch, plan)
            ref = torch.cat([ref_all[i] for i in plan]).to(device)
        w, adv, sampler, old = (t.to(device=device, dtype=torch.float32) for t in (w, adv, sampler, old))
        is_w = is_w.to(device) if is_w is not None else None

        if self._fused is not None:
            return self._fused_micro_step(mb, w, adv, sampler, old, ref, is_w)
        logp, entropy = self._logp(self.model, mb, with_entropy=True)
        out = policy_loss(
            logp, old, adv, w, cfg, ref_logp=ref, is_weights=is_w,
            seq_index=mb.seq_index, num_seqs=len(plan), entropy=entropy,
        )
        out.loss.backward()
        metrics = out.metrics
        metrics["loss"] = out.loss.detach()
        active = (w != 0).float()
        metrics["rollout/logp_mismatch"] = ((logp.detach() - sampler).abs() * active).sum()
        return metrics

    def _is_weights(self, batch: TrainBatch, plan: list[int], old: torch.Tensor,
                    sampler: torch.Tensor) -> torch.Tensor | None:
        """Per-token weights on the policy term. Truncated IS min(pi_old / mu, cap), mu the sampler's
        log-prob: for a transfer re-roll the ratio carries the context shift (q vs q + hint; cap
        mentor.transfer_is_cap); otherwise the engine mismatch (cap loss.is_cap; 0: no correction).
        The weight is 1 where pi_old is the sampler's log-prob. With `shaping_gamma` set, a moved
        re-roll's tokens get gamma p / (p + gamma)^2, p = pi_old(y|q), instead (see algo/assemble.py)."""
        moved = [_moved(batch, i) for i in plan]
        caps = [self.transfer_is_cap if m else self.loss_cfg.is_cap for m in moved]
        shaped = self.shaping_gamma is not None and any(moved)
        if not shaped and not any(c > 0 for c in caps):
            return None
        lens = batch.completion_lens[plan]
        cap = torch.repeat_interleave(torch.tensor(caps, dtype=torch.float32), lens)
        ratio = (old - sampler).exp()
        out = torch.where(cap > 0, torch.minimum(ratio, cap), torch.ones_like(ratio))
        if shaped:
            gamma, p = self.shaping_gamma, old.exp()
            is_moved = torch.repeat_interleave(torch.tensor(moved), lens)
            out = torch.where(is_moved, gamma * p / (p + gamma) ** 2, out)
        return out

    def _fused_micro_step(self, mb, w, adv, sampler, old, ref, is_w):
        """The same objective through mentor_fast.kernels.grpo_loss: no [N, V] logits, the logits
        gradient formed in the forward pass (3 LM-head matmuls instead of 4)."""
        cfg = self.loss_cfg
        weight = self.model.get_output_embeddings().weight
        with torch.autocast(mb.hidden.device.type, enabled=False):
            out = self._fused(
                mb.hidden, weight, mb.targets, old, adv, w, ref_logp=ref, is_weights=is_w,
                seq_ids=mb.seq_index, loss_type="gspo" if cfg.ratio_level == "sequence" else "dapo",
                eps_low=cfg.eps_low, eps_high=cfg.eps_high, dual_clip=cfg.dual_clip,
                temperature=self.temperature, beta=cfg.beta, kl_estimator=cfg.kl_estimator,
                entropy_coef=cfg.entropy_coef, is_cap=0.0,  # is_w arrives truncated
            )
        out.loss.backward()
        active = (w != 0).float()
        tokens = active.sum()
        m = {"tokens": tokens, "loss": out.loss.detach()}
        for name, key in [("clip_frac_low", "clip_frac_low"), ("clip_frac_high", "clip_frac_high"),
                          ("ratio_mean", "ratio_mean"), ("entropy_mean", "entropy"), ("kl_mean", "kl")]:
            value = getattr(out, name)
            if not torch.isnan(value):  # the kernels report means over active tokens; the trainer sums
                m[key] = value * tokens
        m["clip_frac"] = m["clip_frac_low"] + m["clip_frac_high"]
        m["ratio_max"] = out.ratio_max
        m["rollout/logp_mismatch"] = ((out.logp - sampler).abs() * active).sum()
        return m

    def _optimizer_step(self) -> torch.Tensor:
        for p in self.model.parameters():  # a skipped (all-zero) batch still steps AdamW's moments
            if p.requires_grad and p.grad is None:
                p.grad = torch.zeros_like(p)
        params = [p for p in self.model.parameters() if p.grad is not None]
        if self.optim_cfg.grad_clip > 0:
            norm = torch.nn.utils.clip_grad_norm_(params, self.optim_cfg.grad_clip)
        else:
            norm = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in params])) if params else torch.zeros(())
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return norm.detach().float().cpu()


def _moved(batch: TrainBatch, i: int) -> bool:
    """A transfer re-roll: trained in another context than the one it was sampled in."""
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
