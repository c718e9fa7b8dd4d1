"""Shared pieces of the preprocess scripts: verl's output flags, writing the splits, the entry wrapper."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

from hybridflow.data.files import write_parquet
from hybridflow.errors import HybridflowError


def script_prog(module_file: str) -> str:
    """The usage line's name of a script: ``hybridflow preprocess NAME`` (the same script as ``python -m``)."""
    return f"hybridflow preprocess {os.path.splitext(os.path.basename(module_file))[0]}"


def add_output_args(parser: argparse.ArgumentParser) -> None:
    """``--local_save_dir`` (verl's flag) with ``--local_dir`` as an alias."""
    parser.add_argument(
        "--local_save_dir",
        "--local_dir",
        dest="local_save_dir",
        required=True,
        help="directory that receives train.parquet and test.parquet",
    )


def write_splits(splits: dict[str, list[dict[str, Any]]], local_save_dir: str) -> dict[str, str]:
    """Write ``{split}.parquet`` for each split; returns split -> path."""
    paths = {}
    for split, rows in splits.items():
        paths[split] = os.path.join(local_save_dir, f"{split}.parquet")
        write_parquet(rows, paths[split])
        print(f"wrote {len(rows)} rows to {paths[split]}")
    return paths


def run_main(main: Callable[[Sequence[str] | None], Any]) -> None:
    """Call ``main``; a user error prints one line and exits 2 (``HYBRIDFLOW_DEBUG=1`` keeps the traceback)."""
    try:
        main(None)
    except HybridflowError as error:
        if os.environ.get("HYBRIDFLOW_DEBUG") == "1":
            raise
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
