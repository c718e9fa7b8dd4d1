"""Geometry3K -> verl-schema parquet with images (``train.parquet``, ``test.parquet``), as verl's geo3k.py.

    python -m hybridflow.data.preprocess.geo3k --local_dataset_path DIR --local_save_dir DIR

Reads a local copy (a directory holding ``train*`` and ``test*`` parquet/jsonl files with ``problem``,
``answer`` and ``images`` columns, e.g. the hub's ``data/train-00000-of-00001.parquet``), or the hub
(``hiyouga/geometry3k``) through ``datasets`` when no local path is given. Each row keeps its
``images`` (a list of ``{"bytes": ...}``) and its problem text, which carries the ``<image>``
placeholder; the instruction asks for ``<think>...</think>`` reasoning and a ``\\boxed{}`` answer, as
the geo3k scorer (``hybridflow.rewards.geo3k``) grades it.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from hybridflow.data.files import require_columns
from hybridflow.data.preprocess.common import add_output_args, run_main, script_prog, write_splits
from hybridflow.data.preprocess.gsm8k import load_local
from hybridflow.errors import DataError

DATA_SOURCE = "hiyouga/geometry3k"
INSTRUCTION = (
    r"You FIRST think about the reasoning process as an internal monologue and then provide the final answer. "
    r"The reasoning process MUST BE enclosed within <think> </think> tags. "
    r"The final answer MUST BE put in \boxed{}."
)
SPLITS = ("train", "test")


def make_row(example: dict[str, Any], *, split: str, index: int) -> dict[str, Any]:
    """One Geometry3K example as a verl row (verl's columns: data_source, prompt, images, ability,
    reward_model, extra_info)."""
    problem, answer = example["problem"], example["answer"]
    return {
        "data_source": DATA_SOURCE,
        "prompt": [{"role": "user", "content": problem + " " + INSTRUCTION}],
        "images": list(example["images"]),
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": answer},
        "extra_info": {"split": split, "index": index, "answer": answer, "question": problem},
    }


def load_hub() -> dict[str, list[dict[str, Any]]]:
    try:
        import datasets

        loaded = datasets.load_dataset(DATA_SOURCE)
    except Exception as error:  # offline, hub error, no datasets package: all mean "use a local copy"
        raise DataError(f"cannot load {DATA_SOURCE} from the hub ({type(error).__name__}); pass "
                        "--local_dataset_path DIR (a copy holding train* and test* parquet files)") from None
    return {split: list(loaded[split]) for split in SPLITS}


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog=script_prog(__file__), description=__doc__.splitlines()[0])
    parser.add_argument("--local_dataset_path", default=None,
                        help="local Geometry3K directory with train*/test* files (default: the hub)")
    add_output_args(parser)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> dict[str, str]:
    """Write ``train.parquet`` and ``test.parquet``; returns split -> path."""
    args = parse_args(argv)
    raw = load_local(args.local_dataset_path, test_fraction=0.1) if args.local_dataset_path else load_hub()
    splits = {}
    for split, examples in raw.items():
        require_columns(examples, {"problem": "", "answer": "", "images": ""}, source=f"Geometry3K {split} split",
                        fix="Geometry3K rows need 'problem', 'answer' and 'images'; point --local_dataset_path at "
                            "a copy of hiyouga/geometry3k")
        splits[split] = [make_row(example, split=split, index=i) for i, example in enumerate(examples)]
    return write_splits(splits, args.local_save_dir)


if __name__ == "__main__":
    run_main(main)
