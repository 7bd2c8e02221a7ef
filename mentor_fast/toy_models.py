"""Toy models built in code, for tests and experiments: a tiny random Llama with SmolLM2's tokenizer,
and a small Llama for the arithmetic ladder with a tokenizer of its own. `model.path` names them
("tiny-llama[:seed]", "ladder-llama[:seed[:hidden]]"; models.TOY_MODELS); each is built once and
cached as a safetensors folder.
"""

from __future__ import annotations

import re
from pathlib import Path

import torch

# by attribute, so that a caller (benchmarks/gpu_check.sh) can stand in a tokenizer folder of its own
from mentor_fast import models as policy_models


def _name_ints(name: str, defaults: tuple[int, ...]) -> tuple[int, ...]:
    """The integers after a built-in name's colons ("ladder-llama:1:256"), defaults for the rest."""
    given = [int(x) for x in name.split(":")[1:]]
    return (*given[: len(defaults)], *defaults[len(given):])


def tiny_llama(name: str = "tiny-llama") -> Path:
    """`model.path=tiny-llama[:seed]`: build_tiny_llama, cached per seed."""
    (seed,) = _name_ints(name, (0,))
    return build_tiny_llama(policy_models.cache_dir() / f"tiny-llama-{seed}", seed=seed)


def ladder_llama(name: str = "ladder-llama") -> Path:
    """`model.path=ladder-llama[:seed[:hidden]]`: build_ladder_llama, cached per seed and width."""
    seed, hidden = _name_ints(name, (0, 128))
    return build_ladder_llama(policy_models.cache_dir() / f"ladder-llama-{seed}-h{hidden}", seed=seed, hidden=hidden)


def build_tiny_llama(out: str | Path, seed: int = 0, hidden: int = 128, layers: int = 2) -> Path:
    """A randomly initialised Llama (head_dim 64) with SmolLM2's tokenizer, saved as safetensors.

    Used by tests and `configs/tiny_test.yaml`: real code paths (tokenizer, chat template, HF and
    vLLM loading) at a size that trains in seconds on 2 cores.
    """
    from transformers import AutoTokenizer

    out = Path(out)
    if (out / "config.json").is_file():
        return out
    tok = AutoTokenizer.from_pretrained(policy_models.prepare_smollm2())
    policy_models.save_atomic(_random_llama(tok, hidden, layers, 2048, seed), tok, out, ".tiny-")
    return out


LADDER_SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")


def _ladder_corpus(smollm2_tok, n_per_level: int = 300) -> list[str]:
    """Prompts (templated, with and without the reference mentor's hints) and worked solutions of
    every ladder level and digit cap: what a ladder run tokenizes. Special tokens are cut out; the
    tokenizer matches them whole."""
    import random

    from mentor_fast.data.chat import PromptBuilder
    from mentor_fast.data.ladder import ARITHMETIC_LEVELS, make_problem
    from mentor_fast.mentor.writers.solutions import cold_hint
    from mentor_fast.tasks.math import SYSTEM_PROMPT as MATH_SYSTEM_PROMPT

    builder = PromptBuilder(smollm2_tok, MATH_SYSTEM_PROMPT, 10**6)
    texts = []
    # Levels 1-6 only: level 7's one character beyond them, '#', is a byte token, and leaving its
    # problems out keeps every tokenizer built from this corpus the same.
    for level in ARITHMETIC_LEVELS:
        for max_digits in (0, 1, 2):
            rng = random.Random(f"ladder-tokenizer:{level}:{max_digits}")
            for i in range(n_per_level):
                p = make_problem(level, rng, max_digits=max_digits)
                hint = None if i % 4 == 0 else cold_hint(p, 1 + i % 3)
                texts.append(builder.render(p, hint))
                texts.append("\n".join(p.solution_steps) + f"\nThe answer is \\boxed{{{p.gold}}}.")
    split = re.compile("|".join(re.escape(t) for t in LADDER_SPECIALS))
    return [piece for text in texts for piece in split.split(text) if piece]


def build_ladder_llama(out: str | Path, seed: int = 0, hidden: int = 128, layers: int = 4,
                       vocab_size: int = 512) -> Path:
    """A small Llama for the arithmetic ladder, trained from scratch by its user, with its own tokenizer.

    The tokenizer is a byte-level BPE trained here on ladder text (`_ladder_corpus`), digits split
    one per token as in SmolLM2, SmolLM2's chat template and special tokens (so prompts and hints are
    built exactly as for SmolLM2). With under 512 tokens the LM head costs almost nothing: at the
    defaults the model has 0.7M parameters, and a supervised start on 1-digit ladder levels takes
    about 8 minutes on 2 cores. `experiments/collapse.py --model ladder-llama` uses it where
    SmolLM2-135M cannot do the arithmetic of the jumped level. Any text still encodes (byte-level
    fallback). Deterministic for a given seed.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    out = Path(out)
    if (out / "config.json").is_file():
        return out
    smollm2_tok = AutoTokenizer.from_pretrained(policy_models.prepare_smollm2())
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(LADDER_SPECIALS),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    bpe.train_from_iterator(_ladder_corpus(smollm2_tok), trainer)
    tok = PreTrainedTokenizerFast(tokenizer_object=bpe, bos_token="<|im_start|>", eos_token="<|im_end|>",
                                  pad_token="<|endoftext|>", unk_token="<|endoftext|>")
    tok.chat_template = smollm2_tok.chat_template
    policy_models.save_atomic(_random_llama(tok, hidden, layers, 1024, seed), tok, out, ".ladder-")
    return out


def _random_llama(tok, hidden: int, layers: int, max_positions: int, seed: int):
    """A randomly initialised fp32 Llama for `tok`: head_dim 64, MLP width 2 x hidden, tied embeddings."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=hidden // 64,
        num_key_value_heads=hidden // 64,
        head_dim=64,
        max_position_embeddings=max_positions,
        tie_word_embeddings=True,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    torch.manual_seed(seed)
    return LlamaForCausalLM(config).to(torch.float32)
