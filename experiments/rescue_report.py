#!/usr/bin/env python
"""Did the hinted skill reach the bare prompt? Per block of steps, from a MENTOR arm's intervention log.

    .venv/bin/python experiments/rescue_report.py runs/collapseL7/seed0/mentor/mentor.jsonl [--block 8]

For each block: groups triggered and rescued, the share of re-rolls that were right (the policy
under the hint), and the share of the failed *unhinted* attempts shown to the mentor that already
contain the computation the hint pointed at ("2 * 8" when the hint's plan starts "1) compute
2 * 8"). If the hinted skill transfers, that share rises before the unhinted answers come right.

With --policy CHECKPOINT it also scores the first rescued re-rolls under that policy, with and
without their hint, and prints what the bare-prompt loss modes would weigh their tokens by:
`transfer` min(p_q / p_hint, 1), `shaping` gamma p_q / (p_q + gamma)^2 (gamma 0.1), against 1 for
an on-policy token. The token the hint made likely is the one with the smallest p_q.
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


def token_weights(policy: str, rows: list[dict], limit: int, gamma: float = 0.1) -> list[dict]:
    """Per rescued re-roll (the first `limit`): its least likely token under q, that token's
    p_q and p_hint, and the transfer and shaping weights of that token and on average."""
    import torch

    from mentor_fast.data import PromptBuilder
    from mentor_fast.models import load_policy, load_tokenizer, resolve_model_path
    from mentor_fast.tasks.math import SYSTEM_PROMPT as MATH_SYSTEM_PROMPT
    from mentor_fast.types import Problem

    path = resolve_model_path(policy)
    tok, model = load_tokenizer(path), load_policy(path, "float32").eval()
    builder = PromptBuilder(tok, MATH_SYSTEM_PROMPT, 10**6)
    out = []
    for r in rows:
        for x in (x for x in r["rerolls"] if x["correct"]):
            if len(out) == limit:
                return out
            problem = Problem(r["problem_id"], r["question"], r["gold"])
            ids = tok(x["text"], add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
            lp = {}
            for ctx, prompt in (("q", builder.encode(problem)), ("hint", builder.encode(problem, r["hint"]))):
                with torch.no_grad():
                    logits = model(input_ids=torch.tensor([prompt + ids])).logits[0, len(prompt) - 1 : -1]
                lp[ctx] = torch.log_softmax(logits.float(), -1).gather(-1, torch.tensor(ids)[:, None]).squeeze(-1)
            p_q, p_h = lp["q"].exp(), lp["hint"].exp()
            transfer = torch.minimum(p_q / p_h, torch.ones_like(p_q))
            shaping = gamma * p_q / (p_q + gamma) ** 2
            k = int(lp["q"].argmin())
            out.append({"question": r["question"], "token": tok.decode(ids[k]), "p_q": float(p_q[k]),
                        "p_hint": float(p_h[k]), "transfer_w": float(transfer[k]), "shaping_w": float(shaping[k]),
                        "transfer_mean": float(transfer.mean()), "shaping_mean": float(shaping.mean())})
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("log", type=Path, help="an arm's mentor.jsonl")
    p.add_argument("--block", type=int, default=8, help="steps per row")
    p.add_argument("--policy", help="checkpoint to score the rescued re-rolls with (e.g. the arms' start)")
    p.add_argument("--limit", type=int, default=12, help="rescued re-rolls to score with --policy")
    args = p.parse_args()
    rows = [json.loads(line) for line in args.log.read_text().splitlines() if line.strip()]
    print("| steps | rescued / triggered | re-rolls right | unhinted failed attempts with the pointed step |")
    print("|---|---|---|---|")
    for b in report(rows, args.block):
        print(f"| {b['steps']} | {b['rescued']} / {b['triggered']} | {_share(b['rerolls_right'], b['rerolls'])} "
              f"| {_share(b['attempts_with_step'], b['attempts'])} |")
    if args.policy:
        print("\n| question | least likely token under q | p_q | p_hint | transfer w | shaping w "
              "| transfer w, mean | shaping w, mean |")
        print("|---|---|---|---|---|---|---|---|")
        for w in token_weights(args.policy, rows, args.limit):
            print(f"| {w['question']} | {w['token']!r} | {w['p_q']:.1e} | {w['p_hint']:.2f} | {w['transfer_w']:.1e} "
                  f"| {w['shaping_w']:.1e} | {w['transfer_mean']:.2f} | {w['shaping_mean']:.2f} |")


if __name__ == "__main__":
    main()
