"""MENTOR inside TRL's own GRPOTrainer:

    from mentor_fast.integrations.trl import mentor_rollout_func
    trainer = trl.GRPOTrainer(model, reward_funcs, args=args, train_dataset=ds,
                              rollout_func=mentor_rollout_func())

TRL 1.16's experimental `rollout_func(prompts, trainer) -> {"prompt_ids", "completion_ids",
"logprobs", ...}` stands in for its generation (trl/trainer/grpo_trainer.py, `_generate`). This one,
at each generation step:
1. generates the G samples of each prompt with TRL's own tokenization and generation
   (`_tokenize_prompts`, `_generate_single_turn`: TRL's vLLM when the trainer uses it, else the
   trainer's model). The prompts arrive as TRL's sampler lays them out, each G times in a row.
2. scores them with the trainer's reward functions (`_calculate_rewards`). A sample is solved when
   its weighted reward (what TRL logs as `reward`) reaches `success_reward`.
3. hands the groups to the mentor (mentor/pipeline.py): the scheduler picks all-fail groups, the
   backend writes guarded hints, and the policy re-tries under prompt + hint, escalating.
4. returns each group's G rows with up to mentor.loss.max_replace failures replaced by hinted
   successes (mentor.loss.mode=replace). A hinted row carries its own prompt_ids (prompt + hint);
   TRL recomputes its log-probs and trains it in that context.

TRL scores the returned rows again, with the dataset's prompt as `prompts` (the hint is in the
prompt ids only) and each row's completion, so a hinted success scores as it did here and a rescued
group has mixed rewards, hence a non-zero group advantage. Each row's hint (None: unhinted) reaches
the reward functions as `mentor_hint` (TRL forwards extra fields) and TRL's completions table; the
mentor's metrics reach TRL's log through the path of its reward functions' `log_metric`.

TRL hands rollout_func the prompts only, so each prompt's row (its other columns, the gold answer
among them) is found in `trainer.train_dataset` by the prompt. Text prompts, one process, no tools.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from mentor_fast.config import MentorConfig, load_config
from mentor_fast.data.chat import HINT_HEADER
from mentor_fast.data.jsonl import BadRow, read_row
from mentor_fast.mentor import Mentor, build_backend
from mentor_fast.rollout.base import SamplingParams
from mentor_fast.types import Group, Problem, Rollout, Sample

TESTED_TRL = ">=1.16,<1.17"  # pyproject's `trl` extra
INSTALL_TRL = "pip install 'mentor-fast[trl]'"
# What this module calls on TRL's GRPOTrainer, with TRL 1.16's parameter names.
TRL_CONTRACT: dict[str, tuple[str, ...]] = {
    "__init__": ("rollout_func",),
    "_tokenize_prompts": ("prompts",),
    "_generate_single_turn": ("prompt_ids", "images", "multimodal_fields", "num_generations"),
    "_calculate_rewards": ("inputs", "prompts", "completions", "completion_ids_list"),
    "_log_metric": ("name", "value"),
    "_log_completion_extra": ("column", "values"),
}
Prompt = str | list[dict[str, Any]]  # TRL's standard and conversational prompt forms


def check_trl() -> None:
    """Raise, saying what to install, unless TRL is installed at a tested version whose
    GRPOTrainer has what this module calls."""
    try:
        import trl
        from trl import GRPOTrainer
    except ImportError as e:
        raise ImportError(f"mentor_rollout_func needs TRL: {INSTALL_TRL} ({e})") from None
    from packaging.specifiers import SpecifierSet

    if not SpecifierSet(TESTED_TRL).contains(trl.__version__, prereleases=True):
        raise RuntimeError(
            f"mentor_rollout_func is tested against trl{TESTED_TRL}, and trl {trl.__version__} is installed: "
            "its experimental rollout_func contract (what the function gets and returns, how TRL scores and "
            f"trains the returned rows) may differ. Install a tested version: {INSTALL_TRL}")

    def has(name: str, params: tuple[str, ...]) -> bool:
        fn = getattr(GRPOTrainer, name, None)
        return callable(fn) and set(params) <= set(inspect.signature(fn).parameters)

    broken = [f"{name}({', '.join(params)})" for name, params in TRL_CONTRACT.items() if not has(name, params)]
    if broken:
        raise RuntimeError(f"trl {trl.__version__}: GRPOTrainer lacks {', '.join(broken)}, which "
                           f"mentor_rollout_func calls. Install a tested version: {INSTALL_TRL}")


def with_hint(prompt: Prompt, hint: str) -> Prompt:
    """The prompt with the hint after the text of its last (user) turn, where data/chat.py puts it."""
    if isinstance(prompt, str):
        return prompt + HINT_HEADER + hint
    *head, last = prompt
    return [*head, {**last, "content": last["content"] + HINT_HEADER + hint}]


def _key(prompt: Prompt) -> str:
    return json.dumps(prompt, sort_keys=True, default=str)


class DatasetRows:
    """A map-style dataset's rows by prompt: TRL hands rollout_func the prompts only, and the reward
    functions and the mentor need the rest of each row."""

    def __init__(self, dataset: Any) -> None:
        if not (hasattr(dataset, "__getitem__") and hasattr(dataset, "__len__")):
            raise TypeError(
                "mentor_rollout_func needs a map-style train_dataset (a datasets.Dataset): TRL hands "
                f"rollout_func the prompts only, and each prompt's row is found by it; got {type(dataset).__name__}")
        prompts = dataset["prompt"] if hasattr(dataset, "column_names") else [row["prompt"] for row in dataset]
        self.dataset = dataset
        self.index: dict[str, list[int]] = {}
        for i, prompt in enumerate(prompts):
            self.index.setdefault(_key(prompt), []).append(i)

    def find(self, prompt: Prompt) -> tuple[int, dict[str, Any]]:
        """(index, row) of the prompt's row; an error when no row, or rows that differ, hold it."""
        found = self.index.get(_key(prompt))
        if not found:
            raise KeyError(f"mentor_rollout_func: a prompt not in train_dataset: {str(prompt)[:120]}")
        rows = [dict(self.dataset[i]) for i in found]
        if any(row != rows[0] for row in rows[1:]):
            raise ValueError(f"train_dataset rows {found} share the prompt {str(prompt)[:80]} but not their "
                             "other columns: which row's answer applies is ambiguous")
        return found[0], rows[0]


