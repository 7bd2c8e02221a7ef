#!/usr/bin/env python
"""Did the hinted skill reach the bare prompt? Per block of steps, from a MENTOR arm's intervention log.

    .venv/bin/python benchmarks/rescue_report.py runs/collapseL7/seed0/mentor/mentor.jsonl [--block 8]

For each block: groups triggered and rescued, the share of re-rolls that were right (the policy
under the hint), and the share of the failed *unhinted* attempts shown to the mentor that already
contain the computation the hint pointed at ("2 * 8" when the hint's plan starts "1) compute
2 * 8"). If the hinted skill transfers, that share rises before the unhinted answers come right.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

_POINTED = re.compile(r"(?:compute|this step:|work out) ([\d\s+\-*/()]+?)(?: =|;|\.| \(|$)")


def pointed_computation(hint: str) -> str | None:
    """The first computation a reference-mentor hint names, spaces removed ("2*8"), or None."""
    m = _POINTED.search(hint or "")
    return re.sub(r"\s", "", m.group(1)) if m else None


def _share(n: int, d: int) -> str:
    return f"{n} / {d} ({n / d:.2f})" if d else "-"


def report(rows: list[dict], block: int) -> list[dict]:
    out: dict[int, dict] = {}
    for r in rows:
        b = out.setdefault((r["step"] - 1) // block, dict.fromkeys(
            ["triggered", "rescued", "rerolls", "rerolls_right", "attempts", "attempts_with_step"], 0))
        b["triggered"] += 1
        b["rescued"] += bool(r["rescued"])
        b["rerolls"] += len(r["rerolls"])
        b["rerolls_right"] += sum(bool(x["correct"]) for x in r["rerolls"])
        step = pointed_computation(r.get("hint") or "")
        if step:
            for a in r["attempts"]:
                b["attempts"] += 1
                b["attempts_with_step"] += step in re.sub(r"\s", "", a["text"])
    return [{"steps": f"{k * block + 1}-{(k + 1) * block}", **v} for k, v in sorted(out.items())]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("log", type=Path, help="an arm's mentor.jsonl")
    p.add_argument("--block", type=int, default=8, help="steps per row")
    args = p.parse_args()
    rows = [json.loads(line) for line in args.log.read_text().splitlines() if line.strip()]
    print("| steps | rescued / triggered | re-rolls right | unhinted failed attempts with the pointed step |")
    print("|---|---|---|---|")
    for b in report(rows, args.block):
        print(f"| {b['steps']} | {b['rescued']} / {b['triggered']} | {_share(b['rerolls_right'], b['rerolls'])} "
              f"| {_share(b['attempts_with_step'], b['attempts'])} |")


if __name__ == "__main__":
    main()
