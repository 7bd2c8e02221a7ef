"""Run by tests/test_distributed.py, on 1 rank (plain python) or 2 (torchrun): one update of a batch
whose rank-0 groups carry a distillation term and a transfer re-roll (a sequence trained in another
context than it was sampled in), so rank 1 has none of either and must join those passes empty.
Prints the update's metrics and saves the updated weights (rank 0) to argv[1]."""

import dataclasses
import json
import sys

import torch
from mentor_fast.kernels import GRPOOptions

from mentor_fast.algo.batch import build_train_batch
from mentor_fast.config import AdvantageConfig, OptimConfig, RolloutConfig, TrainerConfig
from mentor_fast.data import PromptBuilder
from mentor_fast.data.ladder import make_problem
from mentor_fast.dist import Dist
from mentor_fast.models import load_policy, load_tokenizer, resolve_model_path
from mentor_fast.rollout.base import SamplingParams
from mentor_fast.rollout.hf import HFEngine
from mentor_fast.sharding import FullWeights, shard_policy
from mentor_fast.types import ExtraTerm, Group, Rollout
from mentor_fast.update import PolicyUpdater, build_optimizer

torch.manual_seed(0)
dist = Dist.from_env(torch.device("cpu"), timeout_s=120)
path = resolve_model_path("tiny-llama")
tok = load_tokenizer(path)
model = load_policy(path)
engine = HFEngine(load_policy(path), tok, RolloutConfig())
builder = PromptBuilder(tok, "", 256)
import random

problems = [make_problem(1 + i % 2, random.Random(i), f"p{i}") for i in range(4)]
start, stop = dist.shard(len(problems))
mine = list(range(start, stop))
prompts = [builder.encode(problems[i]) for i in mine]
hinted = [builder.encode(problems[i], "Add the two numbers.") for i in mine]
samples = engine.generate(prompts, SamplingParams(n=4, max_new_tokens=8, seed=3, keys=tuple(mine)))
groups = []
for i, ids, hint_ids, group in zip(mine, prompts, hinted, samples):
    rollouts = []
    for j, s in enumerate(group):
        r = Rollout(problems[i], i, ids, s.token_ids, s.logprobs, "", s.finish_reason, 0, reward=-len(s.token_ids) / 10 + j)
        if i == 0 and j == 0:  # a re-roll trained in its hinted context, distilled into the bare prompt
            r = dataclasses.replace(r, prompt_ids=hint_ids, origin="mentor",
                                    extra_terms=(ExtraTerm("distill", 0.5, tuple(ids)),))
        if i == 1 and j == 1:  # a transfer re-roll: sampled under the hint, trained on the bare prompt
            r = dataclasses.replace(r, behaviour_prompt_ids=hint_ids, origin="mentor")
        rollouts.append(r)
    groups.append(Group(i, problems[i], ids, rollouts))
batch = build_train_batch(groups, AdvantageConfig())
policy = shard_policy(model, dist)
optim_cfg = OptimConfig(lr=1e-4)
optimizer, scheduler = build_optimizer(policy, optim_cfg, 10)
updater = PolicyUpdater(policy, optimizer, scheduler, GRPOOptions(max_completion_len=8),
                        TrainerConfig(micro_batch_tokens=64), optim_cfg, pad_id=tok.pad_token_id, dist=dist)
out = updater.update(batch, 0)
weights = {k: v.clone() for k, v in (FullWeights(policy).state_dict() if dist.enabled else model.state_dict()).items()}
if dist.is_main:
    print("METRICS " + json.dumps({k: float(v) for k, v in out.items() if not k.startswith("timing")}))
    torch.save(weights, sys.argv[1])
dist.close()
