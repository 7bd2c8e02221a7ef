"""GRPOConfig in TRL's shape: TRL's field names for what the two trainers share, ours for the rest.

`GRPOConfig(...).run_config()` is the RunConfig the CLI would build from a YAML file with the same
settings (config/loader.py applies both), so a script and `mentor-fast train` run the same.
Each TRL field is one entry of TRL_FIELDS: its conversion to our keys and a note; docs/python_api.md
is generated from it (`python -m mentor_fast.api.docs`). A TRL field without an entry is refused
by name, unless it holds the value that means "off" in TRL (NEUTRAL), which changes nothing.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mentor_fast.config import ConfigError, RunConfig, load_config
from mentor_fast.config.loader import nest

Values = dict[str, Any]  # our dotted keys -> values


@dataclass(frozen=True)
class TrlField:
    name: str
    ours: str  # the key(s) it sets, for the table
    convert: Callable[[Any, dict[str, Any]], Values]  # (value, every TRL field given) -> our keys
    note: str = ""


def _to(key: str) -> Callable[[Any, dict], Values]:
    return lambda v, _: {key: v}


def _choice(key: str, table: dict[Any, Any], field_name: str) -> Callable[[Any, dict], Values]:
    def convert(v: Any, _: dict) -> Values:
        if v not in table:
            raise ConfigError(f"GRPOConfig.{field_name}={v!r} is not supported; use one of {list(table)}")
        out = table[v]
        return out if isinstance(out, dict) else {key: out}
    return convert


def _epsilon_high(v: Any, given: dict) -> Values:
    return {"loss.eps_high": v if v is not None else given["epsilon"]}


def _epsilon(v: Any, given: dict) -> Values:
    # TRL: epsilon_high defaults to epsilon
    return {"loss.eps_low": v} | ({} if given.get("epsilon_high") is not None else {"loss.eps_high": v})


def _beta(v: Any, _: dict) -> Values:
    return {"loss.beta": v, "model.ref_model": v > 0}  # TRL keeps a reference model when beta > 0


def _batch(_: Any, given: dict) -> Values:
    """TRL counts completions per device; our step takes prompts_per_step prompts of G completions
    on every rank together, and splits them into mini_batches optimizer steps."""
    g = given.get("num_generations") or 8
    accum = given.get("gradient_accumulation_steps", 1)
    per_gen = given.get("steps_per_generation") or accum
    world = int(os.environ.get("WORLD_SIZE", "1"))
    completions = given.get("generation_batch_size") or given.get("per_device_train_batch_size", 8) * world * per_gen
    if completions % g or per_gen % accum:
        raise ConfigError(f"GRPOConfig: a generation batch of {completions} completions must hold whole groups of "
                          f"num_generations={g}, and steps_per_generation ({per_gen}) must be a multiple of "
                          f"gradient_accumulation_steps ({accum})")
    return {"rollout.prompts_per_step": completions // g, "trainer.mini_batches": per_gen // accum}


def _report_to(v: Any, _: dict) -> Values:
    names = {v} if isinstance(v, str) else set(v or [])
    if "all" in names:
        names = {"tensorboard", "wandb"}
    unknown = names - {"none", "tensorboard", "wandb"}
    if unknown:
        raise ConfigError(f"GRPOConfig.report_to: {sorted(unknown)} not supported; use tensorboard, wandb or none")
    return {"trainer.tensorboard": "tensorboard" in names, "trainer.wandb": "wandb" in names}


def _peft(v: Any, _: dict) -> Values:
    if v is None:
        return {}
    if getattr(v, "r", None) is None:
        raise ConfigError(f"GRPOConfig.peft_config: a peft.LoraConfig, got {type(v).__name__}")
    out = {"model.lora.rank": v.r, "model.lora.alpha": float(v.lora_alpha), "model.lora.dropout": v.lora_dropout}
    if isinstance(v.target_modules, (list, set, tuple)):
        out["model.lora.target_modules"] = sorted(v.target_modules)
    return out


def _vllm_server(_: Any, given: dict) -> Values:
    if given.get("vllm_server_base_url"):
        return {"rollout.vllm_server_url": given["vllm_server_base_url"]}
    host, port = given.get("vllm_server_host", "127.0.0.1"), given.get("vllm_server_port", 8000)
    return {"rollout.vllm_server_url": f"http://{host}:{port}"}


def _model_init(v: Any, _: dict) -> Values:
    v = dict(v or {})
    out = {}
    dtype = v.pop("dtype", v.pop("torch_dtype", None))
    if dtype is not None:
        out["model.dtype"] = str(dtype).removeprefix("torch.")
    if "attn_implementation" in v:
        out["model.attn_implementation"] = v.pop("attn_implementation")
    if v:
        raise ConfigError(f"GRPOConfig.model_init_kwargs: {sorted(v)} not supported (dtype and attn_implementation are)")
    return out


_LOSS_TYPES = {
    "dapo": {"loss.type": "clip", "loss.aggregation": "token_mean"},
    "grpo": {"loss.type": "clip", "loss.aggregation": "seq_mean_token_mean"},
    "dr_grpo": {"loss.type": "clip", "loss.aggregation": "constant"},
    "bnpo": {"loss.type": "clip", "loss.aggregation": "token_mean_micro"},
    "cispo": {"loss.type": "cispo", "loss.aggregation": "token_mean"},
    "sapo": {"loss.type": "sapo", "loss.aggregation": "token_mean"},
}
_BATCH = ("rollout.prompts_per_step, trainer.mini_batches", _batch,
          ("with num_generations G: prompts_per_step = completions per generation / G (every rank together); "
           "mini_batches = steps_per_generation / gradient_accumulation_steps"))

TRL_FIELDS = [TrlField(*f) for f in [
    ("output_dir", "output_dir", _to("output_dir")),
    ("seed", "seed", _to("seed")),
    ("learning_rate", "optim.lr", _to("optim.lr")),
    ("lr_scheduler_type", "optim.schedule",
     _choice("optim.schedule", {"constant": "constant", "constant_with_warmup": "constant", "linear": "linear",
                                "cosine": "cosine"}, "lr_scheduler_type"), "constant_with_warmup is constant"),
    ("warmup_steps", "optim.warmup_steps", _to("optim.warmup_steps")),
    ("weight_decay", "optim.weight_decay", _to("optim.weight_decay")),
    ("adam_beta1", "optim.betas[0]", lambda v, g: {"optim.betas": [v, g.get("adam_beta2", 0.999)]}),
    ("adam_beta2", "optim.betas[1]", lambda v, g: {"optim.betas": [g.get("adam_beta1", 0.9), v]}),
    ("max_grad_norm", "optim.grad_clip", _to("optim.grad_clip")),
    ("max_steps", "trainer.max_steps", _to("trainer.max_steps")),
    ("per_device_train_batch_size", *_BATCH),
    ("gradient_accumulation_steps", *_BATCH),
    ("steps_per_generation", *_BATCH),
    ("generation_batch_size", *_BATCH),
    ("num_generations", "rollout.num_generations", _to("rollout.num_generations")),
    ("max_completion_length", "rollout.max_new_tokens", _to("rollout.max_new_tokens")),
    ("temperature", "rollout.temperature", _to("rollout.temperature")),
    ("top_p", "rollout.top_p", _to("rollout.top_p")),
    ("beta", "loss.beta, model.ref_model", _beta, "a reference model is kept when beta > 0, as in TRL"),
    ("num_iterations", "trainer.ppo_epochs", _to("trainer.ppo_epochs")),
    ("epsilon", "loss.eps_low", _epsilon, "also loss.eps_high when epsilon_high is not given, as in TRL"),
    ("epsilon_high", "loss.eps_high", _epsilon_high),
    ("delta", "loss.dual_clip", _to("loss.dual_clip"),
     "TRL's two-sided clip is the dual clip: a negative-advantage token's ratio is capped at delta"),
    ("loss_type", "loss.type, loss.aggregation", _choice("", _LOSS_TYPES, "loss_type"),
     ("dapo, grpo, dr_grpo, bnpo: clip with token_mean, seq_mean_token_mean, constant, token_mean_micro; "
      "cispo, sapo: their own type with token_mean")),
    ("importance_sampling_level", "loss.type",
     _choice("", {"token": {}, "sequence": {"loss.type": "gspo"}}, "importance_sampling_level"),
     "sequence is loss.type=gspo"),
    ("sapo_temperature_pos", "loss.sapo_tau_pos", _to("loss.sapo_tau_pos")),
    ("sapo_temperature_neg", "loss.sapo_tau_neg", _to("loss.sapo_tau_neg")),
    ("entropy_coef", "loss.entropy_coef", _to("loss.entropy_coef")),
    ("scale_rewards", "advantage.estimator",
     _choice("advantage.estimator", {"group": "grpo", True: "grpo", "batch": "batch", "none": "dr_grpo",
                                     False: "dr_grpo"}, "scale_rewards"), "group: grpo; batch: batch; none: dr_grpo"),
    ("reward_weights", "reward.weights[1:]", lambda v, _: {},  # GRPOTrainer puts them after the verifier's
     "one per reward function; the built-in verifier's weight is GRPOTrainer's verifier_weight"),
    ("mask_truncated_completions", "loss.mask_truncated", _to("loss.mask_truncated")),
    ("vllm_importance_sampling_correction", "loss.is_cap",
     lambda v, g: {} if v else {"loss.is_cap": 0.0}, "false: loss.is_cap=0 (no correction)"),
    ("vllm_importance_sampling_mode", "loss.is_mode", _to("loss.is_mode"),
     "the same four modes; ours defaults to token_truncate, TRL's to sequence_mask (docs/config.md says why)"),
    ("vllm_importance_sampling_clip_max", "loss.is_cap",
     lambda v, g: {} if g.get("vllm_importance_sampling_correction") is False else {"loss.is_cap": v}),
    ("vllm_importance_sampling_clip_min", "loss.is_floor",
     lambda v, _: {"loss.is_floor": 0.0 if v is None else v}),
    ("logging_steps", "trainer.log_every", _to("trainer.log_every")),
    ("save_steps", "trainer.save_every", _to("trainer.save_every")),
    ("save_strategy", "trainer.save_every",
     _choice("", {"steps": {}, "no": {"trainer.save_every": 0}}, "save_strategy"),
     "no: only the final checkpoint"),
    ("save_total_limit", "trainer.keep_last_n", _to("trainer.keep_last_n")),
    ("report_to", "trainer.tensorboard, trainer.wandb", _report_to),
    ("bf16", "model.autocast_bf16", _to("model.autocast_bf16"), "fp32 master weights, bf16 compute, as in TRL"),
    ("gradient_checkpointing", "model.gradient_checkpointing", _to("model.gradient_checkpointing")),
    ("model_init_kwargs", "model.dtype, model.attn_implementation", _model_init),
    ("use_vllm", "rollout.engine", lambda v, _: {"rollout.engine": "vllm" if v else "hf"}),
    ("vllm_mode", "rollout.vllm_mode",
     _choice("rollout.vllm_mode", {"colocate": "colocate", "server": "server"}, "vllm_mode")),
    ("vllm_gpu_memory_utilization", "rollout.vllm_gpu_memory_utilization",
     _to("rollout.vllm_gpu_memory_utilization")),
    ("vllm_enable_sleep_mode", "rollout.vllm_sleep_level", lambda v, _: {"rollout.vllm_sleep_level": int(bool(v))}),
    ("vllm_max_model_length", "rollout.vllm_max_model_len", _to("rollout.vllm_max_model_len")),
    ("vllm_server_base_url", "rollout.vllm_server_url", _vllm_server),
    ("vllm_server_host", "rollout.vllm_server_url", _vllm_server),
    ("vllm_server_port", "rollout.vllm_server_url", _vllm_server),
    ("vllm_server_timeout", "rollout.vllm_server_timeout_s", _to("rollout.vllm_server_timeout_s")),
    ("peft_config", "model.lora", _peft, "a peft.LoraConfig: r, lora_alpha, lora_dropout, target_modules"),
]]
BY_NAME = {f.name: f for f in TRL_FIELDS}
# TRL fields we do not take, accepted only at the value that leaves TRL's behaviour as ours
NEUTRAL: dict[str, tuple] = {
    "top_k": (0, -1, None), "min_p": (None, 0.0), "repetition_penalty": (1.0,), "fp16": (False,),
    "shuffle_dataset": (True,), "remove_unused_columns": (False, None), "log_completions": (False,),
    "use_liger_kernel": (False,), "sync_ref_model": (False,), "vllm_tensor_parallel_size": (1,),
    "multi_objective_aggregation": ("sum_then_normalize",), "num_train_epochs": (None,),
}
OUR_SECTIONS = [f.name for f in dataclasses.fields(RunConfig) if f.name not in ("output_dir", "seed")]


class GRPOConfig:
    """TRL's GRPOConfig fields (TRL_FIELDS), our sections as mappings (`mentor=True` turns MENTOR
    on; `recovery={"trigger": {"max_groups_frac": 0.5}}`), our dotted keys through
    `**{"data.max_prompt_tokens": 256}`, and `config=` YAML file(s) applied first. Defaults are ours
    (docs/config.md), not TRL's. Setting one key both ways with two values is an error."""

    def __init__(self, output_dir: str = "runs/default", *, config: str | Path | list | None = None,
                 **fields: Any):
        self.output_dir = output_dir
        self.config = [config] if isinstance(config, (str, Path)) else list(config or [])
        self.trl: dict[str, Any] = {"output_dir": output_dir}
        self.ours: Values = {}
        for name, value in fields.items():
            if name in BY_NAME:
                self.trl[name] = value
            elif name in OUR_SECTIONS or "." in name:
                self._ours(name, value)
            elif name in NEUTRAL:
                if value not in NEUTRAL[name]:
                    raise ConfigError(f"GRPOConfig: TRL's field {name!r} is not supported (only {NEUTRAL[name][0]!r}, "
                                      f"which changes nothing); docs/python_api.md lists the fields that are")
            else:
                close = difflib.get_close_matches(name, [*BY_NAME, *OUR_SECTIONS], n=1)
                hint = f"; did you mean {close[0]!r}?" if close else ""
                raise ConfigError(f"GRPOConfig: {name!r} is not supported (a TRL field mentor_fast does not take, "
                                  f"or no field at all){hint}; docs/python_api.md lists the fields that are")

    def _ours(self, name: str, value: Any) -> None:
        if name == "mentor" and isinstance(value, bool):
            value = {"enable": value}
        if isinstance(value, dict):
            for k, v in value.items():
                self._ours(f"{name}.{k}", v)
        else:
            self.ours[name] = value

    def values(self) -> Values:
        """Our dotted keys: TRL's fields converted, then ours (a key set both ways must agree)."""
        out: Values = {}
        for name, value in self.trl.items():
            out.update(BY_NAME[name].convert(value, self.trl))
        for key, value in self.ours.items():
            if key in out and out[key] != value:
                raise ConfigError(f"GRPOConfig: {key} is {value!r}, but a TRL field sets it to {out[key]!r}")
            out[key] = value
        return out

    def run_config(self, extra: Values | None = None) -> RunConfig:
        nested: dict[str, Any] = {}
        for key, value in (self.values() | (extra or {})).items():
            nest(key, value, nested)
        return load_config(self.config, values=nested)

    def __repr__(self) -> str:
        given = ", ".join(f"{k}={v!r}" for k, v in {**self.trl, **self.ours}.items())
        return f"GRPOConfig({given})"
