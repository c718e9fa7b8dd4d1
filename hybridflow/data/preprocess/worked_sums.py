"""Worked-solution SFT rows for reasoning-gym sums: the RL rows' own prompts, answered one term at a time.

    python -m hybridflow.data.preprocess.reasoning_gym --task chain_sum --local_save_dir ~/data/chain_sum ...
    python -m hybridflow.data.preprocess.worked_sums --rows ~/data/chain_sum/train.parquet \
        --local_save_dir ~/data/chain_sum_sft --count 256

A small model asked for "12 + 30 - 5" answers in one token and is mostly wrong; RL rewards only the final
answer, so it has nothing to reinforce a written-out sum with if the model never writes one. These rows show
the running sum, one operation a line, then the answer in the sentence the scorer reads last::

    12 + 30 = 42
    42 - 5 = 37
    The final answer is 37.

Each row is ``{"messages": [*the row's prompt messages, {"role": "assistant", "content": trace}]}`` for the
SFT trainer's ``data.multiturn`` path, so the warmed-up model sees the prompt text the rollout shows it. The
trace is checked against the row's ground truth: a row whose expression does not add up to it is an error,
not a silent bad target. Input rows come from ``hybridflow.data.preprocess.reasoning_gym`` (chain_sum, or
basic_arithmetic with only ``+``/``-``): the expression is ``extra_info.metadata.expression``.
"""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Sequence
from typing import Any

from hybridflow.data.files import read_rows
from hybridflow.data.preprocess.common import add_output_args, run_main, script_prog, write_splits
from hybridflow.errors import DataError

# The instruction these traces answer: appended to a reasoning-gym prompt (the preprocess script's
# --instruction), it asks for the running sum that a trace writes out
STEPS_INSTRUCTION = " Add the numbers one at a time, then give the final answer."

_TERM = re.compile(r"\s*([+-])\s*(\d+)")
_FIRST = re.compile(r"\s*(-?\d+)")


def parse_sum(expression: str) -> list[tuple[str, int]]:
    """``"12 + 30 - 5"`` -> ``[("+", 12), ("+", 30), ("-", 5)]``; DataError when it is not a plain sum."""
    first = _FIRST.match(expression)
    if first is None:
        raise DataError(f"expression {expression!r} does not start with a number")
    terms, position = [("+", int(first.group(1)))], first.end()
    for match in _TERM.finditer(expression, position):
        if match.start() != position:
            break
        terms.append((match.group(1), int(match.group(2))))
        position = match.end()
    if expression[position:].strip():
        raise DataError(f"expression {expression!r} is not a chain of + and - between whole numbers "
                        f"(stopped at {expression[position:].strip()!r})")
    return terms


def running_sums(terms: list[tuple[str, int]]) -> list[int]:
    """The sum after each term, left to right: ``parse_sum("12 + 30 - 5")`` -> ``[12, 42, 37]``."""
    totals = [terms[0][1]]
    for sign, value in terms[1:]:
        totals.append(totals[-1] + value if sign == "+" else totals[-1] - value)
    return totals


def worked_trace(expression: str) -> tuple[str, int]:
    """The running-sum trace of ``expression`` and its value (one line per operation, then the answer)."""
    terms = parse_sum(expression)
    totals = running_sums(terms)
    lines = [f"{before} {sign} {value} = {after}"
             for (sign, value), before, after in zip(terms[1:], totals, totals[1:])]
    return "\n".join([*lines, f"The final answer is {totals[-1]}."]), totals[-1]


def worked_row(row: dict[str, Any], *, index: int) -> dict[str, Any]:
    """One SFT row: the RL row's prompt messages and its worked trace as the assistant turn."""
    metadata = (row.get("extra_info") or {}).get("metadata") or "{}"
    expression = (json.loads(metadata) if isinstance(metadata, str) else metadata).get("expression")
    if not expression:
        raise DataError(f"row {index} has no extra_info.metadata.expression; write the rows with "
                        "hybridflow.data.preprocess.reasoning_gym from an arithmetic task (chain_sum)")
    trace, value = worked_trace(str(expression))
    truth = str((row.get("reward_model") or {}).get("ground_truth", "")).strip()
    if truth != str(value):
        raise DataError(f"row {index}: {expression} works out to {value} but its ground truth is {truth!r}; "
                        "the rows' expressions and answers disagree (regenerate them)")
    prompt = row["prompt"]
    messages = list(prompt.tolist() if hasattr(prompt, "tolist") else prompt)
    return {"messages": [*messages, {"role": "assistant", "content": trace}]}


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog=script_prog(__file__), description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", required=True, help="RL rows (parquet/jsonl) from the reasoning_gym script")
    parser.add_argument("--count", type=int, default=-1, help="traces of the first COUNT rows (-1 = all)")
    parser.add_argument("--split", default="train", help="name of the written file (SPLIT.parquet)")
    add_output_args(parser)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> dict[str, str]:
    args = parse_args(argv)
    rows = read_rows(args.rows)
    rows = rows if args.count < 0 else rows[: args.count]
    if not rows:
        raise DataError(f"{args.rows} has no rows to write traces from (--count {args.count})")
    return write_splits({args.split: [worked_row(row, index=i) for i, row in enumerate(rows)]}, args.local_save_dir)


if __name__ == "__main__":
    run_main(main)
