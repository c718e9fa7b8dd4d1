"""The base model's greedy held-out score under different instructions, by question kind (issue 21).

    python benchmarks/instruction_probe.py --data runs/ablation/data/chain_sum_3x2_drawn/test.parquet \\
        --instruction " Reply with only the final answer." \\
        --instruction " Add the numbers one at a time, then give the final answer." --max_new_tokens 64

``--data`` is a held-out file a ``recipe_ablation.py`` sweep (or the preprocess script) wrote.
Before an RL run on a task the model fails, ask whether the prompt lets it succeed: the instruction decides
whether a small model answers at once or writes intermediate steps. Each row's instruction (the text the
preprocess script appended, ``--old``) is replaced by each ``--instruction`` in turn; the model answers the
held-out questions greedily (the native rollout engine, fp32, prompts tokenised as in training) and reasoning-gym's scorer (``hybridflow.rewards``) grades
them. Prints the score overall and by question kind (``recipe_ablation.scores_by_kind``) and three answers.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from recipe_ablation import INSTRUCTION, scores_by_kind  # noqa: E402


def load_questions(path: str, old: str) -> list[dict]:
    """Held-out rows as question (instruction removed), ground truth, data source and extra info."""
    import pandas as pd

    rows = []
    for _, row in pd.read_parquet(path).iterrows():
        content = row["prompt"][-1]["content"]
        rows.append(dict(question=content.removesuffix(old), ground_truth=row["reward_model"]["ground_truth"],
                         data_source=row["data_source"], extra_info=dict(row["extra_info"])))
    return rows


def answer_all(engine, tokenizer, prompts: list[str], *, max_new_tokens: int, stop_token_ids: list[int]) -> list[str]:
    """Greedy answers from the rollout engine, tokenised as the trainer tokenises prompts (``data.chat``)."""
    from hybridflow.rollout import SamplingParams

    ids = [tokenizer(prompt, add_special_tokens=False)["input_ids"] for prompt in prompts]
    params = SamplingParams(temperature=0.0, max_tokens=max_new_tokens, stop_token_ids=stop_token_ids)
    answers = [""] * len(prompts)
    for completion in engine.generate(ids, params):
        answers[completion.prompt_index] = tokenizer.decode(completion.token_ids, skip_special_tokens=True)
    return answers


def probe(engine, tokenizer, rows: list[dict], instruction: str, *, max_new_tokens: int,
          stop_token_ids: list[int]) -> str:
    from hybridflow.data.chat import render
    from hybridflow.rewards.reasoning_gym import compute_score

    prompts = [render(tokenizer, [{"role": "user", "content": r["question"] + instruction}], add_generation_prompt=True)
               for r in rows]
    start = time.monotonic()
    answers = answer_all(engine, tokenizer, prompts, max_new_tokens=max_new_tokens, stop_token_ids=stop_token_ids)
    by_kind = scores_by_kind((row["question"], compute_score(row["data_source"], answer, row["ground_truth"],
                                                            row["extra_info"])) for row, answer in zip(rows, answers))
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

    from hybridflow.cpu import describe_cpu
    from hybridflow.models import fetch_default_model, load_causal_lm, load_tokenizer
    from hybridflow.rollout import build_engine
    from hybridflow.trainer.roles.reward import stop_token_ids

    path = args.model or fetch_default_model()
    tokenizer = load_tokenizer(path)
    engine = build_engine("native", load_causal_lm(path).eval(), tokenizer)
    stops = stop_token_ids(path, tokenizer)
    rows = load_questions(args.data, args.old)
    print(f"{path}, greedy, <= {args.max_new_tokens} new tokens; {describe_cpu()}, {torch.get_num_threads()} threads")
    for instruction in args.instruction:
        print(probe(engine, tokenizer, rows, instruction, max_new_tokens=args.max_new_tokens, stop_token_ids=stops),
              flush=True)


if __name__ == "__main__":
    main()
