"""The base model's greedy held-out score under different instructions, by question kind (issue 21).

    python benchmarks/instruction_probe.py --data runs/ablation/data/chain_sum_3x2_drawn/test.parquet \\
        --instruction " Reply with only the final answer." \\
        --instruction " Add the numbers one at a time, then give the final answer." --max_new_tokens 64

``--data`` is a held-out file a ``recipe_ablation.py`` sweep (or the preprocess script) wrote.
Before an RL run on a task the model fails, ask whether the prompt lets it succeed: the instruction decides
whether a small model answers at once or writes intermediate steps. Each row's instruction (the text the
preprocess script appended, ``--old``) is replaced by each ``--instruction`` in turn; the model answers the
held-out questions greedily (HF ``generate``, fp32) and reasoning-gym's scorer (``hybridflow.rewards``) grades
them. Prints the score overall and by question kind (``recipe_ablation.question_kind``) and three answers.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from recipe_ablation import INSTRUCTION, question_kind  # noqa: E402


def load_questions(path: str, old: str) -> list[dict]:
    """Held-out rows as question (instruction removed), ground truth, data source and extra info."""
    import pandas as pd

    rows = []
    for _, row in pd.read_parquet(path).iterrows():
        content = row["prompt"][-1]["content"]
        rows.append(dict(question=content.removesuffix(old), ground_truth=row["reward_model"]["ground_truth"],
                         data_source=row["data_source"], extra_info=dict(row["extra_info"])))
    return rows


def answer_all(model, tokenizer, prompts: list[str], *, max_new_tokens: int, batch: int = 44) -> list[str]:
    import torch

    answers = []
    for start in range(0, len(prompts), batch):
        encoded = tokenizer(prompts[start:start + batch], return_tensors="pt", padding=True)
        with torch.no_grad():
            out = model.generate(**encoded, max_new_tokens=max_new_tokens, do_sample=False)
        answers += tokenizer.batch_decode(out[:, encoded["input_ids"].shape[1]:], skip_special_tokens=True)
    return answers


def probe(model, tokenizer, rows: list[dict], instruction: str, *, max_new_tokens: int) -> str:
    from hybridflow.rewards.reasoning_gym import compute_score

    prompts = [tokenizer.apply_chat_template([{"role": "user", "content": r["question"] + instruction}],
                                             tokenize=False, add_generation_prompt=True) for r in rows]
    start = time.monotonic()
    answers = answer_all(model, tokenizer, prompts, max_new_tokens=max_new_tokens)
    by_kind: dict[str, list[float]] = {}
    for row, answer in zip(rows, answers):
        score = compute_score(row["data_source"], answer, row["ground_truth"], row["extra_info"])
        by_kind.setdefault(question_kind(row["question"]), []).append(score)
    scores = [s for kind in by_kind.values() for s in kind]
    kinds = "; ".join(f"{kind} {sum(v) / len(v):.2f} ({len(v)})" for kind, v in sorted(by_kind.items()))
    examples = "\n".join(f"    {a[:120]!r}" for a in answers[:3])
    return (f"{instruction!r}: {sum(scores) / len(scores):.3f} over {len(scores)} questions "
            f"({time.monotonic() - start:.0f} s)\n    {kinds}\n{examples}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", required=True, help="a held-out parquet file written by the preprocess script")
    parser.add_argument("--old", default=INSTRUCTION, help="the instruction the rows end with, removed first")
    parser.add_argument("--instruction", action="append", required=True, help="repeatable; ' ' for none")
    parser.add_argument("--max_new_tokens", type=int, default=64)
    parser.add_argument("--model", default="", help="model folder (default: the packaged SmolLM2-135M-Instruct)")
    args = parser.parse_args()

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from hybridflow.cpu import describe_cpu
    from hybridflow.models.default_model import fetch_default_model

    path = args.model or fetch_default_model()
    tokenizer = AutoTokenizer.from_pretrained(path, padding_side="left")
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    rows = load_questions(args.data, args.old)
    print(f"{path}, greedy, <= {args.max_new_tokens} new tokens; {describe_cpu()}, {torch.get_num_threads()} threads")
    for instruction in args.instruction:
        print(probe(model, tokenizer, rows, instruction, max_new_tokens=args.max_new_tokens), flush=True)


if __name__ == "__main__":
    main()
