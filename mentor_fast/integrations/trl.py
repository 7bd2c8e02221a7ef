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

A run (a TrainerState) starts by reading every row once: a row with no gold answer stops it before
its first step. The mentor's state (the scheduler's memory and collapse detector, plain data) is an
entry of TRL's TrainerState, so it is in every checkpoint's trainer_state.json and a resumed run
restores it. mentor.jsonl in output_dir: a resumed run continues it, a fresh one starts a new file
(`start_log`).
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from mentor_fast.config import MentorConfig, RecoveryConfig
from mentor_fast.data.chat import HINT_HEADER
from mentor_fast.data.jsonl import BadRow, DataError, problem_from_row
from mentor_fast.integrations.trl_config import mentor_configs
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
# The mentor's state in TRL's checkpoints: an entry of TrainerState.stateful_callbacks, which TRL
# writes into each checkpoint's trainer_state.json and reads back on resume (plain JSON data).
STATE_KEY = "mentor_fast.mentor_rollout_func"
logger = logging.getLogger(__name__)


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


def read_problems(dataset: Any, answer_key: str) -> list[Problem]:
    """Every train_dataset row as a Problem, read once when the run starts: a row with no prompt or
    gold answer stops the run before its first step, naming the row, as the CLI's loader does (not
    when TRL's sampler first draws it, possibly hours in)."""
    problems, bad, n = [], [], 0
    for n, row in enumerate(dataset, start=1):
        index = n - 1
        try:
            problems.append(problem_from_row(dict(row), f"row-{index}", f"train_dataset:row {index}", "auto",
                                             "prompt", answer_key))
        except BadRow as e:
            bad.append(f"row {index}: {e}")
    if bad:
        more = f"; and {len(bad) - 3} more" if len(bad) > 3 else ""
        raise DataError(f"train_dataset: {len(bad)} of {n} rows are unusable (mentor_rollout_func reads each row's "
                        f"prompt and gold answer, see answer_key): {'; '.join(bad[:3])}{more}")
    return problems


def _global_step(line: str) -> float:
    try:
        return json.loads(line).get("global_step", -1)
    except json.JSONDecodeError:  # a line cut short when the earlier run was killed
        return float("inf")


