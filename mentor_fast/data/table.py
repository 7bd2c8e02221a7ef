"""Datasets as tables: a parquet, JSON or JSONL file, an Arrow folder written by `save_to_disk`, or
rows handed over in Python (a `datasets.Dataset` or `IterableDataset`, a list of dicts).

Rows read as TRL's GRPOTrainer reads them (jsonl.read_row): `prompt` a string or chat messages,
every other column passed to the reward functions under its own name, the gold answer from a
column that can be named (by default `solution`, `answer`, then `reward_model.ground_truth`, so
verl's parquet layout reads as it is). The whole table becomes a list of Problems once, when the run
starts; a step indexes that list through its `Sampler` (data/sampler.py), so a step never reads
the file again and a resumed run draws the same problems.

Problem.id = "<name>-<row>" and Problem.source = "<path>:row <row>", with `row` the 0-based index a
`datasets.Dataset` gives it (JSONL files keep their 1-based line numbers). pyarrow is imported only
to read parquet and Arrow files.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, Literal

from mentor_fast.config import DataConfig
from mentor_fast.data.jsonl import (
    BadRow,
    DataError,
    LoadReport,
    collect_rows,
    load_jsonl,
    problem_from_row,
)
from mentor_fast.data.sampler import Sampler
from mentor_fast.types import Problem

FileFormat = Literal["parquet", "json", "jsonl", "arrow"]
_SUFFIXES: dict[str, FileFormat] = {".parquet": "parquet", ".pq": "parquet", ".json": "json", ".jsonl": "jsonl",
                                    ".arrow": "arrow"}
INSTALL_DATA = "pip install 'mentor-fast[data]' (datasets and pyarrow)"


def file_format(path: Path, declared: str = "auto") -> FileFormat:
    """The declared format, or the one the path shows: a folder is Arrow (save_to_disk), else the
    suffix. A .json file may hold JSON Lines (what `Dataset.to_json` writes): _json_rows looks."""
    if declared != "auto":
        return declared  # type: ignore[return-value]
    if path.is_dir():
        return "arrow"
    if path.suffix.lower() not in _SUFFIXES:
        raise DataError(f"{path}: cannot tell the format from the name; set data.file_format to one of "
                        f"parquet, json, jsonl, arrow")
    return _SUFFIXES[path.suffix.lower()]


def _pyarrow():
    try:
        import pyarrow
        import pyarrow.ipc
        import pyarrow.parquet
    except ImportError:
        raise DataError(f"reading parquet or Arrow data needs pyarrow: {INSTALL_DATA}") from None
    return pyarrow


def _parquet_rows(path: Path) -> list[dict[str, Any]]:
    pa = _pyarrow()
    try:
        return pa.parquet.read_table(path).to_pylist()
    except (OSError, pa.ArrowException) as e:
        raise DataError(f"{path}: cannot read as parquet: {e}") from None


def _arrow_rows(path: Path) -> list[dict[str, Any]]:
    """The rows of a `Dataset.save_to_disk` folder (its Arrow stream files, in state.json's order),
    or of one Arrow stream file."""
    pa = _pyarrow()
    if (path / "dataset_dict.json").exists():
        splits = sorted(p.name for p in path.iterdir() if (p / "state.json").exists())
        raise DataError(f"{path}: a DatasetDict folder; point data.path at one split: "
                        f"{', '.join(str(path / s) for s in splits)}")
    if path.is_dir():
        try:
            state = json.loads((path / "state.json").read_text())
            files = [path / f["filename"] for f in state["_data_files"]]
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise DataError(f"{path}: not a folder written by Dataset.save_to_disk (state.json: {e})") from None
    else:
        files = [path]
    rows: list[dict[str, Any]] = []
    for f in files:
        try:
            with pa.memory_map(str(f)) as source:
                rows += pa.ipc.open_stream(source).read_all().to_pylist()
        except (OSError, pa.ArrowException) as e:
            raise DataError(f"{f}: cannot read as an Arrow stream: {e}") from None
    return rows


def _json_rows(path: Path) -> list[Any] | None:
    """A JSON array's items; None when the file holds JSON Lines (read line by line instead)."""
    try:
        data = path.read_bytes()
    except OSError as e:
        raise DataError(f"{path}: cannot read: {e}") from None
    if not data.lstrip(b"\xef\xbb\xbf \t\r\n").startswith(b"["):
        return None
    try:
        rows = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise DataError(f"{path}: invalid JSON: {e}") from None
    return rows


def problems_from_rows(rows: Iterable[Any], name: str, cfg: DataConfig,
                       where: Callable[[int], str] | None = None) -> tuple[list[Problem], LoadReport]:
    """Problems from rows (dicts); a bad row is a DataError naming `where(i)` (default "<name>, row i"),
    or with cfg.on_bad_row=skip a count in the LoadReport."""
    where = where or (lambda i: f"{name}: row {i}")
    stem = Path(name).stem if name.endswith(tuple(_SUFFIXES)) else Path(name).name

    def convert(row: Any, i: int) -> Problem:
        if not isinstance(row, dict):
            raise BadRow("not_an_object", f"row is a {type(row).__name__}, not a mapping of columns")
        return problem_from_row(row, f"{stem}-{i}", where(i), cfg.format, cfg.question_key, cfg.answer_key)

    return collect_rows(name, ((where(i), convert, row, i) for i, row in enumerate(rows)), cfg.on_bad_row)


def load_table(path: str | Path, cfg: DataConfig) -> tuple[list[Problem], LoadReport]:
    """Problems from the file or folder at `path`, in cfg.file_format (auto: from the path)."""
    path = Path(path)
    if not path.exists():
        raise DataError(f"{path}: file not found")
    fmt = file_format(path, cfg.file_format)
    if fmt in ("json", "jsonl"):
        rows = _json_rows(path)
        if rows is None:  # JSON Lines: errors name the line
            return load_jsonl(path, cfg.format, cfg.question_key, cfg.answer_key, cfg.on_bad_row)
        if fmt == "jsonl":
            raise DataError(f"{path}: holds a JSON array, not JSON Lines; set data.file_format=json")
        if not isinstance(rows, list):
            raise DataError(f"{path}: the top level must be a list of rows, got {type(rows).__name__}")
    else:
        rows = _parquet_rows(path) if fmt == "parquet" else _arrow_rows(path)
    return problems_from_rows(rows, str(path), cfg, lambda i: f"{path}:row {i}")


def dataset_rows(dataset: Any) -> list[Any]:
    """The rows of a `datasets.Dataset` (its selection, in order), an `IterableDataset` (read to
    its end once: it must be finite) or a list of dicts."""
    if isinstance(dataset, (list, tuple)):
        return list(dataset)
    if hasattr(dataset, "to_list"):  # datasets.Dataset
        return dataset.to_list()
    if hasattr(dataset, "__iter__") and not isinstance(dataset, (str, bytes, dict)):
        return list(dataset)
    raise DataError(f"train_dataset: a datasets.Dataset, a list of dicts or a path, got {type(dataset).__name__}")


class TableSource:
    """A table as a problem source: data.path (source=file), or rows handed over in Python
    (source=dataset); drawn by a `Sampler` as a JSONL file's rows are."""

    def __init__(self, cfg: DataConfig, seed: int, rows: list[Any] | None = None):
        self.problems, self.report = load_table_source(cfg, rows)  # the Problems hold what a step needs
        self.sampler = Sampler(self.problems, seed, cfg.eval_size)

    def batch(self, step: int, size: int, round: int = 0) -> list[Problem]:
        return self.sampler.batch(step, size, round)

    def eval_problems(self, n: int | None = None) -> list[Problem]:
        return self.sampler.eval_problems(n)


def load_table_source(cfg: DataConfig, rows: list[Any] | None) -> tuple[list[Problem], LoadReport]:
    """source=dataset: the rows handed over; source=file: the table at data.path."""
    if cfg.source == "dataset":
        if rows is None:
            raise DataError("data.source=dataset takes its rows from mentor_fast.GRPOTrainer(train_dataset=...); "
                            "from the CLI use data.source=file with data.path")
        return problems_from_rows(rows, "train_dataset", cfg)
    if not cfg.path:
        raise DataError("data.path is required for data.source=file")
    return load_table(cfg.path, cfg)
