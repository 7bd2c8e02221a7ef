"""Tables as data: parquet, JSON, JSONL, Arrow folders and rows in Python, in TRL's and verl's
layouts; the gold answer's column; bad rows; sampling that depends only on (seed, step)."""

from __future__ import annotations

import json
import sys

import pytest

from mentor_fast.config import ConfigError, DataConfig, load_config
from mentor_fast.data import DataError, PromptBuilder, build_source, load_table
from mentor_fast.data.chat import HINT_HEADER

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

VERL_ROWS = [
    {"data_source": "openai/gsm8k",
     "prompt": [{"role": "system", "content": "Answer in one line."},
                {"role": "user", "content": f"What is {a} + {b}?"}],
     "ability": "math", "reward_model": {"style": "rule", "ground_truth": str(a + b)},
     "extra_info": {"index": i}}
    for i, (a, b) in enumerate([(2, 3), (10, 4), (7, 7), (1, 8), (6, 5)])
]


def _write(tmp_path, rows, kind):
    """The rows as a file of `kind` (parquet, json array, JSON Lines named .json, arrow folder)."""
    if kind == "parquet":
        path = tmp_path / "d.parquet"
        pq.write_table(pa.Table.from_pylist(rows), path)
    elif kind == "json":
        path = tmp_path / "d.json"
        path.write_text(json.dumps(rows))
    elif kind == "json_lines":
        path = tmp_path / "d.json"
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    else:
        datasets = pytest.importorskip("datasets")
        path = tmp_path / "d_arrow"
        datasets.Dataset.from_list(rows).save_to_disk(str(path))
    return path


@pytest.mark.parametrize("kind", ["parquet", "json", "json_lines", "arrow"])
def test_verl_layout_reads_as_it_is_from_every_file_kind(tmp_path, kind):
    path = _write(tmp_path, VERL_ROWS, kind)
    problems, report = load_table(path, DataConfig(source="file"))
    assert report.loaded == 5
    assert [p.gold for p in problems] == ["5", "14", "14", "9", "11"]
    first = problems[0]
    assert first.question == "What is 2 + 3?"
    assert first.context == (("system", "Answer in one line."),)
    # every other column, the answer's parent included, under its own name
    assert first.columns["data_source"] == "openai/gsm8k"
    assert first.columns["reward_model"]["ground_truth"] == "5"
    assert first.columns["extra_info"] == {"index": 0}
    assert "prompt" not in first.columns


def test_conversational_prompt_keeps_its_system_message_and_hints_keep_the_prefix(tiny_model_path):
    from mentor_fast.models import load_tokenizer

    (problem,), _ = load_table_rows(VERL_ROWS[:1])
    builder = PromptBuilder(load_tokenizer(tiny_model_path), "OUR SYSTEM PROMPT", 512)
    chat = builder.chat(problem)
    assert chat == VERL_ROWS[0]["prompt"]  # the row's own system message, not ours
    hinted = builder.chat(problem, "add the units first")
    assert hinted[-1]["content"] == "What is 2 + 3?" + HINT_HEADER + "add the units first"
    plain_ids, hinted_ids = builder.encode(problem), builder.encode(problem, "add the units first")
    head = builder.head_length(problem)
    assert hinted_ids[:head] == plain_ids[:head] and len(hinted_ids) > len(plain_ids)
    text = builder.tokenizer.decode(plain_ids)
    assert "Answer in one line." in text and "OUR SYSTEM PROMPT" not in text
    # a string prompt gets our system prompt, as before
    (bare,), _ = load_table_rows([{"prompt": "What is 1 + 1?", "answer": "2"}])
    assert builder.chat(bare)[0] == {"role": "system", "content": "OUR SYSTEM PROMPT"}


def load_table_rows(rows, **cfg):
    from mentor_fast.data.table import problems_from_rows

    return problems_from_rows(rows, "train_dataset", DataConfig(source="dataset", **cfg))


def test_gold_column_default_order_and_a_named_column():
    row = {"prompt": "Q?", "solution": "We add. \\boxed{7}", "answer": "8", "reward_model": {"ground_truth": "9"}}
    (p,), _ = load_table_rows([row])
    assert p.gold == "7" and p.solution_steps  # solution first, read as math (a \boxed{})
    assert "answer" in p.columns and "solution" not in p.columns
    (p,), _ = load_table_rows([{k: v for k, v in row.items() if k != "solution"}])
    assert p.gold == "8"
    (p,), _ = load_table_rows([row], answer_key="reward_model.ground_truth")
    assert p.gold == "9"
    (p,), _ = load_table_rows([{"question": "Q?", "answer": "3 + 4 = 7\n#### 7", "level": 2}])
    assert (p.gold, p.solution_steps, p.columns) == ("7", ("3 + 4 = 7",), {"level": 2})


