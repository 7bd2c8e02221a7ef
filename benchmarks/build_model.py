#!/usr/bin/env python
"""Builds a randomly initialised model folder for the GPU checks (nothing is downloaded).

    python benchmarks/build_model.py SIZE OUT_DIR [TOKENIZER_DIR]

SIZE: `tiny` (the tiny test model's shape), `0p5b` (a 0.51B Llama: SmolLM2's 49,152-token vocabulary,
tied embeddings, 24 layers of width 1024, 16 heads of 64, no GQA, MLP 4864) or `1p5b` (Qwen2.5-1.5B's
shape: hidden 1536, 28 layers, 12 query and 2 KV heads of 128, MLP 8960, V = 151,936, q/k/v biases,
tied embeddings). The tokenizer is SmolLM2's (TOKENIZER_DIR, else the prepared SmolLM2 folder); ids
the 1.5B model samples beyond its 49,152 tokens decode to nothing, which a length reward does not mind.
Saved in bf16, as a model folder ships, with gpu_check_model.json (size, parameter count, shape).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

SHAPES = {
    "tiny": {"hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2, "num_attention_heads": 2,
             "num_key_value_heads": 2, "head_dim": 64},
    "0p5b": {"hidden_size": 1024, "intermediate_size": 4864, "num_hidden_layers": 24, "num_attention_heads": 16,
             "num_key_value_heads": 16, "head_dim": 64},
    "1p5b": {"hidden_size": 1536, "intermediate_size": 8960, "num_hidden_layers": 28, "num_attention_heads": 12,
             "num_key_value_heads": 2, "vocab_size": 151936, "rope_theta": 1e6},
}


def build(size: str, out: Path, tok_dir: str | None = None) -> dict:
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    if size not in SHAPES:
        raise SystemExit(f"build_model: unknown size {size!r}; one of {sorted(SHAPES)}")
    if not tok_dir:
        from mentor_fast.models import prepare_smollm2
        tok_dir = prepare_smollm2()
    tok = AutoTokenizer.from_pretrained(tok_dir)
    dims = dict(SHAPES[size])
    common = {"max_position_embeddings": 4096, "tie_word_embeddings": True, "bos_token_id": tok.bos_token_id,
              "eos_token_id": tok.eos_token_id, "pad_token_id": tok.pad_token_id}
    if size == "1p5b":
        config, cls = Qwen2Config(**common, **dims), Qwen2ForCausalLM
    else:
        config, cls = LlamaConfig(vocab_size=len(tok), **common, **dims), LlamaForCausalLM
    torch.manual_seed(0)
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):  # random init is fast on the GPU
        model = cls(config)
    params = sum(p.numel() for p in model.parameters())  # the tied head counted once
    model.to(torch.bfloat16).save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    info = {"size": size, "params": params, "vocab_size": config.vocab_size, **dims}
    (out / "gpu_check_model.json").write_text(json.dumps(info))
    return info


if __name__ == "__main__":
    if len(sys.argv) not in (3, 4):
        raise SystemExit(__doc__)
    info = build(sys.argv[1], Path(sys.argv[2]), sys.argv[3] if len(sys.argv) == 4 else None)
    print(f"built {sys.argv[2]}: {info['size']}, {info['params'] / 1e9:.3f}B parameters")