class TrlPrompts:
    """The PromptBuilder contract (`encode(problem, hint) -> ids`, mentor/rerolls.py) over TRL's own
    tokenization (`_tokenize_prompts`: the trainer's chat template and its kwargs)."""

    def __init__(self, trainer: Any) -> None:
        self.trainer, self.tokenizer = trainer, trainer._tokenizer
        self.prompts: dict[str, Prompt] = {}  # problem id -> its TRL prompt

    def encode(self, problem: Problem, hint: str | None = None) -> list[int]:
        prompt = self.prompts[problem.id]
        return self.tokenize([prompt if hint is None else with_hint(prompt, hint)])[0]

    def tokenize(self, prompts: list[Prompt]) -> list[list[int]]:
        ids, images, _ = self.trainer._tokenize_prompts(prompts)
        if images is not None:
            raise NotImplementedError("mentor_rollout_func takes text prompts; these hold images")
        return [list(x) for x in ids]


@contextmanager
def _own_scoring(trainer: Any) -> Iterator[None]:
    """What reward functions log through `log_extra` / `log_metric` while the mentor scores is not
    TRL's batch (TRL logs one value per returned row): it is dropped."""
    pending = (trainer._pending_extra_logs, trainer._pending_metrics)
    saved = [{k: list(v) for k, v in d.items()} for d in pending]
    try:
        yield
    finally:
        for d, before in zip(pending, saved):
            d.clear()
            d.update(before)


def _runs_of(prompts: list[Prompt], g: int) -> list[Prompt]:
    """One prompt per group: TRL's sampler repeats each G times in a row (RepeatSampler)."""
    if len(prompts) % g or any(prompts[i] != prompts[i - i % g] for i in range(len(prompts))):
        raise ValueError(f"mentor_rollout_func: the {len(prompts)} prompts are not runs of G={g} copies "
                         "(whole groups on one process)")
    return prompts[::g]