def start_log(path: Path, resumed_at: int) -> None:
    """mentor.jsonl for a run that starts afresh (resumed_at 0) or resumes at TRL's global step
    `resumed_at`, in an output_dir that may hold an earlier run's file. A resumed run keeps the rows
    of the steps its checkpoint holds and drops the later ones (it trains those steps again), as TRL
    overwrites their completion tables; a fresh run moves the earlier file aside (mentor.1.jsonl,
    mentor.2.jsonl, ...), says so, and writes a new one, as TensorBoard starts a new run folder."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists():
        return
    if resumed_at:
        lines = path.read_text().splitlines(keepends=True)
        kept = [line for line in lines if _global_step(line) < resumed_at]
        if len(kept) < len(lines):
            tmp = path.with_suffix(".jsonl.tmp")
            tmp.write_text("".join(kept))
            tmp.replace(path)
            logger.warning("mentor_rollout_func: resumed at step %d; %s keeps the %d rows of earlier steps and drops "
                           "%d of the steps trained again", resumed_at, path, len(kept), len(lines) - len(kept))
        return
    k = 1
    while path.with_name(f"mentor.{k}.jsonl").exists():
        k += 1
    old = path.with_name(f"mentor.{k}.jsonl")
    path.rename(old)
    logger.warning("mentor_rollout_func: %s held an earlier run's rows; they are now in %s, and this run writes a "
                   "new %s", path, old.name, path.name)


class TrlPrompts:
    """The PromptBuilder contract (`encode(problem, hint) -> ids`, recovery/rerolls.py) over TRL's own
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
    the prompt builder and the dataset's index are made when a run starts (the first call with a
    trainer or a TrainerState it has not seen: `trainer.train()` makes a new state), from the trainer.

    A mentor step is one training call (one TRL generation batch), as a step is one generation in
    our trainer: with steps_per_generation < gradient_accumulation_steps TRL calls it several times
    per optimizer step, and each call is a step of its own (its own group ids, one observation of
    the collapse detector). mentor.jsonl rows carry it as `step`, and TRL's `global_step` beside it.
    """

    def __init__(self, cfg: MentorConfig, budget: RecoveryConfig, success_reward: float, answer_key: str,
                 backend: Any = None) -> None:
        self.cfg, self.budget, self.success_reward, self.answer_key, self.backend = (
            cfg, budget, success_reward, answer_key, backend)
        self.trainer: Any = None
        self.run: Any = None  # the TrainerState of the run in progress
        self.calls = 0  # training calls so far in this run (a resumed run: since the first run's start)
        self.has_logprobs = False  # TRL's HF generation gives none, its vLLM does

    def __call__(self, prompts: list[Prompt], trainer: Any) -> dict[str, Any]:
        if trainer is not self.trainer or trainer.state is not self.run:
            self._start(trainer)
        training = trainer.model.training
        unique = _runs_of(prompts, trainer.num_generations if training else trainer.num_generations_eval)
        step = self.calls if training else trainer.state.global_step
        params = SamplingParams(n=len(prompts) // len(unique), seed=trainer.args.seed + step)
        ids = self.prompts.tokenize(unique)
        samples = self.generate(ids, params)
        if not training:  # evaluation: TRL's generation as it is
            return self._output([(p, s.token_ids, s.logprobs, None) for p, ss in zip(ids, samples) for s in ss])
        groups = [self._group(step * len(unique) + i, prompt, p, ss)
                  for i, (prompt, p, ss) in enumerate(zip(unique, ids, samples))]
        self.score([r for g in groups for r in g.rollouts])
        out = self.mentor.intervene(groups, step, self.generate, self.score, dataclasses.replace(
            params, n=self.budget.reroll.count), policy_version=trainer.state.global_step)
        self.calls += 1
        trainer.state.stateful_callbacks[STATE_KEY] = self.state_dict()  # saved with TRL's next checkpoint
        for name, value in out.metrics.items():
            trainer._log_metric(name, value)
        self._dump([{**row, "global_step": trainer.state.global_step} for row in out.dump_rows])
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
        self.trainer, self.run, self.prompts = trainer, trainer.state, TrlPrompts(trainer)
        self.dataset = DatasetRows(trainer.train_dataset)
        self.problems = read_problems(trainer.train_dataset, self.answer_key)
        self.rows: dict[str, dict[str, Any]] = {}  # problem id -> its dataset row
        backend = self.backend or build_backend(self.cfg.agents, seed=trainer.args.seed)
        self.mentor = Mentor(self.cfg, self.budget, backend, self.prompts, seed=trainer.args.seed)
        self.calls = 0
        resumed_at = trainer.state.global_step
        if resumed_at:
            saved = trainer.state.stateful_callbacks.get(STATE_KEY)
            if saved is not None:
                self.load_state_dict(saved)
            else:  # ids past any call the checkpointed run can have made (at most one per micro-batch)
                self.calls = resumed_at * trainer.args.gradient_accumulation_steps
                logger.warning("mentor_rollout_func: the checkpoint at step %d holds no mentor state (it was not "
                               "saved with mentor_rollout_func); the mentor's scheduler starts fresh", resumed_at)
        if self.cfg.dump and trainer.accelerator.is_main_process:
            start_log(Path(trainer.args.output_dir) / "mentor.jsonl", resumed_at)

    def state_dict(self) -> dict[str, Any]:
        """Plain data: the training calls made and the scheduler's state (recovery/scheduler.py)."""
        return {"calls": self.calls, "mentor": self.mentor.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.calls = state["calls"]
        self.mentor.load_state_dict(state["mentor"])

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
        problem = self.problems[index]
        self.prompts.prompts[problem.id], self.rows[problem.id] = prompt, row
        decode = self.mentor.decode
        rollouts = [Rollout.from_sample(problem, group_id, prompt_ids, s, decode(s.token_ids)) for s in samples]
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
            with path.open("a") as f:
                for row in rows:
                    f.write(json.dumps(row, default=str) + "\n")


def mentor_rollout_func(mentor: MentorConfig | dict[str, Any] | None = None, *,
                        recovery: RecoveryConfig | dict[str, Any] | None = None, success_reward: float = 1.0,
                        answer_key: str = "", backend: Any = None) -> MentorRollout:
    """A `rollout_func` for `trl.GRPOTrainer` (TRL 1.16) with MENTOR on (the module doc).

    mentor, recovery: the mentor's settings and its budget (`mentor_configs`), e.g. `recovery={"reroll":
    {"count": 2}}` (or, as earlier, `mentor={"reroll": {"count": 2}}`). The re-rolls run within TRL's
    generation call (recovery.reroll.schedule in_step; another is refused).
    success_reward: a sample is solved when its weighted reward reaches this (TRL's accuracy_reward
    gives 1.0 to a right answer); a group with no solved sample is all-fail.
    answer_key: the column holding the gold answer that the mentor and its leak guard read ("": the
    first of solution, answer, reward_model.ground_truth).
    backend: a ready mentor backend in place of mentor.agents.backend's.
    """
    check_trl()
    return MentorRollout(*mentor_configs(mentor, recovery), success_reward, answer_key, backend)
