"""Small checks every section's own checks are made of: one line per problem, naming the key and the fix."""

from __future__ import annotations

import os
from typing import Any


def check_choice(problems: list[str], key: str, value: Any, choices: tuple) -> None:
    if value not in choices:
        problems.append(f"{key}={value!r} is not one of {', '.join(choices)}")


def check_positive(problems: list[str], key: str, value: Any) -> None:
    if value is not None and value <= 0:
        problems.append(f"{key}={value} must be a positive integer")


def check_output_folder(problems: list[str], key: str, path: str) -> None:
    """A folder the run writes into (checkpoints, logs) cannot be, or lie under, a regular file: said before any
    model loads, not as a NotADirectoryError when the first log or checkpoint is written."""
    full = os.path.abspath(os.path.expanduser(str(path)))
    existing = full
    while not os.path.exists(existing) and os.path.dirname(existing) != existing:
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        where = "is a file" if existing == full else f"lies under the file '{existing}'"
        problems.append(f"{key}='{path}' {where}, not a folder: point it at a folder (the run writes its "
                        "global_step_N checkpoints and logs there)")
