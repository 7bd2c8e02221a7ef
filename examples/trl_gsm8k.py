"""A TRL GRPO script on a local GSM8K file, ported to mentor_fast by changing its imports (and
turning MENTOR on). The diff against the TRL original is in examples/README.md.

    python examples/trl_gsm8k.py --data data/gsm8k/train.jsonl --model smollm2-135m-instruct --max-steps 2

Conversational prompts with a system message, TRL's own accuracy_reward, and a custom reward that
reads an extra column of the dataset (`steps`, the worked solution's length).
"""

from __future__ import annotations

import argparse

from datasets import load_dataset
from trl.rewards import accuracy_reward

from mentor_fast import GRPOConfig, GRPOTrainer

SYSTEM = "Solve the problem step by step, then give the final answer in \\boxed{}."


def to_chat(row: dict) -> dict:
    worked, final = row["answer"].rsplit("####", 1)
    return {"prompt": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": row["question"]}],
            "solution": final.strip().replace(",", ""), "steps": len(worked.strip().splitlines())}


def within_budget(completions: list, steps: list[int], **columns) -> list[float]:
    """0.1 for an answer no longer than ~60 words per step of the worked solution."""
    return [0.1 if len(c[0]["content"].split()) <= 60 * s else 0.0 for c, s in zip(completions, steps)]


def main(argv: list[str] | None = None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", required=True, help="GSM8K's train.jsonl ({question, answer})")
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--output-dir", default="runs/trl_gsm8k")
    p.add_argument("--max-steps", type=int, default=100)
    p.add_argument("--max-completion-length", type=int, default=256)
    args = p.parse_args(argv)

    dataset = load_dataset("json", data_files=args.data, split="train").map(to_chat)
    config = GRPOConfig(
        output_dir=args.output_dir,
        learning_rate=1e-6,
        num_generations=4,
        per_device_train_batch_size=8,
        max_completion_length=args.max_completion_length,
        max_steps=args.max_steps,
        reward_weights=[1.0, 1.0],
        report_to="none",
        mentor=True,                      # MENTOR: hints for the groups whose rollouts all fail
        data={"answer_key": "answer"},    # the mentor reads GSM8K's worked solution
    )
    trainer = GRPOTrainer(model=args.model, reward_funcs=[accuracy_reward, within_budget], args=config,
                          train_dataset=dataset)
    return trainer.train()


if __name__ == "__main__":
    print(main())