@pytest.mark.parametrize("row,reason", [
    ({"prompt": "Q?"}, "missing answer column (tried 'solution', 'answer', 'reward_model.ground_truth')"),
    ({"prompt": [{"role": "user", "content": "Q?"}, {"role": "assistant", "content": "A"}], "answer": "1"},
     "must end with a non-empty user message"),
    ({"prompt": [{"role": "narrator", "content": "Q?"}], "answer": "1"}, "a message needs a role"),
    ({"prompt": 3, "answer": "1"}, "must be a string or a list of chat messages"),
])
def test_bad_row_stops_naming_file_and_row_or_is_skipped_and_counted(tmp_path, row, reason):
    rows = [*VERL_ROWS[:2], row, VERL_ROWS[2]]
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(rows))
    with pytest.raises(DataError) as info:
        load_table(path, DataConfig(source="file"))
    assert f"{path}:row 2: " in str(info.value) and reason in str(info.value)
    problems, report = load_table(path, DataConfig(source="file", on_bad_row="skip"))
    assert [p.id for p in problems] == ["bad-0", "bad-1", "bad-3"]
    assert sum(report.skipped.values()) == 1 and reason in report.examples[0]


def test_sampling_depends_only_on_seed_and_step_and_a_step_never_reads_the_file(tmp_path):
    rows = [{"prompt": f"What is {i} + 1?", "answer": str(i + 1)} for i in range(37)]
    path = _write(tmp_path, rows, "parquet")
    cfg = DataConfig(source="file", path=str(path))
    a = build_source(cfg, seed=3)
    path.unlink()  # a step works from memory
    batches = [[p.id for p in a.batch(step, 8)] for step in range(12)]
    b = build_source(DataConfig(source="dataset"), seed=3, rows=rows)  # the same rows, handed over in Python
    assert [[p.question for p in b.batch(s, 8)] for s in (11, 4)] == [[p.question for p in a.batch(s, 8)]
                                                                       for s in (11, 4)]
    assert batches[4] != batches[5]
    epoch = [i for step in range(5) for i in batches[step]][:37]  # the first 37 draws: each row once
    assert sorted(epoch) == sorted(f"d-{i}" for i in range(37))
    other = build_source(DataConfig(source="dataset"), seed=4, rows=rows)
    assert [p.question for p in other.batch(0, 8)] != [p.question for p in b.batch(0, 8)]


def test_file_format_from_the_name_or_declared(tmp_path):
    path = tmp_path / "rows.data"
    pq.write_table(pa.Table.from_pylist([{"prompt": "Q?", "answer": "1"}]), path)
    with pytest.raises(DataError, match="set data.file_format"):
        load_table(path, DataConfig(source="file"))
    (p,), _ = load_table(path, DataConfig(source="file", file_format="parquet"))
    assert p.gold == "1"
    with pytest.raises(ConfigError, match="data.path is required for data.source=file"):
        load_config([], ["data.source=file"])
    with pytest.raises(DataError, match="DatasetDict folder; point data.path at one split"):
        datasets = pytest.importorskip("datasets")
        datasets.DatasetDict({"train": datasets.Dataset.from_list(VERL_ROWS)}).save_to_disk(str(tmp_path / "dd"))
        load_table(tmp_path / "dd", DataConfig(source="file"))


def test_missing_pyarrow_says_what_to_install(tmp_path, monkeypatch):
    path = _write(tmp_path, VERL_ROWS, "parquet")
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # fault injection: pyarrow not installed
    with pytest.raises(DataError, match=r"pip install 'mentor-fast\[data\]'"):
        load_table(path, DataConfig(source="file"))


def _verl_parquet(path, questions):
    """verl's layout (what its gsm8k preprocessing writes) for (question, answer, pair) triples."""
    rows = [{"data_source": "openai/gsm8k", "ability": "math",
             "prompt": [{"role": "user", "content": q}],
             "reward_model": {"style": "rule", "ground_truth": a}, "extra_info": {"index": i, "pair": pair}}
            for i, (q, a, pair) in enumerate(questions)]
    pq.write_table(pa.Table.from_pylist(rows), path)


def test_real_gsm8k_as_verl_parquet_trains_one_step(tmp_path, shared_data):
    from mentor_fast.metrics import read_metrics
    from mentor_fast.trainer import Trainer

    lines = (shared_data / "gsm8k" / "test.jsonl").read_text().splitlines()[:16]
    rows = [json.loads(line) for line in lines]
    data = tmp_path / "gsm8k.parquet"
    _verl_parquet(data, [(r["question"], r["answer"].rsplit("####", 1)[1].strip(), [0]) for r in rows])
    cfg = load_config(["configs/tiny_test.yaml"], [
        f"output_dir={tmp_path / 'run'}", "trainer.max_steps=1", "trainer.tensorboard=false",
        "data.source=file", f"data.path={data}", "rollout.prompts_per_step=2"])
    trainer = Trainer(cfg)
    assert [p.gold for p in trainer.source.problems[:3]] == ["18", "3", "70000"]
    trainer.fit()
    assert read_metrics(tmp_path / "run" / "metrics.jsonl")[0]["groups/count"] == 2
