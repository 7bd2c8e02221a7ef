"""Prompt token ids from the chat template, with MENTOR hints that keep the original prompt as a prefix.

The hinted prompt q+h must start with q's tokens up to the end of the question, so vLLM's prefix
cache reuses q's KV blocks for the re-rolls (docs/mentor.md, "One step"). The template is rendered
once per question with a sentinel at the end of the user content and split there into head (everything up
to the end of the question) and tail (end-of-turn marker and the assistant header). The pieces are
tokenized separately (special-token strings in the template text map to their ids) and joined:

    unhinted = head + tail            hinted = head + ids(HINT_HEADER + hint) + tail

For SmolLM2 the tail starts with the special token <|im_end|>, which always splits the text, so
`unhinted` equals apply_chat_template(..., tokenize=True) exactly (checked in tests/test_data.py).
The hinted ids differ from tokenizing the joined text only at the question/header boundary (e.g.
"?" + "\\n\\n" instead of a merged "?\\n\\n" token): that is the price of an exact prefix. The hint
is tokenized with split_special_tokens=True, so a hint containing "<|im_end|>" cannot close the
user turn.
"""

from __future__ import annotations

import collections
from typing import Any

from mentor_fast.config import DataConfig
from mentor_fast.types import Problem

HINT_HEADER = "\n\nA tutor looked at your previous attempt and suggests:\n"
_SENTINEL = "<<<mentor_fast:hint-slot>>>"


class PromptTooLong(ValueError):
    """The templated prompt has more than max_prompt_tokens tokens (the trainer drops and counts it)."""

    def __init__(self, problem_id: str, length: int, limit: int, hinted: bool):
        what = "hinted prompt" if hinted else "prompt"
        super().__init__(f"problem {problem_id!r}: {what} is {length} tokens, over max_prompt_tokens={limit}")
        self.problem_id, self.length, self.limit, self.hinted = problem_id, length, limit, hinted


class PromptBuilder:
    """`encode(problem, hint=None) -> token ids` through the tokenizer's chat template."""

    def __init__(self, tokenizer: Any, system_prompt: str, max_prompt_tokens: int, cache_size: int = 4096):
        """system_prompt "" leaves the system turn to the template (SmolLM2 then adds its default)."""
        self.tokenizer = tokenizer
        self.system_prompt = system_prompt
        self.max_prompt_tokens = max_prompt_tokens
        self._cache: collections.OrderedDict[tuple, tuple[list[int], list[int]]] = collections.OrderedDict()
        self._cache_size = cache_size

    @classmethod
    def from_config(cls, tokenizer: Any, cfg: DataConfig) -> PromptBuilder:
        return cls(tokenizer, cfg.system_prompt, cfg.max_prompt_tokens)

    def messages(self, user_content: str, context: tuple[tuple[str, str], ...] = ()) -> list[dict[str, str]]:
        """`context`: the turns before the user's (a conversational prompt's); system_prompt is added
        only when they hold no system message of their own."""
        own_system = any(role == "system" for role, _ in context)
        system = [{"role": "system", "content": self.system_prompt}] if self.system_prompt and not own_system else []
        turns = [{"role": role, "content": content} for role, content in context]
        return [*system, *turns, {"role": "user", "content": user_content}]

    def chat(self, problem: Problem, hint: str | None = None) -> list[dict[str, str]]:
        """The prompt as chat messages (what TRL's reward functions get as `prompts`)."""
        return self.messages(self.user_content(problem, hint), problem.context)

    def user_content(self, problem: Problem, hint: str | None = None) -> str:
        return problem.question if hint is None else problem.question + HINT_HEADER + hint

    def render(self, problem: Problem, hint: str | None = None) -> str:
        """The prompt as text (for logs and text-only backends), as the template renders it."""
        return self.tokenizer.apply_chat_template(self.chat(problem, hint), tokenize=False, add_generation_prompt=True)

    def _ids(self, text: str, split_special: bool = False) -> list[int]:
        enc = self.tokenizer(text, add_special_tokens=False, split_special_tokens=split_special)
        return list(enc["input_ids"])

    def _head_tail(self, problem: Problem) -> tuple[list[int], list[int]]:
        key = (problem.context, problem.question)
        if key in self._cache:
            self._cache.move_to_end(key)
            return self._cache[key]
        text = self.tokenizer.apply_chat_template(
            self.messages(problem.question + _SENTINEL, problem.context), tokenize=False, add_generation_prompt=True
        )
        if text.count(_SENTINEL) != 1:
            raise ValueError("the chat template does not keep the user content verbatim; cannot place hints")
        head, tail = text.split(_SENTINEL)
        pieces = (self._ids(head), self._ids(tail))
        self._cache[key] = pieces
        if len(self._cache) > self._cache_size:
            self._cache.popitem(last=False)
        return pieces

    def encode(self, problem: Problem, hint: str | None = None) -> list[int]:
        """Prompt ids; with a hint, `ids[:len(head)]` are the unhinted prompt's head ids (prefix caching)."""
        head, tail = self._head_tail(problem)
        middle = [] if hint is None else self._ids(HINT_HEADER + hint, split_special=True)
        ids = [*head, *middle, *tail]
        if len(ids) > self.max_prompt_tokens:
            raise PromptTooLong(problem.id, len(ids), self.max_prompt_tokens, hint is not None)
        return ids

    def head_length(self, problem: Problem) -> int:
        """Tokens shared by the prompt and every hinted prompt of this problem."""
        return len(self._head_tail(problem)[0])

    def decode_completion(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)
