"""Preprocess scripts: public datasets and generated tasks -> verl-schema parquet.

Each is a module with ``main(argv)`` and a ``python -m`` entry point, and writes
``train.parquet`` and ``test.parquet`` into ``--local_save_dir`` (alias ``--local_dir``):

* ``python -m hybridflow.data.preprocess.gsm8k [--local_dataset_path PATH] --local_save_dir DIR``
  — GSM8K from a local jsonl/parquet copy or the hub.
* ``python -m hybridflow.data.preprocess.reasoning_gym --task NAME --size N [--test_size M]
  [--seed S] [--config key=value ...] [--instruction TEXT] --local_save_dir DIR``
  — a reasoning-gym task generated offline.
* ``python -m hybridflow.data.preprocess.tool_use [--tool NAME] [--interaction NAME] --local_save_dir DIR
  -- gsm8k|reasoning_gym SOURCE_ARGS...`` — either of the above as tool-agent rows (multi-turn).
* ``python -m hybridflow.data.preprocess.worked_sums --rows RL_ROWS [--count N] --local_save_dir DIR``
  — SFT rows (``messages``) that answer reasoning-gym sums one term at a time (writes ``train.parquet``).
* ``python -m hybridflow.data.preprocess.geo3k [--local_dataset_path DIR] --local_save_dir DIR``
  — Geometry3K with its images (verl's geo3k columns), from a local copy or the hub.
* ``python -m hybridflow.data.preprocess.shape_count [--size N] [--test_size M] --local_save_dir DIR``
  — a synthetic visual task generated offline: count the shapes PIL drew (RL rows plus SFT ``messages``).
"""

import argparse
import importlib
import sys

SCRIPTS = {
    "geo3k": "hybridflow.data.preprocess.geo3k",
    "gsm8k": "hybridflow.data.preprocess.gsm8k",
    "reasoning_gym": "hybridflow.data.preprocess.reasoning_gym",
    "shape_count": "hybridflow.data.preprocess.shape_count",
    "tool_use": "hybridflow.data.preprocess.tool_use",
    "worked_sums": "hybridflow.data.preprocess.worked_sums",
}


def main(argv: list[str] | None = None) -> int:
    """``python -m hybridflow.data.preprocess SCRIPT [script args ...]`` (also: ``hybridflow preprocess``). A
    script's own main returns the written paths (for callers in Python); this returns the exit status."""
    parser = argparse.ArgumentParser(prog="hybridflow preprocess",
                                     description="write a dataset in verl's parquet schema")
    parser.add_argument("script", choices=sorted(SCRIPTS))
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in SCRIPTS:  # the script's own --help is the one a user wants after its name
        parser.parse_args(argv[:1])
    importlib.import_module(SCRIPTS[argv[0]]).main(argv[1:])
    return 0
