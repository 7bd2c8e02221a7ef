"""Text backends on a local model: the policy itself through the rollout engine (`SelfBackend`), or
a second model folder through transformers `generate` (`LocalBackend`)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from mentor_fast.mentor.counts import Counts
from mentor_fast.mentor.writers.base import Messages

if TYPE_CHECKING:  # the rollout package imports torch; the mentor stays light until a backend needs it
    from mentor_fast.rollout.base import RolloutEngine


def _chat_ids(tokenizer: Any, messages: Messages) -> list[int]:
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


class SelfBackend:
    """The policy as its own mentor, through the same rollout engine (one batched generate call).

    It touches the engine, so with backend=self the mentor must not run in a background thread
    unless the engine is safe to call from two threads.
    """

    name = "self"

    def __init__(
        self, engine: RolloutEngine, tokenizer: Any, seed: int = 0, counts: Counts | None = None
    ) -> None:
        self.engine, self.tokenizer, self.seed = engine, tokenizer, seed
        self.counts = counts if counts is not None else Counts()
        self._calls = 0

    def complete(self, batch: list[Messages], max_tokens: int, temperature: float) -> list[str | None]:
        out: list[str | None] = [None] * len(batch)
        prompts, where = [], []
        for i, messages in enumerate(batch):
            ids = _chat_ids(self.tokenizer, messages)
            if len(ids) + max_tokens > self.engine.max_context_tokens:
                self.counts.add("errors/too_long")
                continue
            prompts.append(ids)
            where.append(i)
        if not prompts:
            return out
        from mentor_fast.rollout.base import SamplingParams

        self._calls += 1
        params = SamplingParams(
            n=1,
            max_new_tokens=max_tokens,
            temperature=temperature if temperature > 0 else 1.0,
            seed=self.seed + 7919 * self._calls,
            greedy=temperature <= 0,
        )
        for i, samples in zip(where, self.engine.generate(prompts, params)):
            out[i] = self.tokenizer.decode(samples[0].token_ids, skip_special_tokens=True)
        return out


class LocalBackend:
    """A second local model (HF folder or built-in name), loaded on first use, transformers generate."""

    name = "local"

    def __init__(
        self,
        model_path: str,
        device: str = "cpu",
        dtype: str = "float32",
        seed: int = 0,
        batch_size: int = 8,
        counts: Counts | None = None,
    ) -> None:
        self.model_path, self.device, self.dtype, self.seed, self.batch_size = (
            model_path,
            device,
            dtype,
            seed,
            batch_size,
        )
        self.counts = counts if counts is not None else Counts()
        self._model = self._tokenizer = None

    def _load(self) -> None:
        from mentor_fast.models import load_policy, load_tokenizer, resolve_model_path

        path = resolve_model_path(self.model_path)
        self._tokenizer = load_tokenizer(Path(path))
        self._model = load_policy(Path(path), self.dtype).to(self.device).eval()

    def complete(self, batch: list[Messages], max_tokens: int, temperature: float) -> list[str | None]:
        import torch

        if self._model is None:
            self._load()
        tok, model = self._tokenizer, self._model
        out: list[str | None] = []
        for start in range(0, len(batch), self.batch_size):
            texts = [
                tok.apply_chat_template(m, add_generation_prompt=True, tokenize=False)
                for m in batch[start : start + self.batch_size]
            ]
            enc = tok(texts, return_tensors="pt", padding=True, add_special_tokens=False).to(self.device)
            sample = temperature > 0
            # fork_rng: sampling here must not move the trainer's global RNG stream
            with torch.no_grad(), torch.random.fork_rng(devices=[]):
                torch.manual_seed(self.seed + start)
                gen = model.generate(
                    **enc,
                    max_new_tokens=max_tokens,
                    do_sample=sample,
                    temperature=temperature if sample else None,
                    top_p=None,
                    top_k=None,
                    pad_token_id=tok.pad_token_id,
                    use_cache=True,
                )
            new = gen[:, enc["input_ids"].shape[1] :]
            out.extend(tok.batch_decode(new, skip_special_tokens=True))
        return out
