"""A reasoning-gym task -> verl-schema parquet (``train.parquet``, ``test.parquet``), offline.

    python -m hybridflow.data.preprocess.reasoning_gym --task chain_sum --size 1000 \\
        --test_size 100 --config min_terms=2 --config max_terms=2 \\
        --instruction ' Reply with only the final answer.' --local_save_dir DIR

Entries come from ``reasoning_gym.create_dataset(task, size, seed, **config)``, whose
entry ``i`` is drawn from ``Random(seed + i)``; so train uses ``--seed`` and test
``--seed + --size`` (a test seed of ``seed + 1`` would replay train entries 1..n), and
any test question that still appears in train is dropped (small task spaces repeat). On a
small task space that leaves a test set harder than the task: training draws most of the
easy questions, so the unseen ones are mostly the hard ones. ``--test_as_drawn`` keeps the test set
as the task draws it (the same mix of easy and hard questions as training) and drops from
train every question the test set holds instead. The
entry's ``metadata`` is stored as a JSON string in ``extra_info.metadata`` (parquet
cannot hold arbitrary nested dicts reliably) so a scorer can rebuild the entry for
reasoning-gym's ``score_answer``.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from typing import Any

from hybridflow.data.preprocess.common import add_output_args, run_main, script_prog, write_splits
from hybridflow.errors import DataError

CHECKED_TASKS = ("basic_arithmetic", "chain_sum", "gsm_symbolic", "countdown")


def parse_config(pairs: Sequence[str]) -> dict[str, Any]:
    """``['min_terms=2', 'name=x']`` -> ``{'min_terms': 2, 'name': 'x'}`` (values parsed as JSON when they are)."""
    config = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise DataError(f"--config {pair!r} is not key=value; write e.g. --config min_terms=2")
        try:
            config[key] = json.loads(value)
        except json.JSONDecodeError:
            config[key] = value
    return config


def generate(task: str, *, size: int, seed: int, config: dict[str, Any]) -> list[dict[str, Any]]:
    """``size`` entries (question, answer, metadata) of ``task``."""
    import reasoning_gym

    try:
        return list(reasoning_gym.create_dataset(task, size=size, seed=seed, **config))
    except ValueError as error:
        if "not registered" in str(error):
            raise DataError(
                f"unknown reasoning-gym task {task!r}; pick a name from reasoning_gym.factory.DATASETS, e.g. "
                f"{list(CHECKED_TASKS)}"
            ) from None
        raise DataError(
            f"reasoning-gym rejected --config {config} for {task!r}: {error}; fix the --config values"
        ) from None
    except (TypeError, AssertionError) as error:
        raise DataError(
            f"reasoning-gym rejected --config {config} for {task!r}: {error}; fix the --config values"
        ) from None


def make_row(entry: dict[str, Any], *, task: str, split: str, index: int, instruction: str) -> dict[str, Any]:
    """One reasoning-gym entry as a verl row."""
    return {
        "data_source": task,
        "prompt": [{"role": "user", "content": entry["question"] + instruction}],
        "ability": "reasoning",
        "reward_model": {"style": "rule", "ground_truth": str(entry["answer"])},
        "extra_info": {"split": split, "index": index, "metadata": json.dumps(entry["metadata"], default=str)},
    }


def drop_seen_questions(entries: list[dict[str, Any]], seen: set[str]) -> list[dict[str, Any]]:
    """Entries whose question is not in ``seen`` (nor repeated earlier in ``entries``)."""
    kept = []
    for entry in entries:
        if entry["question"] not in seen:
            seen.add(entry["question"])
            kept.append(entry)
    return kept


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog=script_prog(__file__), description=__doc__.splitlines()[0])
    parser.add_argument("--task", required=True, help=f"reasoning-gym dataset name, e.g. {', '.join(CHECKED_TASKS)}")
    parser.add_argument("--size", type=int, required=True, help="train entries to generate")
    parser.add_argument(
        "--test_size", type=int, default=None, help="test entries to generate (default: size // 10, at least 1)"
    )
    parser.add_argument("--seed", type=int, default=42, help="train seed; test uses seed + size")
    parser.add_argument(
        "--test_seed", type=int, default=None,
        help="test seed (default: seed + size). A fixed one keeps the same test questions when --size grows; the "
        "train entries that then repeat a test question are dropped from whichever split --test_as_drawn says",
    )
    parser.add_argument(
        "--config", action="append", default=[], metavar="KEY=VALUE", help="task config field (repeatable)"
    )
    parser.add_argument(
        "--instruction", default="", help="text appended to every question, e.g. ' Reply with only the final answer.'"
    )
    parser.add_argument(
        "--test_as_drawn",
        action="store_true",
        help="keep every test question (repeats within test dropped) and drop from train the questions in test, "
        "so the held-out set has the task's own mix of easy and hard questions (default: drop from test the "
        "questions seen in train, which on a small task space leaves the hard ones)",
    )
    add_output_args(parser)
    return parser.parse_args(argv)


def split_unseen(
    train: list[dict[str, Any]], test: list[dict[str, Any]], *, test_as_drawn: bool
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(train, test) with no question in both: drop the overlap from test, or from train if ``test_as_drawn``."""
    if test_as_drawn:
        test = drop_seen_questions(test, set())
        test_questions = {entry["question"] for entry in test}
        return [entry for entry in train if entry["question"] not in test_questions], test
    return train, drop_seen_questions(test, {entry["question"] for entry in train})


def main(argv: Sequence[str] | None = None) -> dict[str, str]:
    """Write ``train.parquet`` and ``test.parquet``; returns split -> path."""
    args = parse_args(argv)
    if args.size < 1:
        raise DataError(f"--size must be at least 1, got {args.size}")
    test_size = args.test_size if args.test_size is not None else max(1, args.size // 10)
    config = parse_config(args.config)
    generated_train = generate(args.task, size=args.size, seed=args.seed, config=config)
    # Entry i uses Random(seed + i): starting test at seed + size keeps the two seed ranges disjoint.
    test_seed = args.seed + args.size if args.test_seed is None else args.test_seed
    generated_test = generate(args.task, size=test_size, seed=test_seed, config=config)
    train, test = split_unseen(generated_train, generated_test, test_as_drawn=args.test_as_drawn)
    print(
        f"{args.task}: dropped {len(generated_test) - len(test)} of {len(generated_test)} test entries and "
        f"{len(generated_train) - len(train)} of {len(generated_train)} train entries that repeat a question"
    )
    if not test or not train:
        raise DataError(
            f"every {'train' if test else 'test'} question of {args.task!r} also appears in "
            f"{'test' if test else 'train'} (the task space is too small); lower --size or --test_size, or widen "
            "the task with --config"
        )
    splits = {
        split: [
            make_row(e, task=args.task, split=split, index=i, instruction=args.instruction)
            for i, e in enumerate(entries)
        ]
        for split, entries in (("train", train), ("test", test))
    }
    return write_splits(splits, args.local_save_dir)


if __name__ == "__main__":
    run_main(main)