class MentorRollout:
    """TRL's rollout_func with MENTOR (the module doc); `mentor_rollout_func` builds it. The mentor,
    the prompt builder and the dataset's index are made at the first call, from the trainer."""

    def __init__(self, cfg: MentorConfig, success_reward: float, answer_key: str, backend: Any = None) -> None:
        self.cfg, self.success_reward, self.answer_key, self.backend = cfg, success_reward, answer_key, backend
        self.trainer: Any = None
        self.has_logprobs = False  # TRL's HF generation gives none, its vLLM does

    def __call__(self, prompts: list[Prompt], trainer: Any) -> dict[str, Any]:
        if trainer is not self.trainer:
            self._start(trainer)
        training = trainer.model.training
        unique = _runs_of(prompts, trainer.num_generations if training else trainer.num_generations_eval)
        step = trainer.state.global_step
        params = SamplingParams(n=len(prompts) // len(unique), seed=trainer.args.seed + step)
        ids = self.prompts.tokenize(unique)
        samples = self.generate(ids, params)
        if not training:  # evaluation: TRL's generation as it is
            return self._output([(p, s.token_ids, s.logprobs, None) for p, ss in zip(ids, samples) for s in ss])
        groups = [self._group(step * len(unique) + i, prompt, p, ss)
                  for i, (prompt, p, ss) in enumerate(zip(unique, ids, samples))]
        self.score([r for g in groups for r in g.rollouts])
        out = self.mentor.intervene(groups, step, self.generate, self.score,
                                    dataclasses.replace(params, n=self.cfg.reroll.count), policy_version=step)
        for name, value in out.metrics.items():
            trainer._log_metric(name, value)
        self._dump(out.dump_rows)
        return self._output([(r.prompt_ids, r.completion_ids, r.sampler_logprobs, r.hint.text if r.hint else None)
                             for g in out.groups for r in g.rollouts])

    def _start(self, trainer: Any) -> None:
        checks = [
            (trainer.accelerator.num_processes == 1,
             "runs on one process: a group's rows and its re-rolls must stay on the process that holds them"),
            (not trainer.tools and trainer.environment_factories is None,
             "takes no tools or environments: the re-rolls are single-turn"),
            (not trainer._is_vlm, "takes text models"),
        ]
        for ok, what in checks:
            if not ok:
                raise NotImplementedError(f"mentor_rollout_func {what}")
        self.trainer, self.prompts = trainer, TrlPrompts(trainer)
        self.dataset = DatasetRows(trainer.train_dataset)
        self.rows: dict[str, dict[str, Any]] = {}  # problem id -> its dataset row
        backend = self.backend or build_backend(self.cfg.agents, seed=trainer.args.seed)
        self.mentor = Mentor(self.cfg, backend, self.prompts, seed=trainer.args.seed)

    def generate(self, prompt_ids: list[list[int]], params: SamplingParams) -> list[list[Sample]]:
        """params.n samples of each prompt by TRL's generation, in its sampler's layout (each prompt n
        times in a row); the other sampling settings are the trainer's."""
        t, n = self.trainer, params.n
        completion_ids, logprobs = t._generate_single_turn([p for p in prompt_ids for _ in range(n)], None, {}, n)
        self.has_logprobs = logprobs is not None
        stops = {*t.eos_token_ids, t._tokenizer.pad_token_id}
        samples = [Sample(list(c), list(lp) if lp is not None else [], "stop" if c and c[-1] in stops else "length",
                          t.state.global_step)
                   for c, lp in zip(completion_ids, logprobs or [None] * len(completion_ids))]
        return [samples[i * n:(i + 1) * n] for i in range(len(prompt_ids))]

    def _group(self, group_id: int, prompt: Prompt, prompt_ids: list[int], samples: list[Sample]) -> Group:
        index, row = self.dataset.find(prompt)
        try:
            question, context, gold, steps, columns = read_row(row, "auto", "prompt", self.answer_key)
        except BadRow as e:
            raise ValueError(f"train_dataset row {index}: {e}") from None
        problem = Problem(f"row-{index}", question, gold, steps, source=f"train_dataset:row {index}",
                          columns=columns, context=context)
        self.prompts.prompts[problem.id], self.rows[problem.id] = prompt, row
        decode = self.mentor.decode
        rollouts = [Rollout(problem, group_id, list(prompt_ids), s.token_ids, s.logprobs, decode(s.token_ids),
                            s.finish_reason, s.policy_version) for s in samples]
        return Group(group_id, problem, list(prompt_ids), rollouts)

    def score(self, rollouts: list[Rollout]) -> None:
        """Each rollout's reward and solved flag by the trainer's reward functions, as TRL will score
        its row: the dataset row's columns, the row's hint as `mentor_hint`, the dataset's prompt."""
        if not rollouts:
            return
        t = self.trainer
        inputs = [{**self.rows[r.problem.id], "mentor_hint": r.hint.text if r.hint else None} for r in rollouts]
        prompts = [self.prompts.prompts[r.problem.id] for r in rollouts]
        with _own_scoring(t):
            per_func = t._calculate_rewards(inputs, prompts, self._completions(prompts, rollouts),
                                            [r.completion_ids for r in rollouts])  # [rows, reward functions]
        totals = (per_func * t.reward_weights.to(per_func.device).unsqueeze(0)).nansum(dim=1).tolist()
        for r, total in zip(rollouts, totals):
            r.reward, r.correct = total, total >= self.success_reward
            r.verifier_note = "" if r.correct else f"reward {total:g} < {self.success_reward:g}"

    def _completions(self, prompts: list[Prompt], rollouts: list[Rollout]) -> list[Any]:
        """The completions as TRL's `_generate` hands them to the reward functions."""
        import transformers
        from packaging.version import Version
        from trl.chat_template_utils import parse_response
        from trl.data_utils import is_conversational

        t, tok = self.trainer, self.trainer._tokenizer
        ids = [r.completion_ids for r in rollouts]
        if not is_conversational({"prompt": prompts[0]}):
            return t.processing_class.batch_decode(ids, skip_special_tokens=True)
        if Version(transformers.__version__) >= Version("5.0.0") and (
                getattr(tok, "response_template", None) is not None or getattr(tok, "response_schema", None) is not None):
            return [[parse_response(tok, c, prefix=r.prompt_ids, tools=t.tools)] for c, r in zip(ids, rollouts)]
        texts = t.processing_class.batch_decode(ids, skip_special_tokens=True)
        return [[{"role": "assistant", "content": text}] for text in texts]

    def _output(self, rows: list[tuple[list[int], list[int], list[float], str | None]]) -> dict[str, Any]:
        """TRL's rollout_func output from (prompt ids, completion ids, sampler log-probs, hint) rows:
        each row in its own context, log-probs None when TRL's generation gives none."""
        hints = [h for *_, h in rows]
        self.trainer._log_completion_extra("mentor_hint", hints)
        return {"prompt_ids": [p for p, *_ in rows], "completion_ids": [c for _, c, *_ in rows],
                "logprobs": [lp for _, _, lp, _ in rows] if self.has_logprobs else None, "mentor_hint": hints}

    def _dump(self, rows: list[dict[str, Any]]) -> None:
        if rows and self.cfg.dump and self.trainer.accelerator.is_main_process:
            path = Path(self.trainer.args.output_dir) / "mentor.jsonl"
            path.parent.mkdir(parents=True, exist_ok=True)
            with path.open("a") as f:
                for row in rows:
                    f.write(json.dumps(row, default=str) + "\n")


def mentor_config(mentor: MentorConfig | dict[str, Any] | None = None) -> MentorConfig:
    """The `mentor:` section of our run config (a MentorConfig, or a mapping of overrides as a YAML
    file holds them; `enable` implied), refused where TRL's loss or trainer cannot carry it."""
    if isinstance(mentor, MentorConfig):
        cfg = dataclasses.replace(mentor, enable=True, task="math" if mentor.task == "auto" else mentor.task)
    else:
        cfg = load_config(values={"mentor": {**(mentor or {}), "enable": True}}).mentor
    checks = [
        (cfg.loss.mode == "replace",
         (f"mentor.loss.mode={cfg.loss.mode} weighs tokens in the loss, which TRL's loss does not read: "
          "use replace (the default) inside TRL, or mentor_fast.GRPOTrainer")),
        (cfg.loss.distill_coef == 0,
         ("mentor.loss.distill_coef adds a loss term, which TRL's loss does not compute: leave it at 0 "
          "inside TRL, or use mentor_fast.GRPOTrainer")),
        (cfg.task == "math",
         f"mentor.task={cfg.task}: inside TRL the mentor writes math hints only (code hints read our sandbox)"),
        (cfg.agents.backend != "self",
         ("mentor.agents.backend=self writes hints through our rollout engine: inside TRL use "
          "worked_solutions, local or openai")),
    ]
    for ok, message in checks:
        if not ok:
            raise ValueError(message)
    return cfg


def mentor_rollout_func(mentor: MentorConfig | dict[str, Any] | None = None, *, success_reward: float = 1.0,
                        answer_key: str = "", backend: Any = None) -> MentorRollout:
    """A `rollout_func` for `trl.GRPOTrainer` (TRL 1.16) with MENTOR on (the module doc).

    mentor: the mentor's settings (`mentor_config`), e.g. `{"reroll": {"count": 2}}`. The re-rolls
    run within TRL's generation call, so mentor.reroll.schedule is not read.
    success_reward: a sample is solved when its weighted reward reaches this (TRL's accuracy_reward
    gives 1.0 to a right answer); a group with no solved sample is all-fail.
    answer_key: the column holding the gold answer that the mentor and its leak guard read ("": the
    first of solution, answer, reward_model.ground_truth).
    backend: a ready mentor backend in place of mentor.agents.backend's.
    """
    check_trl()
    return MentorRollout(mentor_config(mentor), success_reward, answer_key, backend)
