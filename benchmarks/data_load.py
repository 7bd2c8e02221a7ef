"""How long a large parquet dataset takes to be ready to train: the rows read, checked and turned
into problems, and the first batch drawn (the target: 100k rows in under 10 s on 2 cores).

    python benchmarks/data_load.py --rows 100000 --layout verl --out benchmarks/results/data_load.json

The file is written first (not timed) in verl's layout (chat-message prompts, reward_model.ground_truth,
data_source, extra_info) or TRL's (a string prompt and a GSM8K-style `answer` with a worked solution).
The timed part runs in a fresh process, so it includes importing pyarrow. It also times a second
batch far into the run, which indexes the problems in memory and never touches the file.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import tempfile
from pathlib import Path


def write_parquet(path: Path, rows: int, layout: str) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    def row(i: int) -> dict:
        a, b = i % 97 + 3, i % 89 + 5
        question = f"Sam has {a} apples and buys {b} more. How many apples does Sam have now? (item {i})"
        if layout == "verl":
            return {"data_source": "openai/gsm8k",
                    "prompt": [{"role": "system", "content": "Think step by step."},
                               {"role": "user", "content": question}],
                    "ability": "math", "reward_model": {"style": "rule", "ground_truth": str(a + b)},
                    "extra_info": {"split": "train", "index": i}}
        return {"prompt": question, "answer": f"Sam has {a} + {b} = <<{a}+{b}={a + b}>>{a + b} apples.\n#### {a + b}",
                "difficulty": i % 5}

    pq.write_table(pa.Table.from_pylist([row(i) for i in range(rows)]), path)


TIMED = """
import sys, time
t0 = time.perf_counter()
from mentor_fast.config import DataConfig
from mentor_fast.data import build_source
t_import = time.perf_counter()
source = build_source(DataConfig(source="file", path=sys.argv[1]), seed=0)
first = source.batch(0, 64)
t_ready = time.perf_counter()
later = source.batch(10_000, 64)
t_later = time.perf_counter()
print(t_import - t0, t_ready - t_import, t_later - t_ready, len(source.problems))
"""


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=100_000)
    p.add_argument("--layout", choices=["verl", "trl"], default="verl")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", default="")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"{args.layout}_{args.rows}.parquet"
        write_parquet(path, args.rows, args.layout)
        size_mb = path.stat().st_size / 1e6
        runs = []
        for _ in range(args.repeats):
            out = subprocess.run([sys.executable, "-c", TIMED, str(path)], check=True, capture_output=True,
                                 text=True).stdout.split()
            imports, ready, later, n = float(out[0]), float(out[1]), float(out[2]), int(out[3])
            runs.append({"import_s": imports, "ready_s": ready, "later_batch_s": later, "problems": n})
    best = min(runs, key=lambda r: r["import_s"] + r["ready_s"])
    result = {"rows": args.rows, "layout": args.layout, "file_mb": round(size_mb, 1),
              "ready_s_best": round(best["import_s"] + best["ready_s"], 3),
              "ready_s_all": [round(r["import_s"] + r["ready_s"], 3) for r in runs],
              "later_batch_ms": round(best["later_batch_s"] * 1e3, 3), "problems": best["problems"],
              "cpus": platform.processor() or platform.machine(), "python": platform.python_version()}
    print(json.dumps(result))
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
