"""GSM8K -> verl-schema parquet (``train.parquet``, ``test.parquet``), as verl's gsm8k.py.

    python -m hybridflow.data.preprocess.gsm8k --local_dataset_path DIR_OR_FILE --local_save_dir DIR

Reads a local copy (jsonl/parquet with ``question`` and ``answer`` columns: a directory
holding ``train*`` and ``test*`` files, e.g. the hub's ``main/train-00000-of-00001.parquet``,
or one file, split into train/test by ``--test_fraction``), or the hub
(``openai/gsm8k``, ``main``) through ``datasets`` when no local path is given. The
ground truth is the number after ``####`` with thousands separators removed.
"""

from __future__ import annotations

import argparse
import math
import os
import re
from collections.abc import Sequence
from typing import Any

from hybridflow.data.files import SUPPORTED_SUFFIXES, read_rows, require_columns
from hybridflow.data.preprocess.common import add_output_args, run_main, script_prog, write_splits
from hybridflow.errors import DataError

DATA_SOURCE = "openai/gsm8k"
INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'
SPLITS = ("train", "test")
_FINAL_ANSWER = re.compile(r"#### (\-?[0-9\.\,]+)")


def extract_solution(answer: str) -> str | None:
    """``'... #### 1,234'`` -> ``'1234'``; None when there is no ``#### N``."""
    match = _FINAL_ANSWER.search(answer)
    return match.group(1).replace(",", "") if match else None


def make_row(example: dict[str, Any], *, split: str, index: int) -> dict[str, Any]:
    """One GSM8K example as a verl row."""
    ground_truth = extract_solution(example["answer"])
    if ground_truth is None:
        raise DataError(
            f"{split} row {index}: answer has no '#### N' final answer ({example['answer'][-60:]!r}); fix or "
            "remove the row"
        )
    return {
        "data_source": DATA_SOURCE,
        "prompt": [{"role": "user", "content": example["question"] + " " + INSTRUCTION}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": ground_truth},
        "extra_info": {"split": split, "index": index, "answer": example["answer"], "question": example["question"]},
    }


def load_local(path: str, *, test_fraction: float) -> dict[str, list[dict[str, Any]]]:
    """Split name -> raw examples from a local file or directory."""
    if os.path.isdir(path):
        return {split: read_rows(_split_files(path, split)) for split in SPLITS}
    rows = read_rows(path)
    num_test = min(len(rows) - 1, max(1, math.ceil(len(rows) * test_fraction)))
    if num_test < 1:
        raise DataError(
            f"{path!r} has {len(rows)} rows, too few to split into train and test; give a directory with "
            "train/test files"
        )
    return {"train": rows[: len(rows) - num_test], "test": rows[len(rows) - num_test :]}


def _split_files(directory: str, split: str) -> list[str]:
    found = sorted(
        os.path.join(root, name)
        for root, _, names in os.walk(directory)
        for name in names
        if name.startswith(split) and name.endswith(SUPPORTED_SUFFIXES)
    )
    if not found:
        raise DataError(
            f"no {split}* .parquet/.jsonl file under {directory!r}; put GSM8K's {split} split there or pass one file"
        )
    return found


def load_hub() -> dict[str, list[dict[str, Any]]]:
    """GSM8K from the hub, when ``datasets`` is installed and the hub is reachable."""
    try:
        import datasets
    except ImportError:
        raise DataError(
            "the 'datasets' package is not installed, so GSM8K cannot come from the hub; "
            "pass --local_dataset_path PATH (a GSM8K jsonl/parquet file or directory)"
        ) from None
    try:
        loaded = datasets.load_dataset("openai/gsm8k", "main")
    except Exception as error:  # offline, hub error, auth: all mean "use a local copy"
        raise DataError(
            f"cannot load openai/gsm8k from the hub ({type(error).__name__}); pass --local_dataset_path PATH"
        ) from None
    return {split: list(loaded[split]) for split in SPLITS}


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog=script_prog(__file__), description=__doc__.splitlines()[0])
    parser.add_argument("--local_dataset_path", default=None, help="local GSM8K file or directory (default: the hub)")
    parser.add_argument(
        "--test_fraction", type=float, default=0.1, help="share of a single input file that becomes test"
    )
    add_output_args(parser)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> dict[str, str]:
    """Write ``train.parquet`` and ``test.parquet``; returns split -> path."""
    args = parse_args(argv)
    raw = (
        load_local(args.local_dataset_path, test_fraction=args.test_fraction) if args.local_dataset_path else load_hub()
    )
    splits = {}
    for split, examples in raw.items():
        require_columns(
            examples,
            {"question": "", "answer": ""},
            source=f"GSM8K {split} split",
            fix="GSM8K rows need 'question' and 'answer'; point --local_dataset_path at a GSM8K copy",
        )
        splits[split] = [make_row(example, split=split, index=i) for i, example in enumerate(examples)]
    return write_splits(splits, args.local_save_dir)


if __name__ == "__main__":
    run_main(main)
